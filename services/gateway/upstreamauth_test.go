package gateway_test

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/xiaoclaw/xiaoclaw/pkg/policy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy/tenancytest"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway"
)

// An upstream's caller token is the principal upstream:<name>; removing the
// upstream closes the connections that use it.
func TestRemovedUpstreamLosesItsConnection(t *testing.T) {
	e := newEnv(t)
	store := tenancytest.SQLite(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	mgr, err := tenancy.NewManager(tenancy.ManagerConfig{Store: store, CheckRule: policy.CheckRule, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := mgr.CreateTenant(ctx, tenancy.TenantSpec{ID: tenantAcme}); err != nil {
		t.Fatal(err)
	}
	_, callerKeep, err := mgr.AddUpstream(ctx, tenantAcme, tenancy.UpstreamSpec{Name: "keep", URL: "ws://gw:1", Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	_, callerLab, err := mgr.AddUpstream(ctx, tenantAcme, tenancy.UpstreamSpec{Name: "lab", URL: "ws://gw:1", Token: "t"})
	if err != nil {
		t.Fatal(err)
	}
	auth := tenancy.NewOperatorAuth(store, tenancy.CacheConfig{}, quiet)
	gw := e.gateway(func(c *gateway.Config) { c.Auth = auth })
	lab := operator(t, gw, callerLab, "operator.read")
	kept := operator(t, gw, callerKeep, "operator.read")

	if err := mgr.RemoveUpstream(ctx, tenantAcme, "lab"); err != nil {
		t.Fatal(err)
	}
	gw.TenancyChanged(wire.TenancyChange{Tenant: tenantAcme, Kind: wire.ChangeUpstream, ID: "lab"})
	if code, reason, _ := lab.CloseStatus(waitFor); code != 4001 || reason != "gateway auth changed" {
		t.Fatalf("the removed upstream's connection closed with %d %q", code, reason)
	}
	payload[map[string]any](t, call(t, kept, "health", nil))
}
