package devstack

import (
	"context"
	"encoding/json"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

var statusCall = json.RawMessage(`{"name":"self.get_device_status","arguments":{}}`)

// BenchmarkInvokeLatency measures, in one run so the ratio holds on a noisy
// machine, sequential node.invoke latency through the whole path (operator
// WS → gateway → NATS → shim → NATS → devicehub → device WS and back) and
// the direct device round trip (the devicehub calling the device itself).
// Metrics: full-p50-µs, full-p99-µs, direct-p50-µs, direct-p99-µs,
// overhead-p50-µs and full/direct-p50 (the ratio).
func BenchmarkInvokeLatency(b *testing.B) {
	st := startStack(b, Config{})
	dev := connectDevices(b, st, 0, 1, 7, nil)[0]
	op := operator(b, st.GatewayURL(0))
	id := nodeID(dev)
	waitNodes(b, op, true, id)
	canon, _ := wire.CanonicalDevice(dev.MAC())
	ctx := context.Background()
	direct := func() error {
		_, err := st.Hubs[0].Call(ctx, DevTenant, canon, []byte(`{"jsonrpc":"2.0","method":"tools/call","params":`+string(statusCall)+`}`))
		return err
	}
	full := func() error {
		_, err := op.Invoke(ctx, occlient.InvokeParams{NodeID: id, Command: "mcp.tools.call", Params: statusCall})
		return err
	}
	for range 200 { // warm up both paths
		if err := direct(); err != nil {
			b.Fatal(err)
		}
		if err := full(); err != nil {
			b.Fatal(err)
		}
	}
	var dl, fl []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if err := direct(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := full(); err != nil {
			b.Fatal(err)
		}
		dl, fl = append(dl, t1.Sub(t0)), append(fl, time.Since(t1))
	}
	b.StopTimer()
	dp50, dp99 := percentiles(dl)
	fp50, fp99 := percentiles(fl)
	b.ReportMetric(us(fp50), "full-p50-µs")
	b.ReportMetric(us(fp99), "full-p99-µs")
	b.ReportMetric(us(dp50), "direct-p50-µs")
	b.ReportMetric(us(dp99), "direct-p99-µs")
	b.ReportMetric(us(fp50-dp50), "overhead-p50-µs")
	b.ReportMetric(float64(fp50)/float64(dp50), "full/direct-p50")
}

// BenchmarkInvokeThroughput drives node.invoke from 8 operator connections
// with 64 calls in flight over 8 devices and reports invokes/s and latency.
func BenchmarkInvokeThroughput(b *testing.B) {
	st := startStack(b, Config{})
	devs := connectDevices(b, st, 0, 8, 8, nil)
	var ops []*occlient.Client
	for range 8 {
		ops = append(ops, operator(b, st.GatewayURL(0)))
	}
	var ids []string
	for _, d := range devs {
		ids = append(ids, nodeID(d))
	}
	waitNodes(b, ops[0], true, ids...)
	var n atomic.Uint64
	lat := make(chan time.Duration, 1<<20)
	b.SetParallelism(8) // 8 × GOMAXPROCS goroutines in flight
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			t0 := time.Now()
			_, err := ops[i%uint64(len(ops))].Invoke(context.Background(), occlient.InvokeParams{
				NodeID: ids[i%uint64(len(ids))], Command: "mcp.tools.call", Params: statusCall})
			if err != nil {
				b.Error(err)
				return
			}
			select {
			case lat <- time.Since(t0):
			default:
			}
		}
	})
	el := time.Since(start)
	b.StopTimer()
	close(lat)
	var all []time.Duration
	for d := range lat {
		all = append(all, d)
	}
	p50, p99 := percentiles(all)
	b.ReportMetric(float64(b.N)/el.Seconds(), "invokes/s")
	b.ReportMetric(us(p50), "p50-µs")
	b.ReportMetric(us(p99), "p99-µs")
}

func percentiles(d []time.Duration) (p50, p99 time.Duration) {
	if len(d) == 0 {
		return 0, 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return at(0.50), at(0.99)
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
