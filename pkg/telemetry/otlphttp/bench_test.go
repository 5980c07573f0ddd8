package otlphttp

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// benchSpans records n spans shaped like xiaoclaw's invoke spans: server
// kind, a remote parent, eight string attributes; the first has an event.
func benchSpans(tb testing.TB, n int) []sdktrace.ReadOnlySpan {
	tb.Helper()
	rec := tracetest.NewSpanRecorder()
	res := resource.NewSchemaless(
		attribute.String("service.name", "gateway"),
		attribute.String("service.version", "0.9.0"),
		attribute.String("service.instance.id", "gw-7f9c"),
	)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.AlwaysSample()))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	tr := tp.Tracer("github.com/xiaoclaw/xiaoclaw/services/gateway")
	remote := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: remoteTraceID, SpanID: remoteSpanID, TraceFlags: trace.FlagsSampled, Remote: true,
	})
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), remote)
	for i := range n {
		_, s := tr.Start(ctx, "node.invoke", trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(
			attribute.String("rpc.system", "openclaw"),
			attribute.String("rpc.method", "node.invoke"),
			attribute.String("xiaoclaw.tenant", fmt.Sprintf("tenant-%04d", i%50)),
			attribute.String("xiaoclaw.node", fmt.Sprintf("node-%06d", i)),
			attribute.String("xiaoclaw.command", "camera.snap"),
			attribute.String("messaging.system", "nats"),
			attribute.String("messaging.destination.name", fmt.Sprintf("xc.t.tenant-%04d.invoke", i%50)),
			attribute.String("net.peer.name", "10.0.3.17"),
		))
		if i == 0 {
			s.AddEvent("retry", trace.WithAttributes(attribute.String("reason", "node busy")))
		}
		s.End()
	}
	return rec.Ended()
}

// BenchmarkExport exports 512 spans per operation to a local server that
// discards the body, with the official exporter and with this one. The
// per-span figures include the HTTP round trip and the server's work.
func BenchmarkExport(b *testing.B) {
	spans := benchSpans(b, 512)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer srv.Close()
	ctx := context.Background()

	run := func(b *testing.B, exp sdktrace.SpanExporter) {
		defer func() { _ = exp.Shutdown(ctx) }()
		if err := exp.ExportSpans(ctx, spans); err != nil { // warm up pools and connections
			b.Fatal(err)
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if err := exp.ExportSpans(ctx, spans); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		runtime.ReadMemStats(&after)
		n := float64(b.N * len(spans))
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/span")
		b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/n, "B/span")
		b.ReportMetric(float64(after.Mallocs-before.Mallocs)/n, "allocs/span")
	}

	b.Run("official", func(b *testing.B) {
		exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(srv.URL+"/v1/traces"))
		if err != nil {
			b.Fatal(err)
		}
		run(b, exp)
	})
	b.Run("xiaoclaw", func(b *testing.B) {
		exp, err := New(Options{URL: srv.URL + "/v1/traces"})
		if err != nil {
			b.Fatal(err)
		}
		run(b, exp)
	})
}

// BenchmarkAppendExportRequest is the encoder alone.
func BenchmarkAppendExportRequest(b *testing.B) {
	spans := benchSpans(b, 512)
	buf := AppendExportRequest(nil, spans)
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		buf = AppendExportRequest(buf[:0], spans)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(spans)), "ns/span")
}
