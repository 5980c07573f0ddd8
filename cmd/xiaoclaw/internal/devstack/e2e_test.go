package devstack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
)

const (
	testDeviceToken   = "dev-device-token"
	testOperatorToken = "dev-operator-token"
	waitLimit         = 15 * time.Second
)

func startStack(t testing.TB, cfg Config) *Stack {
	t.Helper()
	cfg.DataDir = t.TempDir()
	cfg.DeviceToken, cfg.OperatorToken = testDeviceToken, testOperatorToken
	ctx, cancel := context.WithCancel(context.Background())
	st, err := Start(ctx, cfg)
	if err != nil {
		cancel()
		t.Fatalf("start stack: %v", err)
	}
	t.Cleanup(func() { st.Close(); cancel() })
	return st
}

// connectDevices connects n simulated devices to hub i.
func connectDevices(t testing.TB, st *Stack, hub, n int, seed uint32, tune func(*xzsim.Config)) []*xzsim.Device {
	t.Helper()
	dc := xzsim.Config{URL: st.DeviceURL(hub), Token: testDeviceToken}
	if tune != nil {
		tune(&dc)
	}
	f, err := xzsim.NewFleet(xzsim.FleetConfig{Device: dc, Count: n, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := f.ConnectAll(ctx); err != nil {
		t.Fatalf("connect devices: %v", err)
	}
	t.Cleanup(f.Close)
	return f.Devices()
}

func nodeID(d *xzsim.Device) string { return wire.DeviceNodeID(canonical(d)) }

// canonical is the device id the hub knows d by.
func canonical(d *xzsim.Device) string {
	c, _ := wire.CanonicalDevice(d.MAC())
	return c
}

func operator(t testing.TB, url string) *occlient.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	c, err := occlient.Dial(ctx, occlient.Options{URL: url, Token: testOperatorToken})
	if err != nil {
		t.Fatalf("operator connect: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

type listedNode struct {
	NodeID    string          `json:"nodeId"`
	Connected bool            `json:"connected"`
	Commands  []string        `json:"commands"`
	Tools     json.RawMessage `json:"tools"`
}

func listNodes(t testing.TB, c *occlient.Client) map[string]listedNode {
	t.Helper()
	raw, err := c.Call(context.Background(), "node.list", map[string]any{})
	if err != nil {
		t.Fatalf("node.list: %v", err)
	}
	var res struct {
		Nodes []listedNode `json:"nodes"`
	}
	if err := json.Unmarshal(raw, &res); err != nil {
		t.Fatal(err)
	}
	m := map[string]listedNode{}
	for _, n := range res.Nodes {
		m[n.NodeID] = n
	}
	return m
}

// waitNodes polls node.list until every id is listed as connected (or,
// with connected=false, listed as disconnected or gone).
func waitNodes(t testing.TB, c *occlient.Client, connected bool, ids ...string) {
	t.Helper()
	var nodes map[string]listedNode
	if !eventually.Until(waitLimit, func() bool {
		nodes = listNodes(t, c)
		for _, id := range ids {
			if nodes[id].Connected != connected {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("nodes %v not connected=%v within %s; listed: %v", ids, connected, waitLimit, nodes)
	}
}

func callTool(ctx context.Context, c *occlient.Client, node, tool string, args any, timeout time.Duration) (json.RawMessage, error) {
	a, _ := json.Marshal(args)
	p, _ := json.Marshal(map[string]json.RawMessage{"name": json.RawMessage(fmt.Sprintf("%q", tool)), "arguments": a})
	return c.Invoke(ctx, occlient.InvokeParams{NodeID: node, Command: "mcp.tools.call", Params: p, TimeoutMs: timeout.Milliseconds()})
}

// nodeErrorCode returns details.nodeError.code, or details.code.
func nodeErrorCode(t testing.TB, err error) string {
	t.Helper()
	var ge *occlient.Error
	if !errors.As(err, &ge) {
		t.Fatalf("want a gateway error, got %v", err)
	}
	var d struct {
		Code      string `json:"code"`
		NodeError struct {
			Code string `json:"code"`
		} `json:"nodeError"`
	}
	_ = json.Unmarshal(ge.Details, &d)
	if d.NodeError.Code != "" {
		return d.NodeError.Code
	}
	return d.Code
}

func TestInvokeEndToEnd(t *testing.T) {
	st := startStack(t, Config{Hubs: 2, Shims: 2, Gateways: 1})
	devA := connectDevices(t, st, 0, 2, 1, nil)
	devB := connectDevices(t, st, 1, 2, 2, nil)
	op := operator(t, st.GatewayURL(0))
	all := append(append([]*xzsim.Device{}, devA...), devB...)
	var ids []string
	for _, d := range all {
		ids = append(ids, nodeID(d))
	}
	waitNodes(t, op, true, ids...)
	ctx := context.Background()

	t.Run("success on devices of both hubs", func(t *testing.T) {
		for i, d := range all {
			vol := 10 + i
			raw, err := callTool(ctx, op, nodeID(d), "self.audio_speaker.set_volume", map[string]int{"volume": vol}, 5*time.Second)
			if err != nil {
				t.Fatalf("%s: %v", nodeID(d), err)
			}
			var res struct {
				OK      bool   `json:"ok"`
				NodeID  string `json:"nodeId"`
				Payload struct {
					Content []struct{ Type, Text string } `json:"content"`
					IsError bool                          `json:"isError"`
				} `json:"payload"`
			}
			if err := json.Unmarshal(raw, &res); err != nil || !res.OK || res.NodeID != nodeID(d) || res.Payload.IsError || len(res.Payload.Content) == 0 {
				t.Fatalf("unexpected result %s (%v)", raw, err)
			}
			if d.Volume() != vol {
				t.Fatalf("device volume %d, want %d", d.Volume(), vol)
			}
		}
	})

	t.Run("device error without code", func(t *testing.T) {
		_, err := callTool(ctx, op, ids[0], "self.no_such_tool", map[string]any{}, 5*time.Second)
		if err == nil || !strings.Contains(err.Error(), "self.no_such_tool") {
			t.Fatalf("want an unknown-tool error naming the tool, got %v", err)
		}
	})

	t.Run("invalid arguments never reach the device", func(t *testing.T) {
		before := all[0].Requests("tools/call")
		_, err := callTool(ctx, op, ids[0], "self.audio_speaker.set_volume", map[string]int{"volume": 300}, 5*time.Second)
		if err == nil || nodeErrorCode(t, err) != wire.FaultInvalidRequest || !strings.Contains(err.Error(), "volume") {
			t.Fatalf("want INVALID_REQUEST about volume, got %v", err)
		}
		if got := all[0].Requests("tools/call"); got != before {
			t.Fatalf("device saw %d tools/call requests for invalid arguments", got-before)
		}
	})

	t.Run("unknown node", func(t *testing.T) {
		// node.describe's answer, whether the node never existed or belongs
		// to another tenant.
		_, err := callTool(ctx, op, "xz-ffffffffffff", "self.get_device_status", map[string]any{}, time.Second)
		var ge *occlient.Error
		if !errors.As(err, &ge) || ge.Code != "INVALID_REQUEST" || ge.Message != "unknown nodeId" {
			t.Fatalf("want INVALID_REQUEST unknown nodeId, got %v", err)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		release := all[1].Hold()
		defer release()
		start := time.Now()
		_, err := callTool(ctx, op, ids[1], "self.get_device_status", map[string]any{}, 300*time.Millisecond)
		if err == nil || !strings.Contains(err.Error(), "TIMEOUT") {
			t.Fatalf("want a TIMEOUT error, got %v", err)
		}
		if el := time.Since(start); el > 5*time.Second {
			t.Fatalf("timeout answered after %s", el)
		}
	})

	t.Run("duplicate idempotency key", func(t *testing.T) {
		p := json.RawMessage(`{"name":"self.audio_speaker.set_volume","arguments":{"volume":42}}`)
		first, err := op.Invoke(ctx, occlient.InvokeParams{NodeID: ids[2], Command: "mcp.tools.call", Params: p, IdempotencyKey: "k-dup-1"})
		if err != nil {
			t.Fatal(err)
		}
		calls := all[2].Requests("tools/call")
		second, err := op.Invoke(ctx, occlient.InvokeParams{NodeID: ids[2], Command: "mcp.tools.call", Params: p, IdempotencyKey: "k-dup-1"})
		if err != nil {
			t.Fatal(err)
		}
		if string(first) != string(second) {
			t.Fatalf("duplicate answered differently:\n%s\n%s", first, second)
		}
		if got := all[2].Requests("tools/call"); got != calls {
			t.Fatalf("duplicate reached the device (%d more calls)", got-calls)
		}
		other := json.RawMessage(`{"name":"self.audio_speaker.set_volume","arguments":{"volume":43}}`)
		if _, err := op.Invoke(ctx, occlient.InvokeParams{NodeID: ids[2], Command: "mcp.tools.call", Params: other, IdempotencyKey: "k-dup-1"}); err == nil {
			t.Fatal("same key with other params must fail")
		}
	})

	t.Run("disconnect mid-call fails at once", func(t *testing.T) {
		d := all[3]
		release := d.Hold()
		defer release()
		errc := make(chan error, 1)
		go func() {
			_, err := callTool(ctx, op, ids[3], "self.get_device_status", map[string]any{}, 20*time.Second)
			errc <- err
		}()
		waitFor(t, func() bool { return d.Held() > 0 })
		start := time.Now()
		d.Drop()
		select {
		case err := <-errc:
			if err == nil {
				t.Fatal("call succeeded on a dropped device")
			}
			if code := nodeErrorCode(t, err); code != wire.FaultDisconnected && code != wire.FaultNotConnected {
				t.Fatalf("want DISCONNECTED, got %v", err)
			}
			if el := time.Since(start); el > 3*time.Second {
				t.Fatalf("pending call failed only after %s", el)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("pending call hangs after the device dropped")
		}
	})

	t.Run("offline device", func(t *testing.T) {
		waitNodes(t, op, false, ids[3])
		_, err := callTool(ctx, op, ids[3], "self.get_device_status", map[string]any{}, 2*time.Second)
		if err == nil || nodeErrorCode(t, err) != wire.FaultNotConnected {
			t.Fatalf("want NOT_CONNECTED for an offline device, got %v", err)
		}
	})
}

// waitFor polls cond until it holds, within the end-to-end tests' bound.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	eventually.Within(t, waitLimit, "the condition", cond)
}

// A shim replica stopped under load: calls sent after it stopped all
// succeed; calls it held fail with a clear error or succeed, never hang.
func TestShimReplicaStoppedUnderLoad(t *testing.T) {
	st := startStack(t, Config{Hubs: 1, Shims: 2, Gateways: 1})
	devs := connectDevices(t, st, 0, 4, 3, func(c *xzsim.Config) { c.Latency = 2 * time.Millisecond })
	op := operator(t, st.GatewayURL(0))
	var ids []string
	for _, d := range devs {
		ids = append(ids, nodeID(d))
	}
	waitNodes(t, op, true, ids...)

	ctx, cancel := context.WithCancel(context.Background())
	var stopped atomic.Bool
	var afterStopFailures, hung atomic.Int64
	var total atomic.Int64
	var firstErr sync.Once
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ctx.Err() == nil; i++ {
				sentAfterStop := stopped.Load()
				cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := callTool(cctx, op, ids[i%len(ids)], "self.get_device_status", map[string]any{}, 5*time.Second)
				ccancel()
				total.Add(1)
				if errors.Is(err, context.DeadlineExceeded) {
					hung.Add(1)
				}
				if err != nil && sentAfterStop {
					afterStopFailures.Add(1)
					firstErr.Do(func() { t.Logf("first failure after stop: %v", err) })
				}
			}
		}()
	}
	waitFor(t, func() bool { return total.Load() > 200 })
	if err := st.Component("shim-1").Stop(); err != nil {
		t.Fatalf("stop shim-1: %v", err)
	}
	stopped.Store(true)
	mark := total.Load()
	waitFor(t, func() bool { return total.Load() > mark+300 })
	cancel()
	wg.Wait()
	if n := afterStopFailures.Load(); n > 0 {
		t.Fatalf("%d calls sent after the shim stopped failed", n)
	}
	if n := hung.Load(); n > 0 {
		t.Fatalf("%d calls hung", n)
	}
}

// Two gateway replicas on one NATS see the same nodes and invoke any of them.
func TestGatewayReplicasShareNodes(t *testing.T) {
	st := startStack(t, Config{Hubs: 2, Shims: 1, Gateways: 2})
	a := connectDevices(t, st, 0, 1, 4, nil)[0]
	b := connectDevices(t, st, 1, 1, 5, nil)[0]
	for gw := range 2 {
		op := operator(t, st.GatewayURL(gw))
		waitNodes(t, op, true, nodeID(a), nodeID(b))
		for _, d := range []*xzsim.Device{a, b} {
			if _, err := callTool(context.Background(), op, nodeID(d), "self.screen.set_brightness", map[string]int{"brightness": 50 + gw}, 5*time.Second); err != nil {
				t.Fatalf("gateway %d → %s: %v", gw, nodeID(d), err)
			}
			if d.Brightness() != 50+gw {
				t.Fatalf("brightness %d", d.Brightness())
			}
		}
	}
}

// A device boots like the firmware: OTA hands out MQTT credentials, the
// device connects to the embedded broker (never subscribing), and its tools
// are callable through the gateway.
func TestMQTTDeviceThroughOTA(t *testing.T) {
	st := startStack(t, Config{MQTTAddr: "127.0.0.1:0", AutoActivate: true})
	devs := connectDevices(t, st, 0, 1, 11, func(c *xzsim.Config) { c.OTAURL = st.OTAURL(0) })
	d := devs[0]
	if d.Transport() != xzsim.TransportMQTT {
		t.Fatalf("device booted over %q, want mqtt (the OTA reply offers it)", d.Transport())
	}
	op := operator(t, st.GatewayURL(0))
	waitNodes(t, op, true, nodeID(d))
	if _, err := callTool(context.Background(), op, nodeID(d), "self.audio_speaker.set_volume", map[string]int{"volume": 55}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if d.Volume() != 55 {
		t.Fatalf("volume %d", d.Volume())
	}
}
