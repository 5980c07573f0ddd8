package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// w3c is the W3C Trace Context propagator: traceparent and tracestate, in
// NATS headers and OpenClaw request frames alike.
var w3c propagation.TraceContext

// ContextWithTraceparent returns ctx with the remote span context of a W3C
// traceparent (an OpenClaw v4 frame's field) as the parent of the next
// span, and whether it was valid. An empty or invalid traceparent leaves
// ctx as it is.
func ContextWithTraceparent(ctx context.Context, traceparent string) (context.Context, bool) {
	if traceparent == "" {
		return ctx, false
	}
	// Extracted on its own: an invalid value must not leave ctx's span
	// looking like the parent it found.
	sc := trace.SpanContextFromContext(w3c.Extract(context.Background(), traceparentCarrier(traceparent)))
	if !sc.IsValid() {
		return ctx, false
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc), true
}

// traceparentCarrier is a carrier holding one traceparent and nothing else.
type traceparentCarrier string

func (c traceparentCarrier) Get(key string) string {
	if key == HeaderTraceparent {
		return string(c)
	}
	return ""
}

func (traceparentCarrier) Set(string, string) {}

func (traceparentCarrier) Keys() []string { return []string{HeaderTraceparent} }
