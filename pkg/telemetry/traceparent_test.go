package telemetry_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
)

const validTP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestParseTraceparentAcceptsValidValues(t *testing.T) {
	sc, err := telemetry.ParseTraceparent(validTP)
	if err != nil {
		t.Fatal(err)
	}
	if sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || sc.SpanID().String() != "00f067aa0ba902b7" ||
		!sc.IsSampled() || !sc.IsRemote() {
		t.Fatalf("parsed %+v", sc)
	}
	if got := telemetry.FormatTraceparent(sc); got != validTP {
		t.Fatalf("format %q, want %q", got, validTP)
	}
	unsampled := strings.TrimSuffix(validTP, "01") + "00"
	if sc, err := telemetry.ParseTraceparent(unsampled); err != nil || sc.IsSampled() {
		t.Fatalf("unsampled: %v %v", sc, err)
	}
	// A future version may carry more fields after a dash; the known ones still count.
	future := "cc" + validTP[2:] + "-what-the-future-will-bring"
	if sc, err := telemetry.ParseTraceparent(future); err != nil || sc.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("future version: %v %v", sc, err)
	}
}

func TestParseTraceparentRejectsInvalidValues(t *testing.T) {
	for _, s := range []string{
		"",
		"00",
		validTP[:54],
		validTP + "-",            // version 00 has exactly four fields
		"ff" + validTP[2:],       // version ff is forbidden
		"0g" + validTP[2:],       // not hex
		strings.ToUpper(validTP), // uppercase hex
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01", // zero trace id
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // zero parent id
		"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7_01",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff", // unknown flags in version 00
		"01" + validTP[2:] + "x",                                  // extra data without a dash
		"01" + validTP[2:] + "-" + strings.Repeat("a", 128),       // over the frame limit
		" " + validTP[1:],
	} {
		if sc, err := telemetry.ParseTraceparent(s); err == nil || !errors.Is(err, telemetry.ErrInvalidTraceparent) || sc.IsValid() {
			t.Errorf("ParseTraceparent(%q) = %v, %v; want ErrInvalidTraceparent", s, sc, err)
		}
	}
	if telemetry.FormatTraceparent(trace.SpanContext{}) != "" {
		t.Error("an invalid span context formatted to a non-empty traceparent")
	}
}

func TestContextWithTraceparent(t *testing.T) {
	ctx, ok := telemetry.ContextWithTraceparent(context.Background(), validTP)
	if !ok || trace.SpanContextFromContext(ctx).TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatal("valid traceparent not put in the context")
	}
	base := context.Background()
	if got, ok := telemetry.ContextWithTraceparent(base, "garbage"); ok || got != base {
		t.Fatal("invalid traceparent changed the context")
	}
}

func TestParseTraceparentDoesNotAllocate(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { _, _ = telemetry.ParseTraceparent(validTP) }); n != 0 {
		t.Fatalf("%v allocations per parse", n)
	}
}

// FuzzParseTraceparent checks the strict parser against the OpenTelemetry
// propagator: whatever it accepts the propagator accepts with the same ids,
// a version 00 value formats back to itself, and nothing panics.
func FuzzParseTraceparent(f *testing.F) {
	for _, s := range []string{
		validTP,
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-02",
		"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01",
		"",
		"00-",
	} {
		f.Add(s)
	}
	prop := propagation.TraceContext{}
	f.Fuzz(func(t *testing.T, s string) {
		sc, err := telemetry.ParseTraceparent(s)
		if err != nil {
			if sc.IsValid() {
				t.Fatalf("error %v with a valid span context", err)
			}
			return
		}
		if !sc.IsValid() || !sc.IsRemote() {
			t.Fatalf("accepted %q as %v", s, sc)
		}
		if len(s) > telemetry.MaxTraceparentLen {
			t.Fatalf("accepted %d characters", len(s))
		}
		ref := trace.SpanContextFromContext(prop.Extract(context.Background(), propagation.MapCarrier{"traceparent": s}))
		if ref.TraceID() != sc.TraceID() || ref.SpanID() != sc.SpanID() || ref.TraceFlags() != sc.TraceFlags() {
			t.Fatalf("%q: parsed %v, the OpenTelemetry propagator %v", s, sc, ref)
		}
		if s[:2] == "00" && telemetry.FormatTraceparent(sc) != s {
			t.Fatalf("%q formats back to %q", s, telemetry.FormatTraceparent(sc))
		}
	})
}
