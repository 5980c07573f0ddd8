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
// OpenTelemetry propagator (InjectHeader and ExtractHeader cover W3C trace
// context without one). NATS header names are case-sensitive; Get falls back
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
	if !compiledIn {
		return
	}
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		injectSpanContext(h, sc)
	}
}

// InjectMsg is InjectHeader for a message, creating its header when needed.
func InjectMsg(ctx context.Context, msg *nats.Msg) {
	if !compiledIn {
		return
	}
	sc := trace.SpanContextFromContext(ctx) // walks ctx's chain: once per message
	if !sc.IsValid() {
		return
	}
	if msg.Header == nil {
		msg.Header = nats.Header{}
	}
	injectSpanContext(msg.Header, sc)
}

func injectSpanContext(h nats.Header, sc trace.SpanContext) {
	h[HeaderTraceparent] = []string{FormatTraceparent(sc)}
	if ts := sc.TraceState(); ts.Len() > 0 {
		h[HeaderTracestate] = []string{ts.String()}
	} else {
		delete(h, HeaderTracestate)
	}
}

// ExtractHeader returns ctx with the remote span context carried in h as the
// parent of the next span. A missing or invalid traceparent leaves ctx as it
// is (a bad tracestate is dropped, the traceparent still counts).
func ExtractHeader(ctx context.Context, h nats.Header) context.Context {
	if !compiledIn || len(h) == 0 {
		return ctx
	}
	c := HeaderCarrier(h)
	var tp, tsv string
	if v := h[HeaderTraceparent]; len(v) > 0 {
		// Written by InjectHeader (or a client that spells it the same):
		// tracestate, when there is one, is spelled alike too.
		tp = v[0]
		if v := h[HeaderTracestate]; len(v) > 0 {
			tsv = v[0]
		}
	} else if tp = c.Get(HeaderTraceparent); tp != "" {
		tsv = c.Get(HeaderTracestate)
	}
	if tp == "" {
		return ctx
	}
	sc, err := ParseTraceparent(tp)
	if err != nil {
		return ctx
	}
	if tsv != "" {
		if ts, err := trace.ParseTraceState(tsv); err == nil {
			sc = sc.WithTraceState(ts)
		}
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc)
}
