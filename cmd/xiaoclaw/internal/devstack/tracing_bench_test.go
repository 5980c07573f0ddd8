//go:build unix

package devstack

import (
	"context"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry/telemetrytest"
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

// usage is what a run of invokes took: wall time and the CPU time of the
// whole process (every service, the simulated devices and the operators).
type usage struct{ wall, cpu time.Duration }

func (u *usage) add(o usage) { u.wall, u.cpu = u.wall+o.wall, u.cpu+o.cpu }

// report reports invokes/s and CPU µs per invoke under prefix.
func (u usage) report(b *testing.B, invokes int, prefix string) (rate, cpu float64) {
	rate = float64(invokes) / u.wall.Seconds()
	cpu = float64(u.cpu.Microseconds()) / float64(invokes)
	b.ReportMetric(rate, prefix+"invokes/s")
	b.ReportMetric(cpu, prefix+"cpu-µs/invoke")
	return rate, cpu
}

// run makes n calls and returns what they took.
func (d *invokeDriver) run(b *testing.B, n int) usage {
	var next atomic.Int64
	var wg sync.WaitGroup
	cpu0 := processCPU(b)
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
	return usage{wall: time.Since(start), cpu: processCPU(b) - cpu0}
}

// processCPU is the user and system CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// tracingConfig is a stack whose three services trace a share of the
// invokes (four spans each, through the SDK's batch processor into an
// exporter that drops them): every one at ratio 1, none with tracing off
// (ratio 0: the no-op providers a service gets without OTEL_* variables).
func tracingConfig(b *testing.B, ratio float64) Config {
	ctx := context.Background()
	provider := func(service string) *telemetry.TracerProvider {
		cfg := telemetry.Config{SharedProcess: true}
		if ratio > 0 {
			cfg.SpanProcessor = sdktrace.NewBatchSpanProcessor(tracetest.NewNoopExporter())
			cfg.Env = telemetrytest.MapEnv(map[string]string{
				"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": strconv.FormatFloat(ratio, 'f', -1, 64)})
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

// BenchmarkInvokeTracingCost measures full-path invokes in one run, so the
// ratios hold on a noisy machine, with tracing off, with a tenth of the
// invokes sampled and with every one. The modes take turns in rounds, in
// rotating order.
// Metrics: invokes/s and CPU µs per invoke of each mode, and their ratios
// to off (1 means free). The stacks share one heap; a collection before
// each turn keeps one mode's garbage out of the next one's figures.
// CPU per invoke is the steadier figure: the closed loop's throughput also
// moves with scheduling.
func BenchmarkInvokeTracingCost(b *testing.B) {
	modes := []struct {
		name   string
		driver *invokeDriver
		used   usage
	}{
		{name: "off", driver: newInvokeDriver(b, tracingConfig(b, 0), 31)},
		{name: "sampled10", driver: newInvokeDriver(b, tracingConfig(b, 0.1), 32)},
		{name: "sampled", driver: newInvokeDriver(b, tracingConfig(b, 1), 34)},
	}
	for i := range modes { // warm up
		modes[i].driver.run(b, 500)
	}
	const rounds = 6
	per := max(b.N/rounds, 64)
	b.ResetTimer()
	for r := range rounds {
		for k := range modes { // each mode goes first in turn
			i := (k + r) % len(modes)
			runtime.GC() // the garbage of the turn before is not this mode's to collect
			modes[i].used.add(modes[i].driver.run(b, per))
		}
	}
	b.StopTimer()
	offRate, offCPU := modes[0].used.report(b, per*rounds, "off-")
	for _, m := range modes[1:] {
		rate, cpu := m.used.report(b, per*rounds, m.name+"-")
		b.ReportMetric(rate/offRate, m.name+"/off-rate")
		b.ReportMetric(cpu/offCPU, m.name+"/off-cpu")
	}
}

// BenchmarkInvokeTracingMode measures one stack per process, for comparing
// builds: scripts/bench-tracing.sh runs "off", "sampled10" and "sampled" of
// the normal build and "off" of a build with -tags xc_omit_tracing (where
// the others record nothing), process after process. Metrics: invokes/s and CPU µs
// per invoke.
func BenchmarkInvokeTracingMode(b *testing.B) {
	for _, mode := range []struct {
		name  string
		ratio float64
	}{{"off", 0}, {"sampled10", 0.1}, {"sampled", 1}} {
		b.Run(mode.name, func(b *testing.B) {
			d := newInvokeDriver(b, tracingConfig(b, mode.ratio), 33)
			d.run(b, 500)
			b.ResetTimer()
			d.run(b, b.N).report(b, b.N, "")
		})
	}
}
