package telemetry_test

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/trace"

	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
)

const validTP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestContextWithTraceparent(t *testing.T) {
	for _, s := range []string{validTP, strings.TrimSuffix(validTP, "01") + "00", "cc" + validTP[2:] + "-future-fields"} {
		ctx, ok := telemetry.ContextWithTraceparent(context.Background(), s)
		sc := trace.SpanContextFromContext(ctx)
		if !ok || sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || sc.SpanID().String() != "00f067aa0ba902b7" || !sc.IsRemote() {
			t.Errorf("%q: not put in the context (%v, %v)", s, ok, sc)
		}
		if sc.IsSampled() != strings.HasPrefix(s[53:], "01") {
			t.Errorf("%q: sampled = %v", s, sc.IsSampled())
		}
	}
	base, _ := telemetry.ContextWithTraceparent(context.Background(), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	for _, s := range []string{
		"",
		"garbage",
		validTP[:54],
		"ff" + validTP[2:], // version ff is forbidden
		"0g" + validTP[2:], // not hex
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01", // zero trace id
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // zero parent id
		"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		" " + validTP[1:],
	} {
		// An invalid value leaves the context as it was, with its span.
		if got, ok := telemetry.ContextWithTraceparent(base, s); ok || got != base {
			t.Errorf("%q accepted", s)
		}
	}
}

// FuzzContextWithTraceparent feeds untrusted frame values through the W3C
// propagator: nothing panics, and an accepted value travels on in a NATS
// header with its trace id intact.
func FuzzContextWithTraceparent(f *testing.F) {
	for _, s := range []string{validTP, "cc" + validTP[2:] + "-x", strings.ToUpper(validTP), "00-" + strings.Repeat("0", 49), "ff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ctx, ok := telemetry.ContextWithTraceparent(context.Background(), s)
		sc := trace.SpanContextFromContext(ctx)
		if ok != sc.IsValid() {
			t.Fatalf("%q: ok=%v but span context valid=%v", s, ok, sc.IsValid())
		}
		if !ok {
			return
		}
		h := nats.Header{}
		telemetry.InjectHeader(ctx, h)
		got := trace.SpanContextFromContext(telemetry.ExtractHeader(context.Background(), h))
		if got.TraceID() != sc.TraceID() || got.SpanID() != sc.SpanID() || got.IsSampled() != sc.IsSampled() {
			t.Fatalf("%q: header carried %v, want %v", s, got, sc)
		}
	})
}
