//go:build unix

package devstack

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"

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

// tracingMode is how a benchmark's services trace.
type tracingMode struct {
	name string
	// none: no tracer provider at all (the services' no-op default), the
	// baseline without tracing; otherwise telemetry.NewTracerProvider.
	none bool
	// ratio of invokes sampled (parentbased_traceidratio) into a batch span
	// processor with an exporter that drops them; 0 is tracing off (no
	// exporter: trace ids only).
	ratio float64
	// otlp: the sampled spans go over OTLP/HTTP to a receiver in this
	// process instead, as a deployed service's do.
	otlp bool
}

var (
	modeNone      = tracingMode{name: "none", none: true}
	modeOff       = tracingMode{name: "off"}
	modeSampled10 = tracingMode{name: "sampled10", ratio: 0.1}
	modeSampled   = tracingMode{name: "sampled", ratio: 1}
	modeExported  = tracingMode{name: "exported", ratio: 1, otlp: true}
	// exported10 is the Helm chart's default as deployed.
	modeExported10 = tracingMode{name: "exported10", ratio: 0.1, otlp: true}
)

// tracingProvider is one service's provider in mode m; otlpURL is the
// receiver of an otlp mode. The SDK reads OTEL_* from the process
// environment, so each provider sets all it depends on (b.Setenv).
func tracingProvider(b *testing.B, service string, m tracingMode, otlpURL string) trace.TracerProvider {
	if m.none {
		return noop.NewTracerProvider()
	}
	ctx := context.Background()
	cfg := telemetry.Config{SharedProcess: true}
	env := map[string]string{"OTEL_TRACES_SAMPLER": "", "OTEL_TRACES_SAMPLER_ARG": "", "OTEL_TRACES_EXPORTER": "",
		"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "", "OTEL_SDK_DISABLED": ""}
	if m.ratio > 0 {
		env["OTEL_TRACES_SAMPLER"] = "parentbased_traceidratio"
		env["OTEL_TRACES_SAMPLER_ARG"] = strconv.FormatFloat(m.ratio, 'f', -1, 64)
		if m.otlp {
			env["OTEL_EXPORTER_OTLP_ENDPOINT"] = otlpURL
		} else {
			cfg.SpanProcessor = sdktrace.NewBatchSpanProcessor(tracetest.NewNoopExporter())
		}
	}
	for k, v := range env {
		b.Setenv(k, v)
	}
	tp, err := telemetry.NewTracerProvider(ctx, service, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = tp.Shutdown(ctx) })
	return tp
}

// tracingConfig is a stack whose three services trace in mode m
// (exporting to otlpURL in an otlp mode).
func tracingConfig(b *testing.B, m tracingMode, otlpURL string) Config {
	return Config{
		GatewayTracerProvider: tracingProvider(b, telemetry.ServiceGateway, m, otlpURL),
		ShimTracerProvider:    tracingProvider(b, telemetry.ServiceShim, m, otlpURL),
		HubTracerProvider:     tracingProvider(b, telemetry.ServiceDevicehub, m, otlpURL),
		Registerer:            telemetry.NewRegistry(),
	}
}

// otlpSink is an OTLP/HTTP trace receiver that accepts every export and
// keeps nothing: the backend of the "exported" mode, so the benchmark pays
// for what a service pays (encoding, HTTP) and little for the backend.
func otlpSink(b *testing.B) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	b.Cleanup(srv.Close)
	return srv.URL
}

// switchProvider gives a service tracers that start their spans with one of
// several providers, the one at index *active, so one stack can take turns
// at every tracing mode. With the no-op provider active, the helpers of
// telemetry do not recognise the tracer as no-op and start a no-op span: a
// few tens of nanoseconds more than a service without a provider pays.
type switchProvider struct {
	embedded.TracerProvider
	providers []trace.TracerProvider
	active    *atomic.Int32
}

func (p switchProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	t := switchTracer{active: p.active}
	for _, tp := range p.providers {
		t.tracers = append(t.tracers, tp.Tracer(name, opts...))
	}
	return t
}

type switchTracer struct {
	embedded.Tracer
	tracers []trace.Tracer
	active  *atomic.Int32
}

func (t switchTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	return t.tracers[t.active.Load()].Start(ctx, name, opts...)
}

// BenchmarkInvokeTracingCost measures full-path invokes of one stack whose
// services switch between no tracer provider (none, the baseline), tracing
// off (trace ids only), a tenth of the invokes sampled and every one
// sampled, plus a second "none" (none2) that shows how far two identical
// modes drift apart in the same run: the modes take turns of 1,000
// invokes, in rotating order, for 30 rounds. No collection is forced: each
// mode pays for the garbage it makes, give or take the tail of one GC cycle
// a turn. On a shared 2-core VM one turn differs from the next by 10-20 %:
// read none2/none before trusting a small ratio; scripts/tracing-share.sh
// reads the cost from within each run's CPU profile instead.
// Metrics: invokes/s and CPU µs per invoke of each mode over all rounds;
// the median over the rounds of each mode's ratio to none in that round
// (rate: 1 means free, 0.95 means 5 % fewer invokes per second; cpu: 1.05
// means 5 % more CPU per invoke).
func BenchmarkInvokeTracingCost(b *testing.B) {
	type mode struct {
		tracingMode
		used []usage
	}
	none2 := modeNone
	none2.name = "none2"
	modes := []mode{{tracingMode: modeNone}, {tracingMode: none2}, {tracingMode: modeOff},
		{tracingMode: modeSampled10}, {tracingMode: modeSampled}}
	var active atomic.Int32
	switched := func(service string) trace.TracerProvider {
		p := switchProvider{active: &active}
		for _, m := range modes {
			p.providers = append(p.providers, tracingProvider(b, service, m.tracingMode, ""))
		}
		return p
	}
	d := newInvokeDriver(b, Config{
		GatewayTracerProvider: switched(telemetry.ServiceGateway),
		ShimTracerProvider:    switched(telemetry.ServiceShim),
		HubTracerProvider:     switched(telemetry.ServiceDevicehub),
		Registerer:            telemetry.NewRegistry(),
	}, 31)
	for i := range modes { // warm up
		active.Store(int32(i))
		d.run(b, 1000)
	}
	const rounds, turn = 30, 1000
	b.ResetTimer()
	for r := range rounds {
		for k := range modes { // each mode goes first in turn
			i := (k + r) % len(modes)
			active.Store(int32(i))
			modes[i].used = append(modes[i].used, d.run(b, turn))
		}
	}
	b.StopTimer()
	total := func(us []usage) (t usage) {
		for _, u := range us {
			t.add(u)
		}
		return t
	}
	total(modes[0].used).report(b, rounds*turn, "none-")
	for _, m := range modes[1:] {
		total(m.used).report(b, rounds*turn, m.name+"-")
		rates, cpus := make([]float64, rounds), make([]float64, rounds)
		for r, u := range m.used {
			base := modes[0].used[r]
			rates[r] = base.wall.Seconds() / u.wall.Seconds()
			cpus[r] = u.cpu.Seconds() / base.cpu.Seconds()
		}
		b.ReportMetric(median(rates), m.name+"/none-rate")
		b.ReportMetric(median(cpus), m.name+"/none-cpu")
	}
	b.ReportMetric(float64(rounds*turn*len(modes))/float64(b.N), "invokes/op")
}

func median(v []float64) float64 {
	slices.Sort(v)
	if n := len(v); n%2 == 0 {
		return (v[n/2-1] + v[n/2]) / 2
	}
	return v[len(v)/2]
}

// BenchmarkInvokeTracingMode measures one stack per process, one mode
// each: scripts/bench-tracing.sh runs none, off, sampled10 and sampled
// process after process, scripts/tracing-share.sh reads their CPU
// profiles. "none" is the services without a tracer provider, the baseline
// without tracing; "exported" is "sampled" with the spans sent over
// OTLP/HTTP to a receiver in the same process, "exported10" likewise for a
// tenth of the invokes (the Helm chart's default). Metrics: invokes/s and CPU
// µs per invoke.
func BenchmarkInvokeTracingMode(b *testing.B) {
	for _, mode := range []tracingMode{modeNone, modeOff, modeSampled10, modeSampled, modeExported10, modeExported} {
		b.Run(mode.name, func(b *testing.B) {
			var otlpURL string
			if mode.otlp {
				otlpURL = otlpSink(b)
			}
			d := newInvokeDriver(b, tracingConfig(b, mode, otlpURL), 33)
			d.run(b, 500)
			b.ResetTimer()
			d.run(b, b.N).report(b, b.N, "")
		})
	}
}
