package devstack

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
)

// BenchmarkMCPToolCallVsNodeInvoke measures, in one run and alternating
// call by call so the ratio holds on a noisy machine, sequential latency of
// the same tool of the same simulated device called as MCP tools/call
// (Go SDK client, Streamable HTTP, /mcp) and as node.invoke (WebSocket).
// Metrics: mcp-p50-µs, mcp-p99-µs, invoke-p50-µs, invoke-p99-µs,
// mcp-added-p50-µs (the target is ≤ 300) and mcp/invoke-p50.
func BenchmarkMCPToolCallVsNodeInvoke(b *testing.B) {
	st := startStack(b, Config{})
	dev := connectDevices(b, st, 0, 1, 7, nil)[0]
	op := operator(b, st.GatewayURL(0))
	id := nodeID(dev)
	waitNodes(b, op, true, id)
	cs := mcpConnect(b, mcpURL(st, 0, "/mcp/nodes/"+id), map[string]string{"Authorization": "Bearer " + testOperatorToken}, nil)
	ctx := context.Background()
	viaMCP := func() {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "self.get_device_status", Arguments: map[string]any{}})
		if err != nil || res.IsError {
			b.Fatalf("tools/call: %v %+v", err, res)
		}
	}
	viaInvoke := func() {
		if _, err := op.Invoke(ctx, occlient.InvokeParams{NodeID: id, Command: "mcp.tools.call", Params: statusCall}); err != nil {
			b.Fatal(err)
		}
	}
	for range 200 {
		viaMCP()
		viaInvoke()
	}
	var ml, il []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		viaMCP()
		t1 := time.Now()
		viaInvoke()
		ml, il = append(ml, t1.Sub(t0)), append(il, time.Since(t1))
	}
	b.StopTimer()
	mp50, mp99 := percentiles(ml)
	ip50, ip99 := percentiles(il)
	b.ReportMetric(us(mp50), "mcp-p50-µs")
	b.ReportMetric(us(mp99), "mcp-p99-µs")
	b.ReportMetric(us(ip50), "invoke-p50-µs")
	b.ReportMetric(us(ip99), "invoke-p99-µs")
	b.ReportMetric(us(mp50-ip50), "mcp-added-p50-µs")
	b.ReportMetric(float64(mp50)/float64(ip50), "mcp/invoke-p50")
}

// BenchmarkMCPListChanged measures the time from a device's connect (the
// simulated device's Connect returns once the hub accepted it) to
// notifications/tools/list_changed at an MCP client of its tenant: the
// registry write, the gateway's watcher, the collection delay
// (MCPConfig.NotifyDelay, 100 ms by default) and the SSE push.
// Metrics: p50-ms and max-ms (the target is ≤ 1000).
func BenchmarkMCPListChanged(b *testing.B) {
	st := startStack(b, Config{})
	var changed atomic.Int64
	notified := make(chan time.Time, 64)
	mcpConnect(b, mcpURL(st, 0, "/mcp"), map[string]string{"Authorization": "Bearer " + testOperatorToken},
		&mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			changed.Add(1)
			select {
			case notified <- time.Now():
			default:
			}
		}})
	var lat []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		for len(notified) > 0 {
			<-notified
		}
		b.StartTimer()
		t0 := time.Now()
		devs := connectDevices(b, st, 0, 1, uint32(1000+i), nil)
		select {
		case at := <-notified:
			lat = append(lat, at.Sub(t0))
		case <-time.After(10 * time.Second):
			b.Fatal("no list_changed within 10 s of a device's connect")
		}
		b.StopTimer()
		before := changed.Load()
		devs[0].Close()
		waitFor(b, func() bool { return changed.Load() > before })
		b.StartTimer()
	}
	b.StopTimer()
	p50, _ := percentiles(lat)
	b.ReportMetric(float64(p50.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(slicesMax(lat).Microseconds())/1000, "max-ms")
}

func slicesMax(d []time.Duration) time.Duration {
	var m time.Duration
	for _, v := range d {
		m = max(m, v)
	}
	return m
}
