package gateway_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway"
)

// fixedLimits serves one tenant's limits and counts the lookups.
type fixedLimits struct {
	mu     sync.Mutex
	limits map[string]wire.InflightLimits
}

func (f *fixedLimits) InflightLimits(_ context.Context, tenant string) (wire.InflightLimits, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.limits[tenant], nil
}

// The gateway sends the tenant's limits to the shim, and turns the shim's
// refusal into a retryable error with the retry hint; the idempotency key
// stays free, so the retry reaches the shim again.
func TestInvokeLimitsAndRefusals(t *testing.T) {
	e := newEnv(t)
	audit := &recorder{}
	limits := &fixedLimits{limits: map[string]wire.InflightLimits{tenantAcme: {Tenant: 200, Device: 4}}}
	gw := e.gateway(func(c *gateway.Config) { c.Auditor = audit; c.Limits = limits })
	const node = "xz-a1b2c3d4e5f6"
	e.putNode(device(tenantAcme, node, "kitchen", true))
	var mu sync.Mutex
	refuse := true
	sh := e.shim(tenantAcme, func(req wire.InvokeRequest, m *nats.Msg) {
		mu.Lock()
		r := refuse
		mu.Unlock()
		if !r {
			echoShim(req, m)
			return
		}
		reply(m, wire.InvokeReply{Error: &wire.Fault{Code: wire.FaultRateLimited,
			Message: "tenant has 200 invokes in flight, its limit on this shim replica",
			Details: json.RawMessage(`{"limit":"tenant","max":200,"retryAfterMs":1000}`)}})
	})
	c := operator(t, gw, tokOperator, "operator.write")
	waitListed(t, c, node, true)

	params := map[string]any{"nodeId": node, "command": "mcp.tools.call", "idempotencyKey": newKey(),
		"params": map[string]any{"name": "self.get_device_status"}}
	fe := failure(t, call(t, c, "node.invoke", params))
	if got := sh.last().header.Get(wire.HeaderInflightLimits); got != "200,4" {
		t.Errorf("shim got %s %q, want \"200,4\"", wire.HeaderInflightLimits, got)
	}
	if fe.Code != "UNAVAILABLE" || fe.Message != "RATE_LIMITED: tenant has 200 invokes in flight, its limit on this shim replica" ||
		!fe.Retryable || fe.RetryAfterMs != 1000 {
		t.Fatalf("got %+v", fe)
	}
	want := `{"code":"RATE_LIMITED","nodeError":{"code":"RATE_LIMITED","message":"tenant has 200 invokes in flight, its limit on this shim replica"},` +
		`"nodeCommandDispatched":false,"limit":"tenant","max":200,"retryAfterMs":1000}`
	if string(fe.Details) != want {
		t.Fatalf("details\n got %s\nwant %s", fe.Details, want)
	}
	if a := audit.last(); a.Outcome != gateway.OutcomeError || a.ErrorCode != wire.FaultRateLimited {
		t.Fatalf("audit %+v", a)
	}

	// The retry with the same key runs.
	mu.Lock()
	refuse = false
	mu.Unlock()
	f := call(t, c, "node.invoke", params)
	if !f.OK {
		t.Fatalf("retry with the same key: %+v", f.Error)
	}
	if sh.count() != 2 {
		t.Fatalf("shim saw %d calls, want 2", sh.count())
	}

	// A tenant with the default limits adds no header.
	limits.mu.Lock()
	limits.limits = nil
	limits.mu.Unlock()
	params["idempotencyKey"] = newKey()
	if f := call(t, c, "node.invoke", params); !f.OK {
		t.Fatalf("call: %+v", f.Error)
	}
	if h := sh.last().header; h.Get(wire.HeaderInflightLimits) != "" {
		t.Fatalf("default limits sent a header: %v", h)
	}
}
