package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/gwtest"
)

// TestFrameAndParamsCaps: hello-ok advertises the 1 MiB frame cap; a
// node.invoke whose params exceed 128 KiB is refused with PAYLOAD_TOO_LARGE
// before it reaches the node, the connection staying up; a frame over the
// cap closes the socket with 1009 and a reason that names the limit.
func TestFrameAndParamsCaps(t *testing.T) {
	e := newEnv(t)
	gw := e.gateway(nil)
	const node = "xz-a1b2c3d4e5f6"
	e.putNode(device(tenantAcme, node, "kitchen", true))
	sh := e.shim(tenantAcme, echoShim)

	c, err := gwtest.Dial(ctxT(t), gw.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	hello := payload[struct {
		Policy struct {
			MaxPayload int64 `json:"maxPayload"`
		} `json:"policy"`
	}](t, must(c.Connect(ctxT(t), gwtest.OperatorParams(tokOperator, "operator.write"))))
	if hello.Policy.MaxPayload != 1<<20 {
		t.Fatalf("policy.maxPayload %d", hello.Policy.MaxPayload)
	}
	waitListed(t, c, node, true)

	big := map[string]any{"name": "self.audio_speaker.set_volume", "arguments": map[string]any{"pad": strings.Repeat("x", 130<<10)}}
	fe := failure(t, call(t, c, "node.invoke", map[string]any{"nodeId": node, "command": "mcp.tools.call", "params": big, "idempotencyKey": newKey()}))
	if fe.Code != "INVALID_REQUEST" || fe.DetailCode() != "PAYLOAD_TOO_LARGE" || !strings.Contains(fe.Message, "exceed the limit of 131072 bytes") {
		t.Fatalf("got %+v", fe)
	}
	if sh.count() != 0 {
		t.Fatal("an oversized call reached the shim")
	}
	payload[nodeList](t, call(t, c, "node.list", map[string]any{}))

	frame := append([]byte(`{"type":"req","id":"big","method":"node.list","params":{"pad":"`), bytes.Repeat([]byte("x"), 1<<20)...)
	if err := c.SendRaw(ctxT(t), append(frame, `"}}`...)); err != nil {
		t.Fatal(err)
	}
	if code, reason, _ := c.CloseStatus(waitFor); code != 1009 || reason != "payload too large: frame over 1048576 bytes (policy.maxPayload)" {
		t.Fatalf("closed with %d %q", code, reason)
	}
}

// TestConnectionCaps: connects beyond the caps of a token and of a tenant
// are refused with TOO_MANY_CONNECTIONS and close 1008; another tenant is
// not affected, and a closed connection frees its slot.
func TestConnectionCaps(t *testing.T) {
	e := newEnv(t)
	gw := e.gateway(func(c *gateway.Config) { c.MaxConnsPerToken, c.MaxConnsPerTenant = 2, 3 })
	refused := func(token, wantReason string) {
		t.Helper()
		c, err := gwtest.Dial(ctxT(t), gw.URL())
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		res := must(c.Connect(ctxT(t), gwtest.OperatorParams(token, "operator.read")))
		fe := failure(t, res)
		var d struct {
			Limit int `json:"limit"`
		}
		_ = json.Unmarshal(fe.Details, &d)
		if fe.Code != "UNAVAILABLE" || fe.DetailCode() != "TOO_MANY_CONNECTIONS" || fe.Message != wantReason || d.Limit == 0 {
			t.Fatalf("got %+v", fe)
		}
		if code, reason, _ := c.CloseStatus(waitFor); code != 1008 || reason != wantReason {
			t.Fatalf("closed with %d %q", code, reason)
		}
	}
	first := operator(t, gw, tokOperator, "operator.read")
	operator(t, gw, tokOperator, "operator.read")
	refused(tokOperator, "too many connections for this token (at most 2)")
	operator(t, gw, tokAdmin, "operator.read")
	refused(tokViewer, "too many connections for this tenant (at most 3)")
	operator(t, gw, tokGlobex, "operator.read") // another tenant

	first.Close()
	eventually.True(t, "the closed connection's slot freed", func() bool {
		c, err := gwtest.Dial(ctxT(t), gw.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.CloseNow)
		return must(c.Connect(ctxT(t), gwtest.OperatorParams(tokOperator, "operator.read"))).OK
	})
}

// rejectedHolder holds the records of refused calls until released.
type rejectedHolder struct {
	held    chan struct{}
	release chan struct{}
	once    sync.Once
}

func (r *rejectedHolder) AuditInvoke(ctx context.Context, a gateway.InvokeAudit) error {
	if a.Outcome != gateway.OutcomeRejected {
		return nil
	}
	r.once.Do(func() { close(r.held) })
	select {
	case <-r.release:
	case <-ctx.Done():
	}
	return nil
}

// TestInflightCap: at MaxInflightPerConn a further node.invoke is refused
// (and audited); a connection that reaches twice the cap is closed with a
// reason.
func TestInflightCap(t *testing.T) {
	e := newEnv(t)
	audit := &rejectedHolder{held: make(chan struct{}), release: make(chan struct{})}
	defer close(audit.release)
	gw := e.gateway(func(c *gateway.Config) { c.MaxInflightPerConn = 1; c.Auditor = audit })
	const node = "xz-a1b2c3d4e5f6"
	e.putNode(device(tenantAcme, node, "kitchen", true))
	release := make(chan struct{})
	defer close(release)
	sh := e.shim(tenantAcme, func(req wire.InvokeRequest, m *nats.Msg) { <-release; echoShim(req, m) })
	c := operator(t, gw, tokOperator, "operator.write")
	waitListed(t, c, node, true)
	send := func(id string) {
		f, _ := json.Marshal(map[string]any{"type": "req", "id": id, "method": "node.invoke", "params": map[string]any{
			"nodeId": node, "command": "mcp.tools.call", "params": map[string]any{"name": "self.audio_speaker.set_volume"}, "idempotencyKey": newKey()}})
		if err := c.SendRaw(ctxT(t), f); err != nil {
			t.Fatal(err)
		}
	}
	send("a") // held by the device
	eventually.True(t, "the first call at the device", func() bool { return sh.count() == 1 })
	send("b") // over the cap: its refusal is being recorded
	select {
	case <-audit.held:
	case <-time.After(waitFor):
		t.Fatal("the second call was not refused")
	}
	send("c") // twice the cap
	if code, reason, _ := c.CloseStatus(waitFor); code != 1008 || reason != "too many requests in flight" {
		t.Fatalf("closed with %d %q", code, reason)
	}
}
