package shim_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/shim"
)

// BenchmarkShimHop measures what the shim adds to a call: the same tool call
// sent straight to a device responder (what the shim itself does), and sent
// as node.invoke through a shim replica. The difference is the shim hop:
// one more NATS round trip plus decode, lookup, validation and mapping.
// "parallel" runs 64 concurrent callers for throughput.
func BenchmarkShimHop(b *testing.B) {
	e := newEnv(b)
	e.startShim(b, shim.Config{})
	e.publishEvent(b, online(tenant, device, "s1", 1000))
	e.waitRecord(b, tenant, nodeID, "connected", func(r wire.NodeRecord) bool { return r.Connected })

	// The device side: a hub replica answering at once, on its own connection.
	hub := connect(b, e.srv, "hub")
	answer := []byte(`{"jsonrpc":"2.0","id":7,"result":{"content":[{"type":"text","text":"true"}],"isError":false}}`)
	if _, err := hub.Subscribe(wire.DeviceRPC(tenant, device), func(m *nats.Msg) { _ = m.Respond(answer) }); err != nil {
		b.Fatal(err)
	}
	if err := hub.Flush(); err != nil {
		b.Fatal(err)
	}

	rpc := []byte(`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":50}}}`)
	invoke, _ := json.Marshal(wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.call",
		Params: json.RawMessage(`{"name":"self.audio_speaker.set_volume","arguments":{"volume":50}}`), IdempotencyKey: "k"})
	direct := func(nc *nats.Conn) error {
		m := &nats.Msg{Subject: wire.DeviceRPC(tenant, device), Header: nats.Header{wire.HeaderTimeout: []string{"5000"}}, Data: rpc}
		_, err := nc.RequestMsg(m, 5*time.Second)
		return err
	}
	viaShim := func(nc *nats.Conn) error {
		m := &nats.Msg{Subject: wire.NodeInvoke(tenant), Header: nats.Header{wire.HeaderTimeout: []string{"5000"}}, Data: invoke}
		r, err := nc.RequestMsg(m, 5*time.Second)
		if err == nil && (len(r.Data) < 10 || string(r.Data[:10]) != `{"ok":true`) {
			b.Fatalf("invoke failed: %s", r.Data)
		}
		return err
	}
	for _, c := range []struct {
		name string
		call func(*nats.Conn) error
	}{{"direct", direct}, {"via-shim", viaShim}} {
		b.Run(c.name+"/sequential", func(b *testing.B) {
			lat := make([]time.Duration, 0, 1<<16)
			b.ReportAllocs()
			for b.Loop() {
				start := time.Now()
				if err := c.call(e.nc); err != nil {
					b.Fatal(err)
				}
				if len(lat) < cap(lat) {
					lat = append(lat, time.Since(start))
				}
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
		b.Run(c.name+"/parallel", func(b *testing.B) {
			b.SetParallelism(32) // 64 callers on 2 cores
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := c.call(e.nc); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
