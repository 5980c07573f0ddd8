package gateway_test

import (
	"context"
	"encoding/json"
	"sort"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/gwtest"
)

// benchConn is a lean operator: pre-encoded frames and no decoding beyond
// finding the response, so the figures are the gateway's.
type benchConn struct {
	ws  *websocket.Conn
	buf []byte
}

func dialBench(b *testing.B, url string) *benchConn {
	ctx := context.Background()
	ws, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		b.Fatal(err)
	}
	ws.SetReadLimit(1 << 20)
	if _, _, err := ws.Read(ctx); err != nil { // connect.challenge
		b.Fatal(err)
	}
	hello, _ := json.Marshal(map[string]any{"type": "req", "id": "c", "method": "connect", "params": gwtest.OperatorParams(tokAdmin, "operator.write")})
	if err := ws.Write(ctx, websocket.MessageText, hello); err != nil {
		b.Fatal(err)
	}
	if _, _, err := ws.Read(ctx); err != nil {
		b.Fatal(err)
	}
	return &benchConn{ws: ws}
}

// invoke sends one node.invoke with a fresh idempotency key and waits for
// its response (ticks and events are skipped).
func (c *benchConn) invoke(ctx context.Context, id string) error {
	c.buf = append(c.buf[:0], `{"type":"req","id":"`...)
	c.buf = append(c.buf, id...)
	c.buf = append(c.buf, `","method":"node.invoke","params":{"nodeId":"xz-a1b2c3d4e5f6","command":"mcp.tools.call",`+
		`"params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":30}},"idempotencyKey":"`...)
	c.buf = append(c.buf, id...)
	c.buf = append(c.buf, `"}}`...)
	if err := c.ws.Write(ctx, websocket.MessageText, c.buf); err != nil {
		return err
	}
	for {
		_, data, err := c.ws.Read(ctx)
		if err != nil {
			return err
		}
		const res = `{"type":"res","id":"`
		if len(data) > len(res) && string(data[:len(res)]) == res {
			if rest := data[len(res)+len(id):]; len(rest) < 12 || string(rest[:12]) != `","ok":true,` {
				return &benchErr{string(data)}
			}
			return nil
		}
	}
}

type benchErr struct{ frame string }

func (e *benchErr) Error() string { return "unexpected response " + e.frame }

var runID = strconv.FormatInt(time.Now().UnixNano(), 36)

// BenchmarkNodeInvoke measures node.invoke through the gateway: operator
// WebSocket → gateway (parse, registry, policy, idempotency claim in KV,
// NATS request) → a responder that answers at once, as a shim would for a
// device that replies immediately → gateway → operator.
func BenchmarkNodeInvoke(b *testing.B) {
	e := newEnv(b)
	gw := e.gateway(nil)
	e.putNode(device(tenantAcme, "xz-a1b2c3d4e5f6", "bench", true))
	result := []byte(`{"ok":true,"payload":{"content":[{"type":"text","text":"true"}],"isError":false}}`)
	sub, err := e.nc.QueueSubscribe(wire.NodeInvoke(tenantAcme), wire.QueueShim, func(m *nats.Msg) { _ = m.Respond(result) })
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	_ = e.nc.Flush()
	ctx := context.Background()
	warm := dialBench(b, gw.URL())
	deadline := time.Now().Add(waitFor)
	for warm.invoke(ctx, "warm-"+runID+strconv.FormatInt(time.Now().UnixNano(), 10)) != nil { // registry loaded
		if time.Now().After(deadline) {
			b.Fatal("gateway never served the node")
		}
		time.Sleep(10 * time.Millisecond)
	}
	warm.ws.CloseNow()

	b.Run("sequential", func(b *testing.B) {
		c := dialBench(b, gw.URL())
		defer c.ws.CloseNow()
		lat := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			start := time.Now()
			if err := c.invoke(ctx, "s"+strconv.Itoa(i)+"-"+runID); err != nil {
				b.Fatal(err)
			}
			lat = append(lat, time.Since(start))
		}
		b.StopTimer()
		sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	})
	b.Run("parallel", func(b *testing.B) {
		var seq atomic.Int64
		b.SetParallelism(16) // 16 operator connections per CPU, one call in flight each
		b.ReportAllocs()
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			c := dialBench(b, gw.URL())
			defer c.ws.CloseNow()
			for pb.Next() {
				if err := c.invoke(ctx, "p"+strconv.FormatInt(seq.Add(1), 10)+"-"+runID); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "invokes/s")
	})
}
