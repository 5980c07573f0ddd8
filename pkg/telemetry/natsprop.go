package telemetry

import (
	"context"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// W3C Trace Context header names, as they travel in NATS headers.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// HeaderCarrier adapts nats.Header to propagation.TextMapCarrier, for any
// OpenTelemetry propagator (InjectHeader and ExtractHeader use W3C Trace
// Context). NATS header names are case-sensitive; Get falls back
// to a case-insensitive match.
type HeaderCarrier nats.Header

var _ propagation.TextMapCarrier = HeaderCarrier(nil)

// Get returns the first value of key.
func (c HeaderCarrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	for k, v := range c {
		if len(k) == len(key) && len(v) > 0 && strings.EqualFold(k, key) {
			return v[0]
		}
	}
	return ""
}

// Set replaces the values of key.
func (c HeaderCarrier) Set(key, value string) { c[key] = []string{value} }

// Keys lists the header names.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// InjectHeader writes the span context of ctx into h as traceparent (and
// tracestate when there is one). Without a valid span context it writes
// nothing. h must not be nil.
func InjectHeader(ctx context.Context, h nats.Header) {
	w3c.Inject(ctx, HeaderCarrier(h))
}

// InjectMsg is InjectHeader for a message, creating its header when needed.
func InjectMsg(ctx context.Context, msg *nats.Msg) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	if msg.Header == nil {
		msg.Header = nats.Header{}
	}
	w3c.Inject(ctx, HeaderCarrier(msg.Header))
}

// ExtractHeader returns ctx with the remote span context carried in h as the
// parent of the next span. A missing or invalid traceparent leaves ctx as it
// is (a bad tracestate is dropped, the traceparent still counts).
func ExtractHeader(ctx context.Context, h nats.Header) context.Context {
	if len(h) == 0 {
		return ctx
	}
	return w3c.Extract(ctx, HeaderCarrier(h))
}
