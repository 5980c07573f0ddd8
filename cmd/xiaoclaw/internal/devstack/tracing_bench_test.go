package devstack

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
)

// invokeDriver runs node.invoke calls with 64 in flight from 8 operator
// connections over 8 devices of one stack.
type invokeDriver struct {
	ops []*occlient.Client
	ids []string
}

func newInvokeDriver(b *testing.B, cfg Config, seed uint32) *invokeDriver {
	st := startStack(b, cfg)
	d := &invokeDriver{}
	for _, dev := range connectDevices(b, st, 0, 8, seed, nil) {
		d.ids = append(d.ids, nodeID(dev))
	}
	for range 8 {
		d.ops = append(d.ops, operator(b, st.GatewayURL(0)))
	}
	waitNodes(b, d.ops[0], true, d.ids...)
	return d
}

// run makes n calls and returns how long they took.
func (d *invokeDriver) run(b *testing.B, n int) time.Duration {
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for w := range 64 {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				_, err := d.ops[w%len(d.ops)].Invoke(context.Background(), occlient.InvokeParams{
					NodeID: d.ids[int(i)%len(d.ids)], Command: "mcp.tools.call", Params: statusCall})
				if err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

// tracingConfig is a stack whose three services trace with every invoke
// sampled (four spans through the SDK's batch processor into an exporter
// that drops them), or with tracing off (the no-op providers a service gets
// without OTEL_* variables).
func tracingConfig(b *testing.B, sampled bool) Config {
	ctx := context.Background()
	provider := func(service string) *telemetry.TracerProvider {
		cfg := telemetry.Config{SharedProcess: true}
		if sampled {
			cfg.SpanProcessor = sdktrace.NewBatchSpanProcessor(tracetest.NewNoopExporter())
		}
		tp, err := telemetry.NewTracerProvider(ctx, service, cfg)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = tp.Shutdown(ctx) })
		return tp
	}
	return Config{
		GatewayTracerProvider: provider(telemetry.ServiceGateway),
		ShimTracerProvider:    provider(telemetry.ServiceShim),
		HubTracerProvider:     provider(telemetry.ServiceDevicehub),
		Registerer:            telemetry.NewRegistry(),
	}
}

// BenchmarkInvokeTracingCost measures full-path invoke throughput in one
// run, so the ratios hold on a noisy machine, with tracing off and with
// every invoke sampled. The modes take turns in rounds. Metrics: invokes/s
// of each mode and sampled/off (the throughput ratio; 1 means free).
func BenchmarkInvokeTracingCost(b *testing.B) {
	modes := []struct {
		name    string
		driver  *invokeDriver
		elapsed time.Duration
	}{
		{name: "off", driver: newInvokeDriver(b, tracingConfig(b, false), 31)},
		{name: "sampled", driver: newInvokeDriver(b, tracingConfig(b, true), 32)},
	}
	for i := range modes { // warm up
		modes[i].driver.run(b, 500)
	}
	const rounds = 6
	per := max(b.N/rounds, 64)
	b.ResetTimer()
	for range rounds {
		for i := range modes {
			modes[i].elapsed += modes[i].driver.run(b, per)
		}
	}
	b.StopTimer()
	rate := func(d time.Duration) float64 { return float64(per*rounds) / d.Seconds() }
	for _, m := range modes {
		b.ReportMetric(rate(m.elapsed), m.name+"-invokes/s")
	}
	b.ReportMetric(rate(modes[1].elapsed)/rate(modes[0].elapsed), "sampled/off")
}

// BenchmarkInvokeTracingMode measures one stack per process, for comparing
// builds: scripts/bench-tracing.sh runs "off" and "sampled" of the normal
// build and "off" of a build with -tags xc_omit_tracing (where "sampled"
// records nothing), process after process. Metric: invokes/s.
func BenchmarkInvokeTracingMode(b *testing.B) {
	for _, sampled := range []bool{false, true} {
		name := "off"
		if sampled {
			name = "sampled"
		}
		b.Run(name, func(b *testing.B) {
			d := newInvokeDriver(b, tracingConfig(b, sampled), 33)
			d.run(b, 500)
			b.ResetTimer()
			elapsed := d.run(b, b.N)
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "invokes/s")
		})
	}
}
