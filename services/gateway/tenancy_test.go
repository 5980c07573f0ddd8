package gateway_test

import (
	"context"
	"sync"
	"testing"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/gwtest"
)

// revocable wraps the test tokens with a revocation list.
type revocable struct {
	mu      sync.Mutex
	revoked map[string]bool
}

func (r *revocable) AuthenticateOperator(ctx context.Context, token string) (access.Principal, error) {
	r.mu.Lock()
	gone := r.revoked[token]
	r.mu.Unlock()
	if gone {
		return access.Principal{}, access.ErrUnauthenticated
	}
	return testTokens.AuthenticateOperator(ctx, token)
}

func TestRevokedTokenLosesItsLiveConnections(t *testing.T) {
	e := newEnv(t)
	auth := &revocable{revoked: map[string]bool{}}
	gw := e.gateway(func(c *gateway.Config) { c.Auth = auth })
	revokedOp := operator(t, gw, tokOperator, "operator.read")
	keptOp := operator(t, gw, tokAdmin, "operator.read")
	node, _, err := gwtest.ConnectNodeHost(ctxT(t), gw.URL(), gwtest.NodeParams(tokOperator, "n", "system.which"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer node.CloseNow()
	other := operator(t, gw, tokGlobex, "operator.read")

	auth.mu.Lock()
	auth.revoked[tokOperator] = true
	auth.mu.Unlock()
	gw.TenancyChanged(wire.TenancyChange{Tenant: tenantAcme, Kind: wire.ChangeToken, ID: "tok_op"})

	for _, c := range []*gwtest.Client{revokedOp, node.Client} {
		if code, reason, _ := c.CloseStatus(waitFor); code != 4001 || reason != "gateway auth changed" {
			t.Fatalf("closed with %d %q", code, reason)
		}
	}
	// Connections with valid tokens, and other tenants, are untouched.
	payload[map[string]any](t, call(t, keptOp, "health", nil))
	payload[map[string]any](t, call(t, other, "health", nil))
	// A policy change re-checks nothing.
	gw.TenancyChanged(wire.TenancyChange{Tenant: tenantAcme, Kind: wire.ChangeRule, ID: "r1"})
	payload[map[string]any](t, call(t, keptOp, "health", nil))
}
