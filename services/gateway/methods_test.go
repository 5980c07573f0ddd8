package gateway_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/gwtest"
)

func TestScopesAndRoleGating(t *testing.T) {
	e := newEnv(t)
	gw := e.gateway(nil)
	e.putNode(device(tenantAcme, "xz-a1b2c3d4e5f6", "kitchen", true))
	e.shim(tenantAcme, echoShim)
	invoke := map[string]any{"nodeId": "xz-a1b2c3d4e5f6", "command": "mcp.tools.list", "idempotencyKey": "k1"}

	t.Run("viewer cannot invoke (v4)", func(t *testing.T) {
		c := operator(t, gw, tokViewer, "operator.admin", "operator.read", "operator.write")
		fe := failure(t, call(t, c, "node.invoke", invoke))
		if fe.Code != "FORBIDDEN" || fe.Message != "missing scope: operator.write" ||
			string(fe.Details) != `{"code":"MISSING_SCOPE","missingScope":"operator.write","requiredScopes":["operator.write"]}` {
			t.Fatalf("got %s %q %s", fe.Code, fe.Message, fe.Details)
		}
		// Reading is allowed.
		waitListed(t, c, "xz-a1b2c3d4e5f6", true)
	})
	t.Run("viewer cannot invoke (v3)", func(t *testing.T) {
		c, _ := gwtest.Dial(ctxT(t), gw.URL())
		defer c.CloseNow()
		p := gwtest.OperatorParams(tokViewer, "operator.read", "operator.write")
		*p.MinProtocol, *p.MaxProtocol = 3, 3
		payload[map[string]any](t, must(c.Connect(ctxT(t), p)))
		fe := failure(t, call(t, c, "node.invoke", invoke))
		if fe.Code != "INVALID_REQUEST" || fe.Message != "missing scope: operator.write" || len(fe.Details) != 0 {
			t.Fatalf("got %+v", fe)
		}
	})
	t.Run("no scopes requested", func(t *testing.T) {
		c := operator(t, gw, tokAdmin)
		fe := failure(t, call(t, c, "node.list", map[string]any{}))
		if fe.Code != "FORBIDDEN" || fe.Message != "missing scope: operator.read" {
			t.Fatalf("got %+v", fe)
		}
		// health needs no scope.
		payload[map[string]any](t, call(t, c, "health", map[string]any{}))
	})
	t.Run("write satisfies read, operator may invoke", func(t *testing.T) {
		c := operator(t, gw, tokOperator, "operator.write")
		payload[nodeList](t, call(t, c, "node.list", map[string]any{}))
		payload[map[string]any](t, call(t, c, "node.invoke", invoke))
	})
	t.Run("operator may not call node methods", func(t *testing.T) {
		c := operator(t, gw, tokAdmin, "operator.admin")
		fe := failure(t, call(t, c, "node.invoke.result", map[string]any{"id": "x", "nodeId": "y", "ok": true}))
		if fe.Message != "unauthorized role: operator" {
			t.Fatalf("got %+v", fe)
		}
	})
	t.Run("unknown method, second connect, bad frame", func(t *testing.T) {
		c := operator(t, gw, tokAdmin, "operator.admin")
		if fe := failure(t, call(t, c, "chat.send", map[string]any{})); fe.Message != "unknown method: chat.send" || fe.Code != "INVALID_REQUEST" {
			t.Fatalf("got %+v", fe)
		}
		if fe := failure(t, must(c.Connect(ctxT(t), gwtest.OperatorParams(tokAdmin)))); fe.Message != "connect is only valid as the first request" {
			t.Fatalf("got %+v", fe)
		}
		if err := c.SendRaw(ctxT(t), []byte(`{"type":"req","method":"node.list"}`)); err != nil {
			t.Fatal(err)
		}
		// The answer to a frame without id is addressed to "invalid".
		payload[map[string]any](t, call(t, c, "health", nil)) // the socket is still open
	})
	t.Run("node role gating and flood guard", func(t *testing.T) {
		h, _, err := gwtest.ConnectNodeHost(ctxT(t), gw.URL(), gwtest.NodeParams(tokAdmin, "n", "system.which"), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer h.CloseNow()
		for i := 0; i < 11; i++ {
			fe := failure(t, call(t, h.Client, "node.list", map[string]any{}))
			if fe.Message != "unauthorized role: node" {
				t.Fatalf("got %+v", fe)
			}
		}
		if code, reason, _ := h.CloseStatus(waitFor); code != 1008 || reason != "repeated unauthorized calls" {
			t.Fatalf("closed with %d %q", code, reason)
		}
	})
}

// denyTools is a test Authorizer: it denies the listed tools with a rule.
type denyTools struct {
	mu    sync.Mutex
	tools map[string]string // tool -> rule id
	seen  []access.Request
}

func (d *denyTools) Authorize(_ context.Context, r access.Request) access.Decision {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seen = append(d.seen, r)
	if rule, ok := d.tools[r.Tool]; ok {
		return access.Decision{Allowed: false, RuleID: rule, Reason: "tool is off limits for " + r.Principal.Role}
	}
	return access.Decision{Allowed: true}
}

func (d *denyTools) lastFor(tool string) (access.Request, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := len(d.seen) - 1; i >= 0; i-- {
		if d.seen[i].Tool == tool {
			return d.seen[i], true
		}
	}
	return access.Request{}, false
}

func TestNodeListAndDescribeShowOnlyTheTenantsNodes(t *testing.T) {
	e := newEnv(t)
	authz := &denyTools{tools: map[string]string{"self.reboot": "rule-no-reboot"}}
	gw := e.gateway(func(c *gateway.Config) { c.Authorizer = authz })
	e.putNode(device(tenantAcme, "xz-000000000003", "Zulu", true))
	e.putNode(device(tenantAcme, "xz-000000000002", "alpha", false))
	e.putNode(device(tenantAcme, "xz-000000000001", "Bravo", true))
	e.putNode(device(tenantOther, "xz-0000000000ff", "theirs", true))

	// The replica learns of the records through its KV watcher: wait until
	// it has applied every one, globex's included, so the listing below is
	// complete and its absence from acme's view is isolation, not lag.
	c := operator(t, gw, tokAdmin, "operator.read")
	waitListed(t, c, "xz-000000000003", true)
	waitListed(t, c, "xz-000000000002", false)
	waitListed(t, c, "xz-000000000001", true)
	waitListed(t, operator(t, gw, tokGlobex, "operator.read"), "xz-0000000000ff", true)
	list := payload[nodeList](t, call(t, c, "node.list", map[string]any{}))
	var ids []string
	for _, n := range list.Nodes {
		ids = append(ids, n.NodeID)
	}
	// Connected first, then by name (case-insensitive); globex's node absent.
	if want := []string{"xz-000000000001", "xz-000000000003", "xz-000000000002"}; !slices.Equal(ids, want) {
		t.Fatalf("listed %v, want %v", ids, want)
	}
	n := list.Nodes[0]
	if !slices.Equal(n.Commands, []string{"mcp.tools.call", "mcp.tools.list"}) || !slices.Equal(n.Caps, []string{"mcp"}) || !n.Paired || list.Ts == 0 {
		t.Fatalf("node %+v", n)
	}
	// The tool this principal may not call is hidden; commands stay.
	if len(n.Tools) != 1 || !strings.Contains(string(n.Tools[0]), "set_volume") {
		t.Fatalf("tools %s", n.Tools)
	}
	if list.Nodes[2].ConnectedAtMs != 0 {
		t.Fatal("a disconnected node shows connectedAtMs")
	}

	d := payload[map[string]any](t, call(t, c, "node.describe", map[string]any{"nodeId": "xz-000000000001"}))
	if d["nodeId"] != "xz-000000000001" || d["ts"] == nil || d["displayName"] != "Bravo" ||
		d["transport"] != "mqtt" || d["lastSeenMs"] != float64(1700000005000) {
		t.Fatalf("describe %v", d)
	}
	for _, id := range []string{"xz-0000000000ff", "xz-nope"} {
		if fe := failure(t, call(t, c, "node.describe", map[string]any{"nodeId": id})); fe.Code != "INVALID_REQUEST" || fe.Message != "unknown nodeId" {
			t.Fatalf("describe %s: %+v", id, fe)
		}
	}
	if fe := failure(t, call(t, c, "node.describe", map[string]any{})); fe.Message != "invalid node.describe params: must have required property 'nodeId'" {
		t.Fatalf("got %+v", fe)
	}
}

// recorder is a test Auditor.
type recorder struct {
	mu       sync.Mutex
	all      []gateway.InvokeAudit // outcome records
	attempts []gateway.InvokeAudit // attempt records it accepted
	fail     error                 // returned by AuditInvoke when set
}

func (r *recorder) AuditInvoke(_ context.Context, a gateway.InvokeAudit) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.fail != nil:
	case a.Attempt:
		r.attempts = append(r.attempts, a)
	default:
		r.all = append(r.all, a)
	}
	return r.fail
}

func (r *recorder) failWith(err error) {
	r.mu.Lock()
	r.fail = err
	r.mu.Unlock()
}

// last is the outcome record of the call that arrived last, once every
// accepted attempt has its outcome (a sent call's outcome is recorded after
// its answer, so records need not come in the order of the calls).
func (r *recorder) last() gateway.InvokeAudit {
	eventually.Until(waitFor, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		done := map[string]bool{}
		for _, a := range r.all {
			done[a.CallID] = true
		}
		for _, a := range r.attempts {
			if !done[a.CallID] {
				return false
			}
		}
		return true
	})
	r.mu.Lock()
	defer r.mu.Unlock()
	newest := r.all[0]
	for _, a := range r.all[1:] {
		if a.Time.After(newest.Time) {
			newest = a
		}
	}
	return newest
}

func TestInvokeOutcomes(t *testing.T) {
	e := newEnv(t)
	authz := &denyTools{tools: map[string]string{"self.reboot": "rule-no-reboot"}}
	audit := &recorder{}
	gw := e.gateway(func(c *gateway.Config) { c.Authorizer = authz; c.Auditor = audit })
	const node = "xz-a1b2c3d4e5f6"
	e.putNode(device(tenantAcme, node, "kitchen", true))
	e.putNode(device(tenantAcme, "xz-0000000000aa", "offline", false))
	e.putNode(device(tenantOther, "xz-0000000000bb", "theirs", true))
	release := make(chan struct{})
	defer close(release)
	sh := e.shim(tenantAcme, func(req wire.InvokeRequest, m *nats.Msg) {
		var args struct {
			Name string `json:"name"`
		}
		_ = json.Unmarshal(req.Params, &args)
		switch args.Name {
		case "slow":
			<-release
		case "broken":
			replyFault(m, "DEVICE_ERROR", "volume out of range")
		default:
			echoShim(req, m)
		}
	})
	c := operator(t, gw, tokOperator, "operator.write")
	waitListed(t, c, node, true)
	var inv func(nodeID, command string, params any, extra ...any) gwtest.Frame
	sub := func(name string, f func(t *testing.T)) {
		t.Run(name, func(t *testing.T) {
			inv = func(nodeID, command string, params any, extra ...any) gwtest.Frame {
				p := map[string]any{"nodeId": nodeID, "command": command, "idempotencyKey": newKey()}
				if params != nil {
					p["params"] = params
				}
				for i := 0; i+1 < len(extra); i += 2 {
					p[extra[i].(string)] = extra[i+1]
				}
				return call(t, c, "node.invoke", p)
			}
			f(t)
		})
	}

	sub("success", func(t *testing.T) {
		f := inv(node, "mcp.tools.call", map[string]any{"name": "self.audio_speaker.set_volume", "arguments": map[string]any{"volume": 30}})
		assertNoNull(t, f.Raw)
		got := payload[map[string]any](t, f)
		if got["ok"] != true || got["nodeId"] != node || got["command"] != "mcp.tools.call" {
			t.Fatalf("payload %v", got)
		}
		wantPayload := `{"echo":{"arguments":{"volume":30},"name":"self.audio_speaker.set_volume"}}`
		if b, _ := json.Marshal(got["payload"]); string(b) != wantPayload || got["payloadJSON"] != wantPayload {
			t.Fatalf("payload %s / payloadJSON %v", b, got["payloadJSON"])
		}
		last := sh.last()
		if last.req.NodeID != node || last.header.Get("Xc-Timeout-Ms") == "" || last.req.IdempotencyKey == "" {
			t.Fatalf("shim got %+v %v", last.req, last.header)
		}
		for k := range last.header { // the subject names the tenant
			if k != "Xc-Timeout-Ms" && k != "traceparent" && k != "tracestate" {
				t.Errorf("node.invoke request has header %s: %v", k, last.header)
			}
		}
		// The policy saw the tool and its raw arguments.
		r, ok := authz.lastFor("self.audio_speaker.set_volume")
		if !ok || string(r.Args) != `{"volume":30}` || r.Command != "mcp.tools.call" || r.Principal.ID != "tok_op" {
			t.Fatalf("authorizer saw %+v", r)
		}
		if a := audit.last(); a.Outcome != gateway.OutcomeOK || a.Tool != "self.audio_speaker.set_volume" || a.NodeKind != "xiaozhi" ||
			!a.Decision.Allowed || string(a.Args) != `{"volume":30}` {
			t.Fatalf("audit %+v", a)
		}
	})
	sub("timeout", func(t *testing.T) {
		fe := failure(t, inv(node, "mcp.tools.call", map[string]any{"name": "slow"}, "timeoutMs", 150))
		if fe.Code != "UNAVAILABLE" || fe.Message != "TIMEOUT: node invoke timed out" ||
			string(fe.Details) != `{"nodeError":{"code":"TIMEOUT","message":"node invoke timed out"},"nodeCommandDispatched":true}` {
			t.Fatalf("got %s %q %s", fe.Code, fe.Message, fe.Details)
		}
		if a := audit.last(); a.Outcome != gateway.OutcomeTimeout || a.ErrorCode != "TIMEOUT" {
			t.Fatalf("audit %+v", a)
		}
	})
	sub("device error", func(t *testing.T) {
		fe := failure(t, inv(node, "mcp.tools.call", map[string]any{"name": "broken"}))
		if fe.Code != "UNAVAILABLE" || fe.Message != "DEVICE_ERROR: volume out of range" ||
			string(fe.Details) != `{"nodeError":{"code":"DEVICE_ERROR","message":"volume out of range"},"nodeCommandDispatched":true}` {
			t.Fatalf("got %s %q %s", fe.Code, fe.Message, fe.Details)
		}
	})
	notConnected := `{"code":"NOT_CONNECTED","nodeError":{"code":"NOT_CONNECTED","message":"node not connected"},"nodeCommandDispatched":false}`
	sub("offline node", func(t *testing.T) {
		fe := failure(t, inv("xz-0000000000aa", "mcp.tools.list", nil))
		if fe.Code != "UNAVAILABLE" || fe.Message != "node not connected" || string(fe.Details) != notConnected {
			t.Fatalf("got %s %q %s", fe.Code, fe.Message, fe.Details)
		}
	})
	// Another tenant's node is answered exactly as a node that does not
	// exist, with node.describe's answer.
	for name, id := range map[string]string{"unknown node": "xz-ffffffffffff", "other tenant's node": "xz-0000000000bb"} {
		sub(name, func(t *testing.T) {
			fe := failure(t, inv(id, "mcp.tools.list", nil))
			if fe.Code != "INVALID_REQUEST" || fe.Message != "unknown nodeId" || fe.Details != nil {
				t.Fatalf("got %s %q %s", fe.Code, fe.Message, fe.Details)
			}
			if a := audit.last(); a.Outcome != gateway.OutcomeRejected || a.ErrorCode != "INVALID_REQUEST" || a.NodeID != id {
				t.Fatalf("audit %+v", a)
			}
		})
	}
	sub("timeoutMs 0", func(t *testing.T) {
		n := sh.count()
		fe := failure(t, inv(node, "mcp.tools.call", map[string]any{"name": "self.audio_speaker.set_volume", "arguments": map[string]any{"volume": 9}}, "timeoutMs", 0))
		if fe.Code != "INVALID_REQUEST" || !strings.HasPrefix(fe.Message, "invalid node.invoke params: at /timeoutMs: must be >= 1") {
			t.Fatalf("got %s %q", fe.Code, fe.Message)
		}
		if sh.count() != n {
			t.Fatal("a call with timeoutMs 0 reached the shim")
		}
	})
	sub("no responder", func(t *testing.T) {
		_ = sh.sub.Unsubscribe()
		if err := e.nc.Flush(); err != nil { // the server has dropped the interest
			t.Fatal(err)
		}
		defer e.shim(tenantAcme, echoShim)
		fe := failure(t, inv(node, "mcp.tools.list", nil))
		if fe.Message != "node not connected" || fe.DetailCode() != "NOT_CONNECTED" {
			t.Fatalf("got %+v", fe)
		}
	})
	sub("undeclared command", func(t *testing.T) {
		fe := failure(t, inv(node, "system.run", map[string]any{"command": []string{"ls"}}))
		if fe.Code != "INVALID_REQUEST" || fe.Message != `node command not allowed: the node (platform: esp32) does not support "system.run"` ||
			string(fe.Details) != `{"reason":"command not declared by node","command":"system.run"}` {
			t.Fatalf("got %s %q %s", fe.Code, fe.Message, fe.Details)
		}
		if a := audit.last(); a.Outcome != gateway.OutcomeRejected || a.ErrorCode != "INVALID_REQUEST" {
			t.Fatalf("audit %+v", a)
		}
	})
	sub("policy denial names the rule", func(t *testing.T) {
		n := sh.count()
		fe := failure(t, inv(node, "mcp.tools.call", map[string]any{"name": "self.reboot", "arguments": map[string]any{}}))
		if fe.Code != "FORBIDDEN" ||
			fe.Message != `node command not allowed: tool "self.reboot" (mcp.tools.call) denied by policy rule rule-no-reboot: tool is off limits for operator` ||
			string(fe.Details) != `{"code":"POLICY_DENIED","ruleId":"rule-no-reboot","reason":"tool is off limits for operator","command":"mcp.tools.call","tool":"self.reboot"}` {
			t.Fatalf("got %s %q %s", fe.Code, fe.Message, fe.Details)
		}
		if sh.count() != n {
			t.Fatal("a denied call reached the shim")
		}
		if a := audit.last(); a.Outcome != gateway.OutcomeDenied || a.Decision.RuleID != "rule-no-reboot" || a.ErrorCode != "POLICY_DENIED" {
			t.Fatalf("audit %+v", a)
		}
	})
	sub("bad params and exec approvals", func(t *testing.T) {
		fe := failure(t, call(t, c, "node.invoke", map[string]any{"nodeId": node, "command": "mcp.tools.list"}))
		if fe.Message != "invalid node.invoke params: must have required property 'idempotencyKey'" {
			t.Fatalf("got %+v", fe)
		}
		fe = failure(t, inv(node, "system.execApprovals.get", nil))
		if fe.Message != "node.invoke does not allow system.execApprovals.*; use exec.approvals.node.*" {
			t.Fatalf("got %+v", fe)
		}
	})
	sub("an unaudited call fails closed before the node acts", func(t *testing.T) {
		n := sh.count()
		audit.failWith(errors.New("stream full"))
		defer audit.failWith(nil)
		fe := failure(t, inv(node, "mcp.tools.call", map[string]any{"name": "self.audio_speaker.set_volume", "arguments": map[string]any{"volume": 5}}))
		if fe.Code != "UNAVAILABLE" || fe.Message != "audit unavailable: stream full" {
			t.Fatalf("got %s %q", fe.Code, fe.Message)
		}
		if sh.count() != n {
			t.Fatal("the call reached the shim without an audit record")
		}
	})
	sub("a sent call is recorded as attempt, then outcome", func(t *testing.T) {
		f := inv(node, "mcp.tools.call", map[string]any{"name": "self.audio_speaker.set_volume", "arguments": map[string]any{"volume": 7}})
		payload[map[string]any](t, f)
		out := audit.last()
		audit.mu.Lock()
		att := audit.attempts[len(audit.attempts)-1]
		audit.mu.Unlock()
		if att.CallID != out.CallID || att.Outcome != "" || !att.Decision.Allowed || att.Tool != "self.audio_speaker.set_volume" ||
			string(att.Args) != `{"volume":7}` || att.RequestID != out.RequestID || att.TraceID != out.TraceID {
			t.Fatalf("attempt %+v, outcome %+v", att, out)
		}
		if out.Outcome != gateway.OutcomeOK || out.Attempt {
			t.Fatalf("outcome %+v", out)
		}
	})
}

func TestNodeHostResultRules(t *testing.T) {
	e := newEnv(t)
	gw := e.gateway(nil)
	_, priv, _ := ed25519.GenerateKey(nil)
	h, _, err := gwtest.ConnectNodeHost(ctxT(t), gw.URL(), gwtest.NodeParams(tokAdmin, "n", "system.which"), priv, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.CloseNow()
	late := payload[map[string]any](t, call(t, h.Client, "node.invoke.result", map[string]any{"id": "no-such-invoke", "nodeId": h.NodeID, "ok": true, "payloadJSON": "{}"}))
	if late["ok"] != true || late["ignored"] != true {
		t.Fatalf("late result answered %v", late)
	}
	fe := failure(t, call(t, h.Client, "node.invoke.result", map[string]any{"id": "x", "nodeId": "someone-else", "ok": true}))
	if fe.Message != "nodeId mismatch" {
		t.Fatalf("got %+v", fe)
	}
	fe = failure(t, call(t, h.Client, "node.invoke.result", map[string]any{"id": "x", "nodeId": h.NodeID}))
	if fe.Message != "invalid node.invoke.result params: must have required property 'ok'" {
		t.Fatalf("got %+v", fe)
	}
}
