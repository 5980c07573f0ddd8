//go:build unix

package telemetry_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
)

// BenchmarkBatchProcessor: the CPU a sampled span costs the whole process
// with the SDK's batch span processor and with telemetry.BatchProcessor, at
// a moderate rate (a span after every 20 µs of other work, as a service
// between invokes), where the SDK's processor wakes its goroutine for nearly
// every span. Metric: cpu-ns/span, the 20 µs of work included.
func BenchmarkBatchProcessor(b *testing.B) {
	for _, name := range []string{"sdk", "xiaoclaw"} {
		b.Run(name, func(b *testing.B) {
			var sp sdktrace.SpanProcessor = telemetry.NewBatchProcessor(tracetest.NewNoopExporter(), telemetry.BatchOptions{})
			if name == "sdk" {
				sp = sdktrace.NewBatchSpanProcessor(tracetest.NewNoopExporter())
			}
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sp))
			b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			tr := tp.Tracer(telemetry.ScopeName)
			cpu0 := processCPU(b)
			for b.Loop() {
				_, span := tr.Start(context.Background(), "node.invoke")
				span.End()
				for t := time.Now(); time.Since(t) < 20*time.Microsecond; {
				}
			}
			b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/span")
		})
	}
}

// processCPU is the user and system CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
