package telemetry_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
)

// benchProviders are the ways a service runs: without a provider (noop),
// tracing off (the SDK sampling nothing, trace ids only), and the SDK with a
// batch processor (exporting nowhere) at 100% and 0% sampling.
func benchProviders(b *testing.B) map[string]trace.TracerProvider {
	b.Helper()
	mk := func(sampler string, processor bool) trace.TracerProvider {
		b.Setenv("OTEL_TRACES_SAMPLER", sampler)
		var cfg telemetry.Config
		if processor {
			cfg.SpanProcessor = sdktrace.NewBatchSpanProcessor(tracetest.NewNoopExporter())
		}
		tp, err := telemetry.NewTracerProvider(context.Background(), "bench", cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		return tp
	}
	return map[string]trace.TracerProvider{"noop": noop.NewTracerProvider(), "off": mk("", false),
		"sdk-sampled": mk("always_on", true), "sdk-unsampled": mk("always_off", true)}
}

var benchInfo = telemetry.CallInfo{Tenant: "acme", Principal: "ops", Node: "xz-a1b2c3d4e5f6", Command: "mcp.tools.call", Tool: "self.light.on"}

// BenchmarkSpan: one span with xiaoclaw's attributes, started and ended.
func BenchmarkSpan(b *testing.B) {
	for _, name := range []string{"noop", "off", "sdk-unsampled", "sdk-sampled"} {
		tr := benchProviders(b)[name].Tracer(telemetry.ScopeName)
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, span := telemetry.StartOperatorRequest(context.Background(), tr, "node.invoke", validTP, benchInfo)
				span.End("", nil)
			}
		})
	}
}

// BenchmarkInvokeSpans: the three spans of one node.invoke across the three
// services as docs/observability.md lays them out (operator request, shim
// handler, device call), with the header inject/extract
// between them and the facts each hop learns late, without the I/O.
func BenchmarkInvokeSpans(b *testing.B) {
	for _, name := range []string{"noop", "off", "sdk-unsampled", "sdk-sampled"} {
		tr := benchProviders(b)[name].Tracer(telemetry.ScopeName)
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ctx, op := telemetry.StartOperatorRequest(context.Background(), tr, "node.invoke", "",
					telemetry.CallInfo{Tenant: benchInfo.Tenant, Principal: benchInfo.Principal})
				op.AddInfo(telemetry.CallInfo{Node: benchInfo.Node, Command: benchInfo.Command, Tool: benchInfo.Tool})
				m1 := &nats.Msg{Subject: "xc.acme.node.invoke"}
				telemetry.InjectMsg(ctx, m1)
				sctx, h1 := telemetry.StartNATSHandler(context.Background(), tr, m1, telemetry.CallInfo{})
				h1.AddInfo(telemetry.CallInfo{Node: benchInfo.Node, Command: benchInfo.Command})
				m2 := &nats.Msg{Subject: "xc.acme.dev.a1b2c3d4e5f6.rpc"}
				telemetry.InjectMsg(sctx, m2)
				_, dev := telemetry.StartDeviceCall(telemetry.ExtractHeader(context.Background(), m2.Header), tr,
					"tools/call", "websocket", telemetry.CallInfo{Device: "a1b2c3d4e5f6", Tool: benchInfo.Tool})
				dev.SetRequestID(7)
				dev.End("", nil)
				h1.End("", nil)
				op.End("", nil)
			}
		})
	}
}

// BenchmarkNATSRoundTrip: a request/reply over a real (embedded) NATS
// server, bare versus with a sender span, header propagation and a handler
// span; the ratio is the tracing cost of one hop.
func BenchmarkNATSRoundTrip(b *testing.B) {
	_, connect := startNATS(b)
	server, client := connect("server"), connect("client")
	providers := benchProviders(b)
	for _, name := range []string{"bare", "noop", "off", "sdk-unsampled", "sdk-sampled"} {
		var tr trace.Tracer
		if name != "bare" {
			tr = providers[name].Tracer(telemetry.ScopeName)
		}
		subject := "xc.acme.dev.a1b2c3d4e5f6.rpc"
		sub, err := server.Subscribe(subject, func(msg *nats.Msg) {
			if tr == nil {
				_ = msg.Respond(msg.Data)
				return
			}
			_, span := telemetry.StartNATSHandler(context.Background(), tr, msg, telemetry.CallInfo{})
			_ = msg.Respond(msg.Data)
			span.End("", nil)
		})
		if err != nil {
			b.Fatal(err)
		}
		_ = server.Flush()
		payload := []byte(`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"self.light.on","arguments":{}}}`)
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				msg := &nats.Msg{Subject: subject, Data: payload}
				if tr == nil {
					if _, err := client.RequestMsgWithContext(ctx, msg); err != nil {
						b.Fatal(err)
					}
				} else {
					// The sender's side: a span whose context the request carries.
					rctx, span := telemetry.StartOperatorRequest(ctx, tr, "node.invoke", "", benchInfo)
					telemetry.InjectMsg(rctx, msg)
					_, err := client.RequestMsgWithContext(rctx, msg)
					span.End(telemetry.FaultCode(err), err)
					if err != nil {
						b.Fatal(err)
					}
				}
				cancel()
			}
		})
		_ = sub.Unsubscribe()
	}
}

func BenchmarkHeaderInjectExtract(b *testing.B) {
	ctx, _ := telemetry.ContextWithTraceparent(context.Background(), validTP)
	b.Run("inject", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			telemetry.InjectHeader(ctx, nats.Header{})
		}
	})
	h := nats.Header{}
	telemetry.InjectHeader(ctx, h)
	b.Run("extract", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_ = telemetry.ExtractHeader(context.Background(), h)
		}
	})
	b.Run("inject-without-span", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			telemetry.InjectHeader(context.Background(), h)
		}
	})
}

// BenchmarkLogLine: a JSON log line with five attributes through the
// xiaoclaw handler (trace ids, redaction) versus slog's JSON handler alone.
func BenchmarkLogLine(b *testing.B) {
	ctx, _ := telemetry.ContextWithTraceparent(context.Background(), validTP)
	plain := slog.New(slog.NewJSONHandler(io.Discard, nil))
	ours, _ := telemetry.NewLogger(io.Discard, "json", nil)
	for name, log := range map[string]*slog.Logger{"slog-json": plain, "telemetry": ours} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				log.InfoContext(ctx, "invoke done", "tenant", "acme", "node", "xz-a1b2c3d4e5f6",
					"command", "mcp.tools.call", "latency_ms", 12, "remote", "10.0.0.7:51234")
			}
		})
	}
}
