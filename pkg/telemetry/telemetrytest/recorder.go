// Package telemetrytest helps tests assert on traces, logs and metrics: an
// in-memory span recorder shared by several per-service tracer providers, an
// in-process OTLP receiver (HTTP/protobuf and gRPC) that decodes what real
// exporters send, a log buffer safe for concurrent writers and a reader of
// metric values.
package telemetrytest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
)

// WaitTimeout bounds every wait of this package.
const WaitTimeout = 10 * time.Second

// Recorder keeps every span ended by the providers it made, in memory.
type Recorder struct {
	sr *tracetest.SpanRecorder
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder { return &Recorder{sr: tracetest.NewSpanRecorder()} }

// Provider builds a tracer provider for service through
// telemetry.NewTracerProvider (same resource and sampler code as
// production), recording into r. env sets OTEL_* variables of the process
// for the test (t.Setenv: the SDK reads the environment itself), nil for
// none. It is shut down when the test ends.
func (r *Recorder) Provider(t testing.TB, service string, env map[string]string) *telemetry.TracerProvider {
	t.Helper()
	SetEnv(t, env)
	tp, err := telemetry.NewTracerProvider(context.Background(), service, telemetry.Config{
		SharedProcess: true,
		SpanProcessor: r.sr,
	})
	if err != nil {
		t.Fatalf("telemetrytest: tracer provider for %s: %v", service, err)
	}
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp
}

// Spans returns the ended spans so far, in the order they ended.
func (r *Recorder) Spans() []sdktrace.ReadOnlySpan { return r.sr.Ended() }

// Reset forgets the spans recorded so far.
func (r *Recorder) Reset() { r.sr.Reset() }

// WaitFor polls until cond holds for the ended spans, failing the test after
// WaitTimeout with a dump of what was recorded.
func (r *Recorder) WaitFor(t testing.TB, what string, cond func([]sdktrace.ReadOnlySpan) bool) []sdktrace.ReadOnlySpan {
	t.Helper()
	deadline := time.Now().Add(WaitTimeout)
	for {
		spans := r.Spans()
		if cond(spans) {
			return spans
		}
		if time.Now().After(deadline) {
			t.Fatalf("telemetrytest: %s not recorded within %s; spans:\n%s", what, WaitTimeout, Dump(spans))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// WaitForTrace waits until the trace traceID has at least n ended spans and
// returns them.
func (r *Recorder) WaitForTrace(t testing.TB, traceID trace.TraceID, n int) []sdktrace.ReadOnlySpan {
	t.Helper()
	spans := r.WaitFor(t, fmt.Sprintf("%d spans of trace %s", n, traceID), func(s []sdktrace.ReadOnlySpan) bool {
		return len(InTrace(s, traceID)) >= n
	})
	return InTrace(spans, traceID)
}

// InTrace keeps the spans of one trace.
func InTrace(spans []sdktrace.ReadOnlySpan, traceID trace.TraceID) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.SpanContext().TraceID() == traceID {
			out = append(out, s)
		}
	}
	return out
}

// Service returns the service.name of a span's resource.
func Service(s sdktrace.ReadOnlySpan) string {
	if v, ok := s.Resource().Set().Value(semconv.ServiceNameKey); ok {
		return v.AsString()
	}
	return ""
}

// Attr returns a span attribute as a string ("" when absent).
func Attr(s sdktrace.ReadOnlySpan, key string) string {
	for _, a := range s.Attributes() {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}

// Find returns the first span named name, or nil.
func Find(spans []sdktrace.ReadOnlySpan, name string) sdktrace.ReadOnlySpan {
	for _, s := range spans {
		if s.Name() == name {
			return s
		}
	}
	return nil
}

// Chain returns the path from the root of leaf's trace down to leaf, walking
// parent span ids through spans. The result starts with a span whose parent
// is not among spans (the root, or the first span after a remote parent
// nobody recorded).
func Chain(spans []sdktrace.ReadOnlySpan, leaf sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
	byID := make(map[trace.SpanID]sdktrace.ReadOnlySpan, len(spans))
	for _, s := range spans {
		byID[s.SpanContext().SpanID()] = s
	}
	var path []sdktrace.ReadOnlySpan
	for s := leaf; s != nil && len(path) <= len(spans); {
		path = append(path, s)
		s = byID[s.Parent().SpanID()]
	}
	slices.Reverse(path)
	return path
}

// Dump renders spans one per line (service, kind, name, ids) for failure messages.
func Dump(spans []sdktrace.ReadOnlySpan) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "  %-20s %-8s %-40q trace=%s span=%s parent=%s\n", Service(s), s.SpanKind(), s.Name(),
			s.SpanContext().TraceID(), s.SpanContext().SpanID(), s.Parent().SpanID())
	}
	return b.String()
}

// SetEnv sets the variables of env for the rest of the test (t.Setenv:
// not in parallel tests).
func SetEnv(t testing.TB, env map[string]string) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
}
