package gateway_test

import (
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/gwtest"
)

func TestIdempotencyAcrossReplicas(t *testing.T) {
	e := newEnv(t)
	gwA, gwB := e.gateway(nil), e.gateway(nil)
	const node = "xz-a1b2c3d4e5f6"
	e.putNode(device(tenantAcme, node, "kitchen", true))
	var mu sync.Mutex
	gate := make(chan struct{})
	n := 0
	sh := e.shim(tenantAcme, func(req wire.InvokeRequest, m *nats.Msg) {
		mu.Lock()
		n++
		mine := n
		mu.Unlock()
		if string(req.Params) == `{"wait":true}` {
			<-gate
		}
		reply(m, wire.InvokeReply{OK: true, Payload: json.RawMessage(`{"call":` + strconv.Itoa(mine) + `}`)})
	})
	a := operator(t, gwA, tokAdmin, "operator.write")
	b := operator(t, gwB, tokAdmin, "operator.write")
	waitListed(t, a, node, true)
	waitListed(t, b, node, true)
	inv := func(c *gwtest.Client, key string, params any) gwtest.Frame {
		return call(t, c, "node.invoke", map[string]any{"nodeId": node, "command": "mcp.tools.list", "params": params, "idempotencyKey": key})
	}

	first := payload[map[string]any](t, inv(a, "same-key", map[string]any{"x": 1}))
	// The same key with the same params (other whitespace) on the other
	// replica returns the first result; the shim is not called again.
	again := payload[map[string]any](t, inv(b, "same-key", json.RawMessage(`{ "x" : 1 }`)))
	if first["payloadJSON"] != `{"call":1}` || again["payloadJSON"] != `{"call":1}` || sh.count() != 1 {
		t.Fatalf("first %v again %v, shim called %d times", first, again, sh.count())
	}
	// The same key with other params is refused.
	fe := failure(t, inv(b, "same-key", map[string]any{"x": 2}))
	if fe.Code != "INVALID_REQUEST" || fe.DetailCode() != "IDEMPOTENCY_KEY_REUSED" {
		t.Fatalf("got %+v", fe)
	}
	// Keys are per tenant: globex may use the same key.
	e.putNode(device(tenantOther, "xz-0000000000bb", "theirs", true))
	e.shim(tenantOther, echoShim)
	g := operator(t, gwB, tokGlobex, "operator.write")
	waitListed(t, g, "xz-0000000000bb", true)
	payload[map[string]any](t, call(t, g, "node.invoke", map[string]any{"nodeId": "xz-0000000000bb", "command": "mcp.tools.list", "idempotencyKey": "same-key"}))

	// A duplicate that arrives while the first is in flight waits for it.
	results := make(chan gwtest.Frame, 2)
	async := func(c *gwtest.Client) {
		f, _ := c.Call(ctxT(t), "node.invoke", map[string]any{"nodeId": node, "command": "mcp.tools.list", "params": map[string]any{"wait": true}, "idempotencyKey": "in-flight"})
		results <- f
	}
	go async(a)
	eventually.True(t, "first call at the shim", func() bool { return sh.count() == 2 })
	go async(b)
	// Give the duplicate a chance to reach the shim if deduplication failed.
	select {
	case f := <-results:
		t.Fatalf("answered before the first call finished: %s", f.Raw)
	case <-time.After(200 * time.Millisecond):
	}
	close(gate)
	r1, r2 := payload[map[string]any](t, <-results), payload[map[string]any](t, <-results)
	if r1["payloadJSON"] != `{"call":2}` || r2["payloadJSON"] != `{"call":2}` || sh.count() != 2 {
		t.Fatalf("in-flight duplicate: %v %v, shim called %d times", r1, r2, sh.count())
	}
}

func TestFailedDispatchDoesNotPinTheKey(t *testing.T) {
	e := newEnv(t)
	gw := e.gateway(nil)
	const node = "xz-a1b2c3d4e5f6"
	e.putNode(device(tenantAcme, node, "kitchen", true))
	c := operator(t, gw, tokAdmin, "operator.write")
	waitListed(t, c, node, true)
	p := map[string]any{"nodeId": node, "command": "mcp.tools.list", "idempotencyKey": "retry-me"}
	// No shim yet: the node is not reachable and the key is released ...
	if fe := failure(t, call(t, c, "node.invoke", p)); fe.DetailCode() != "NOT_CONNECTED" {
		t.Fatalf("got %+v", fe)
	}
	// ... so a retry with the same key runs once the shim is back.
	e.shim(tenantAcme, echoShim)
	payload[map[string]any](t, call(t, c, "node.invoke", p))
}

func TestNodeEventsReachOnlyTheTenantsOperators(t *testing.T) {
	e := newEnv(t)
	gwA, gwB := e.gateway(nil), e.gateway(nil)
	acmeA := operator(t, gwA, tokAdmin, "operator.read")
	acmeB := operator(t, gwB, tokViewer, "operator.read")
	globex := operator(t, gwA, tokGlobex, "operator.read")
	publish := func(tenant, nodeID, event, payload string) {
		b, _ := json.Marshal(wire.NodeEventMsg{NodeID: nodeID, Event: event, Payload: json.RawMessage(payload), TsMs: 1700000000123})
		if err := e.nc.Publish(wire.NodeEvent(tenant), b); err != nil {
			t.Fatal(err)
		}
	}
	publish(tenantAcme, "xz-a1b2c3d4e5f6", "mcp.notification", `{"method":"notifications/state","params":{"s":"idle"}}`)
	publish(tenantOther, "xz-0000000000bb", "node.connected", "")
	publish(tenantAcme, "xz-a1b2c3d4e5f6", "node.disconnected", "")

	for _, c := range []*gwtest.Client{acmeA, acmeB} {
		f1 := must(c.WaitEvent(ctxT(t), "node.event"))
		f2 := must(c.WaitEvent(ctxT(t), "node.event"))
		assertNoNull(t, f1.Raw)
		if string(f1.Raw) != `{"type":"event","event":"node.event","payload":{"nodeId":"xz-a1b2c3d4e5f6","event":"mcp.notification",`+
			`"payload":{"method":"notifications/state","params":{"s":"idle"}},"ts":1700000000123},"seq":1}` {
			t.Fatalf("event frame %s", f1.Raw)
		}
		var p2 struct {
			Event string `json:"event"`
		}
		_ = json.Unmarshal(f2.Payload, &p2)
		if p2.Event != "node.disconnected" || *f2.Seq != 2 {
			t.Fatalf("second event %s (globex's event leaked?)", f2.Raw)
		}
	}
	f := must(globex.WaitEvent(ctxT(t), "node.event"))
	if string(f.Payload) != `{"nodeId":"xz-0000000000bb","event":"node.connected","ts":1700000000123}` || *f.Seq != 1 {
		t.Fatalf("globex got %s", f.Raw)
	}
	select {
	case f := <-globex.Events:
		if f.Event == "node.event" {
			t.Fatalf("globex got acme's event %s", f.Raw)
		}
	default:
	}
}

func TestNodeHostOnOneReplicaInvokedThroughAnother(t *testing.T) {
	e := newEnv(t)
	gwA, gwB := e.gateway(nil), e.gateway(nil)
	release := make(chan struct{})
	host, _, err := gwtest.ConnectNodeHost(ctxT(t), gwA.URL(), gwtest.NodeParams(tokOperator, "ocl-node-1", "system.which", "system.run"), nil,
		func(req gwtest.InvokeRequest) (string, string, string) {
			switch req.Command {
			case "system.which":
				var p struct {
					Bins []string `json:"bins"`
				}
				_ = json.Unmarshal([]byte(*req.ParamsJSON), &p)
				return `{"bins":{"` + p.Bins[0] + `":"/usr/bin/` + p.Bins[0] + `"}}`, "", ""
			case "system.run":
				<-release // never answers before its socket goes
				return "", "", ""
			}
			return "", "UNAVAILABLE", "command not supported"
		})
	if err != nil {
		t.Fatal(err)
	}
	defer host.CloseNow()
	op := operator(t, gwB, tokAdmin, "operator.write")
	n := waitListed(t, op, host.NodeID, true)
	if n.DisplayName != "ocl-node-1" || n.Kind != "openclaw" {
		t.Fatalf("listed %+v", n)
	}

	res := payload[map[string]any](t, call(t, op, "node.invoke", map[string]any{
		"nodeId": host.NodeID, "command": "system.which", "params": map[string]any{"bins": []string{"sh"}},
		"idempotencyKey": "k-which", "timeoutMs": 15000,
	}))
	if res["payloadJSON"] != `{"bins":{"sh":"/usr/bin/sh"}}` || res["nodeId"] != host.NodeID || res["command"] != "system.which" {
		t.Fatalf("result %v", res)
	}
	// The node host received OpenClaw's node.invoke.request shape.
	req := <-host.Requests
	if req.ParamsJSON == nil || *req.ParamsJSON != `{"bins":["sh"]}` || req.IdempotencyKey != "k-which" || req.TimeoutMs <= 0 || req.TimeoutMs > 15000 || req.NodeID != host.NodeID {
		t.Fatalf("node host got %+v", req)
	}
	raw := must(host.WaitEvent(ctxT(t), "node.invoke.request"))
	if raw.Seq != nil {
		t.Fatalf("targeted event carries a seq: %s", raw.Raw)
	}

	// A node error comes back in OpenClaw's shape.
	payloadless := call(t, op, "node.invoke", map[string]any{"nodeId": host.NodeID, "command": "system.run", "idempotencyKey": "k-run", "timeoutMs": 100})
	if fe := failure(t, payloadless); fe.Message != "TIMEOUT: node invoke timed out" {
		t.Fatalf("got %+v", fe)
	}
	if r := <-host.Requests; r.ParamsJSON != nil {
		t.Fatalf("absent params forwarded as %q, want null", *r.ParamsJSON)
	}

	// A pending invoke fails when the node host goes away.
	done := make(chan gwtest.Frame, 1)
	go func() {
		f, _ := op.Call(ctxT(t), "node.invoke", map[string]any{"nodeId": host.NodeID, "command": "system.run", "idempotencyKey": "k-run-2", "params": map[string]any{}})
		done <- f
	}()
	<-host.Requests
	host.CloseNow()
	fe := failure(t, <-done)
	if fe.Code != "UNAVAILABLE" || fe.Message != "DISCONNECTED: node disconnected (system.run)" {
		t.Fatalf("got %s %q", fe.Code, fe.Message)
	}
	close(release)
	waitListed(t, op, host.NodeID, false)
	if fe := failure(t, call(t, op, "node.invoke", map[string]any{"nodeId": host.NodeID, "command": "system.which", "idempotencyKey": "k3"})); fe.Message != "node not connected" {
		t.Fatalf("got %+v", fe)
	}
}

func TestNewerNodeHostSessionReplacesTheOlder(t *testing.T) {
	e := newEnv(t)
	gwA, gwB := e.gateway(nil), e.gateway(nil)
	_, priv, _ := ed25519.GenerateKey(nil)
	answer := func(who string) gwtest.InvokeHandler {
		return func(gwtest.InvokeRequest) (string, string, string) { return `{"host":"` + who + `"}`, "", "" }
	}
	old, _, err := gwtest.ConnectNodeHost(ctxT(t), gwA.URL(), gwtest.NodeParams(tokAdmin, "twin", "system.which"), priv, answer("old"))
	if err != nil {
		t.Fatal(err)
	}
	defer old.CloseNow()
	op := operator(t, gwA, tokAdmin, "operator.write")
	waitListed(t, op, old.NodeID, true)
	fresh, _, err := gwtest.ConnectNodeHost(ctxT(t), gwB.URL(), gwtest.NodeParams(tokAdmin, "twin", "system.which"), priv, answer("new"))
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.CloseNow()
	if code, reason, _ := old.CloseStatus(waitFor); code != 1008 || reason != "node replaced by a newer connection" {
		t.Fatalf("old session closed with %d %q", code, reason)
	}
	// The record stays connected (the old session must not mark it down)
	// and invokes reach the new session.
	res := payload[map[string]any](t, call(t, op, "node.invoke", map[string]any{"nodeId": fresh.NodeID, "command": "system.which", "idempotencyKey": "k"}))
	if res["payloadJSON"] != `{"host":"new"}` {
		t.Fatalf("answered by %v", res["payloadJSON"])
	}
	waitListed(t, op, fresh.NodeID, true)
}

func TestTicksAndGracefulShutdown(t *testing.T) {
	e := newEnv(t)
	gw := e.gateway(func(c *gateway.Config) {
		c.TickInterval = 50 * time.Millisecond
		c.RestartExpected = 2 * time.Second
	})
	op := operator(t, gw, tokAdmin, "operator.read")
	h, _, err := gwtest.ConnectNodeHost(ctxT(t), gw.URL(), gwtest.NodeParams(tokAdmin, "n", "system.which"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.CloseNow()
	t1 := must(op.WaitEvent(ctxT(t), "tick"))
	t2 := must(op.WaitEvent(ctxT(t), "tick"))
	if *t2.Seq <= *t1.Seq || len(t1.Payload) == 0 {
		t.Fatalf("ticks %s %s", t1.Raw, t2.Raw)
	}
	waitListed(t, op, h.NodeID, true)

	gw.stop()
	for _, c := range []*gwtest.Client{op, h.Client} {
		f := must(c.WaitEvent(ctxT(t), "shutdown"))
		if string(f.Payload) != `{"reason":"gateway stopping","restartExpectedMs":2000}` || f.Seq == nil {
			t.Fatalf("shutdown event %s", f.Raw)
		}
		if code, reason, _ := c.CloseStatus(waitFor); code != 1012 || reason != "service restart" {
			t.Fatalf("closed with %d %q", code, reason)
		}
	}
	// The node host it held is marked disconnected for every other replica.
	gw2 := e.gateway(nil)
	waitListed(t, operator(t, gw2, tokAdmin, "operator.read"), h.NodeID, false)
}

func TestSlowConsumerIsDisconnected(t *testing.T) {
	e := newEnv(t)
	gw := e.gateway(func(c *gateway.Config) { c.MaxBufferedBytes = 256 << 10 })
	ctx := ctxT(t)
	// A raw operator that stops reading after hello.
	ws, _, err := websocket.Dial(ctx, gw.URL(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.CloseNow()
	ws.SetReadLimit(1 << 20)
	if _, _, err := ws.Read(ctx); err != nil {
		t.Fatal(err)
	}
	hello, _ := json.Marshal(map[string]any{"type": "req", "id": "1", "method": "connect", "params": gwtest.OperatorParams(tokAdmin, "operator.read")})
	if err := ws.Write(ctx, websocket.MessageText, hello); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ws.Read(ctx); err != nil {
		t.Fatal(err)
	}
	watcher := operator(t, gw, tokGlobex, "operator.read")

	// 10 MB of events: more than twice what the loopback socket buffers
	// take in before the gateway's write blocks (the sender's buffer grows
	// to tcp_wmem's 4 MiB). No more: the gateway decodes every byte, which
	// the race detector makes slow enough to run past waitFor.
	const n = 100
	ev, _ := json.Marshal(wire.NodeEventMsg{NodeID: "xz-a1b2c3d4e5f6", Event: "big", TsMs: 1,
		Payload: json.RawMessage(`{"blob":"` + strings.Repeat("x", 100<<10) + `"}`)})
	for i := 0; i < n; i++ {
		if err := e.nc.Publish(wire.NodeEvent(tenantAcme), ev); err != nil {
			t.Fatal(err)
		}
	}
	// Events are fanned out in order: once another tenant's later event
	// arrived, the gateway has dealt with all of them.
	marker, _ := json.Marshal(wire.NodeEventMsg{NodeID: "xz-0000000000bb", Event: "marker", TsMs: 1})
	if err := e.nc.Publish(wire.NodeEvent(tenantOther), marker); err != nil {
		t.Fatal(err)
	}
	must(watcher.WaitEvent(ctx, "node.event"))

	got := 0
	for {
		if _, _, err = ws.Read(ctx); err != nil {
			break
		}
		got++
	}
	if got >= n || ctx.Err() != nil {
		t.Fatalf("read %d of %d events, then %v: the slow client was not dropped", got, n, err)
	}
	// If the close frame made it out, it says why.
	if code := websocket.CloseStatus(err); code != -1 {
		var ce websocket.CloseError
		if errors.As(err, &ce); code != websocket.StatusPolicyViolation || ce.Reason != "slow consumer" {
			t.Fatalf("closed with %d %q", code, ce.Reason)
		}
	}
	// The gateway serves everyone else as before.
	payload[map[string]any](t, call(t, watcher, "health", nil))
}
