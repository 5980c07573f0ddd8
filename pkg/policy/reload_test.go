package policy_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed/natsembedtest"
	"github.com/xiaoclaw/xiaoclaw/pkg/policy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy/tenancytest"
)

// TestPolicyChangeReachesOtherReplicas: two gateway replicas share one
// PostgreSQL store and one NATS; a rule added through replica A's manager
// changes replica B's decisions within a second, and so does its removal.
func TestPolicyChangeReachesOtherReplicas(t *testing.T) {
	ctx := context.Background()
	srv := natsembedtest.Start(t)
	store := tenancytest.Postgres(t)

	var engines []*policy.Engine
	var mgr *tenancy.Manager
	for i, name := range []string{"gw-a", "gw-b"} {
		nc := natsembedtest.Connect(t, srv, name)
		e, err := policy.New(policy.Config{Store: store, Log: quiet})
		if err != nil {
			t.Fatal(err)
		}
		w := tenancy.NewWatcher(nc, tenancy.WatcherConfig{Store: store}, quiet, e)
		runCtx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Go(func() {
			if err := w.Run(runCtx); err != nil {
				t.Errorf("watcher: %v", err)
			}
		})
		t.Cleanup(func() { cancel(); wg.Wait() })
		select {
		case <-w.Ready():
		case <-time.After(5 * time.Second):
			t.Fatal("watcher not ready")
		}
		engines = append(engines, e)
		if i == 0 {
			mgr, err = tenancy.NewManager(tenancy.ManagerConfig{Store: store, CheckRule: policy.CheckRule, Log: quiet,
				Notify: tenancy.NATSNotifier(nc)})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := mgr.CreateTenant(ctx, tenancy.TenantSpec{ID: "acme"}); err != nil {
		t.Fatal(err)
	}
	if _, err := mgr.CreateTenant(ctx, tenancy.TenantSpec{ID: "beta"}); err != nil {
		t.Fatal(err)
	}
	req := toolCall(opAlice, "xz-1", setVolume, `{"volume":90}`)
	betaReq := toolCall(access.Principal{Tenant: "beta", ID: opAlice.ID, Role: access.RoleOperator}, "xz-1", setVolume, `{"volume":90}`)
	b := engines[1]
	if d := b.Authorize(ctx, req); !d.Allowed { // compiled and cached on B
		t.Fatalf("before: %+v", d)
	}
	r, err := mgr.AddRule(ctx, tenancy.Rule{Tenant: "acme", Effect: "deny", Subject: "*", Object: "*",
		Action: "mcp.tools.call:" + setVolume, When: "volume > 60"})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for d := b.Authorize(ctx, req); d.Allowed || d.RuleID != r.ID; d = b.Authorize(ctx, req) {
		if time.Since(start) > time.Second {
			t.Fatalf("replica B still decides %+v a second after the rule was added", d)
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("rule reached replica B in %s", time.Since(start))
	if d := b.Authorize(ctx, betaReq); !d.Allowed {
		t.Fatalf("acme's rule changed beta's decision: %+v", d)
	}
	if err := mgr.RemoveRule(ctx, "acme", r.ID); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	for d := b.Authorize(ctx, req); !d.Allowed; d = b.Authorize(ctx, req) {
		if time.Since(start) > time.Second {
			t.Fatalf("replica B still denies a second after the rule was removed: %+v", d)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
