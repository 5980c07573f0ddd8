package devstack

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
)

// BenchmarkTenantFloodLatency measures, in one run, the p50 and p99 of a
// quiet tenant's sequential node.invoke calls alone and while another
// tenant floods silent devices from 11 operator connections with 200 calls
// each (2,200 calls against a share of 1,000). The flooding tenant has 40 silent devices, so its share (the
// default, 1,000 per replica) binds before the per-device share (32 each).
//
// burst: the 2,200 calls are sent once; 1,000 stay held, the rest are
// refused. retrying: every refused call is sent again after its
// retryAfterMs, a client that follows the hint (about 1,200 refusals/s).
//
// Metrics: alone-p50/p99-µs, flood-p50/p99-µs, flood/alone-p99 (the
// ratio), quiet-failed (the quiet tenant's failed calls), refusals/s and
// flood-held (calls the silent devices hold, counting the calls the hub
// gave up on after its 15 s call timeout, whose slots were freed). Run with -benchtime=Nx: N
// calls of the quiet tenant in each phase.
func BenchmarkTenantFloodLatency(b *testing.B) {
	b.Run("burst", func(b *testing.B) { benchFlood(b, false) })
	b.Run("retrying", func(b *testing.B) { benchFlood(b, true) })
}

func benchFlood(b *testing.B, retry bool) {
	const conns, perConn = 11, 200
	st := startStack(b, Config{})
	flood := newSilentTenant(b, st, "flood", 40, conns)
	quiet := newTenant(b, st, "quiet")
	dev, err := tenantDevice(b, st, quiet.id, 0, "02:0e:00:00:00:01")
	if err != nil {
		b.Fatal(err)
	}
	op := dialAs(b, st.GatewayURL(0), quiet.token, nil)
	waitNodes(b, op, true, nodeID(dev))
	ctx := context.Background()
	var failed int
	var firstErr error
	measure := func(n int) []time.Duration {
		lat := make([]time.Duration, 0, n)
		for range n {
			t0 := time.Now()
			_, err := op.Invoke(ctx, occlient.InvokeParams{NodeID: nodeID(dev), Command: "mcp.tools.call", Params: statusCall, TimeoutMs: 10_000})
			if err != nil {
				failed++
				if firstErr == nil {
					firstErr = err
				}
				continue
			}
			lat = append(lat, time.Since(t0))
		}
		return lat
	}
	measure(100) // warm up
	b.ResetTimer()
	alone := measure(b.N)
	b.StopTimer()
	if failed > 0 {
		b.Fatalf("the quiet tenant alone failed %d calls: %v", failed, firstErr)
	}

	fctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var refusals, answered atomic.Int64
	for c, cl := range flood.ops {
		for i := range perConn {
			node := flood.nodes[(c*perConn+i)%len(flood.nodes)]
			wg.Go(func() {
				for fctx.Err() == nil {
					_, err := cl.Invoke(fctx, occlient.InvokeParams{NodeID: node, Command: "mcp.tools.call", Params: statusCall, TimeoutMs: 120_000})
					answered.Add(1)
					var ge *occlient.Error
					if !errors.As(err, &ge) || ge.RetryAfterMs <= 0 {
						continue // held until stopped, or another failure: call again
					}
					refusals.Add(1)
					if !retry {
						return
					}
					select {
					case <-fctx.Done():
					case <-time.After(time.Duration(ge.RetryAfterMs) * time.Millisecond):
					}
				}
			})
		}
	}
	b.Cleanup(func() { stop(); wg.Wait() })
	// Every refusal is audited before it is answered: the burst takes a while.
	for deadline := time.Now().Add(2 * time.Minute); flood.held() < 1000 || answered.Load() < conns*perConn-1000; {
		if time.Now().After(deadline) {
			b.Fatalf("flood not settled: devices hold %d calls, %d answered", flood.held(), answered.Load())
		}
		time.Sleep(10 * time.Millisecond) // polling a condition
	}
	b.Logf("flood settled: devices hold %d calls, %d answered, %d refused", flood.held(), answered.Load(), refusals.Load())
	if retry {
		time.Sleep(2 * time.Second) // let the retry waves reach their steady rhythm, not a condition
	}

	r0, t0 := refusals.Load(), time.Now()
	b.StartTimer()
	during := measure(b.N)
	b.StopTimer()
	rate := float64(refusals.Load()-r0) / time.Since(t0).Seconds()

	ap50, ap99 := percentiles(alone)
	b.ReportMetric(us(ap50), "alone-p50-µs")
	b.ReportMetric(us(ap99), "alone-p99-µs")
	if len(during) > 0 {
		fp50, fp99 := percentiles(during)
		b.ReportMetric(us(fp50), "flood-p50-µs")
		b.ReportMetric(us(fp99), "flood-p99-µs")
		b.ReportMetric(float64(fp99)/float64(ap99), "flood/alone-p99")
	}
	b.ReportMetric(float64(failed), "quiet-failed")
	b.ReportMetric(rate, "refusals/s")
	b.ReportMetric(float64(flood.held()), "flood-held")
	if failed > 0 {
		b.Logf("first failure of the quiet tenant: %v", firstErr)
	}
	// Tear down now: the framework runs this function twice (b.N = 1, then
	// N) and runs cleanups only at the very end, so a flood left running
	// would load the next round.
	stop()
	wg.Wait()
	st.Close()
}
