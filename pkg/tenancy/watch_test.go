package tenancy_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed/natsembedtest"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy/tenancytest"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

func startWatcher(t *testing.T, w *tenancy.Watcher) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var runErr error
	go func() { runErr = w.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		if runErr != nil {
			t.Errorf("watcher: %v", runErr)
		}
	})
	select {
	case <-w.Ready():
	case <-done:
		t.Fatalf("watcher stopped before it was ready")
	case <-time.After(5 * time.Second):
		t.Fatal("watcher not ready")
	}
}

// TestRevocationReachesAnotherReplica: an admin on replica A revokes a
// token and suspends a tenant; replica B, which has both cached, refuses
// them (the test logs how soon), and its re-check hook sees the new state.
func TestRevocationReachesAnotherReplica(t *testing.T) {
	ctx := context.Background()
	srv := natsembedtest.Start(t)
	ncA := natsembedtest.Connect(t, srv, "replica-a")
	ncB := natsembedtest.Connect(t, srv, "replica-b")

	store := tenancytest.SQLite(t)
	mgr, err := tenancy.NewManager(tenancy.ManagerConfig{Store: store, CheckRule: acceptRule, Log: quiet, Notify: tenancy.NATSNotifier(ncA)})
	if err != nil {
		t.Fatal(err)
	}
	opsB := tenancy.NewOperatorAuth(store, tenancy.CacheConfig{}, quiet)
	devsB, _ := tenancy.NewDeviceAuth(store, tenancy.DeviceAuthConfig{}, quiet)
	var mu sync.Mutex
	var rechecks []error
	live := access.Principal{}
	recheck := tenancy.ChangeFunc(func(c wire.TenancyChange) {
		mu.Lock()
		defer mu.Unlock()
		if c.Tenant == live.Tenant {
			rechecks = append(rechecks, opsB.Recheck(ctx, live))
		}
	})
	startWatcher(t, tenancy.NewWatcher(ncB, tenancy.WatcherConfig{Store: store}, quiet, opsB, devsB, recheck))

	for _, id := range []string{"acme", "beta"} {
		if _, err := mgr.CreateTenant(ctx, tenancy.TenantSpec{ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	_, secret, _ := mgr.IssueToken(ctx, "acme", tenancy.TokenSpec{Role: access.RoleOperator})
	_, betaSecret, _ := mgr.IssueToken(ctx, "beta", tenancy.TokenSpec{Role: access.RoleOperator})
	p, err := opsB.AuthenticateOperator(ctx, secret)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := opsB.AuthenticateOperator(ctx, betaSecret); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	live = p
	mu.Unlock()

	if _, err := mgr.RevokeToken(ctx, "acme", p.ID); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	eventually.True(t, "revocation on replica B", func() bool {
		_, err := opsB.AuthenticateOperator(ctx, secret)
		return errors.Is(err, access.ErrUnauthenticated)
	})
	t.Logf("revocation reached replica B in %s", time.Since(start))
	eventually.True(t, "re-check hook", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(rechecks) > 0 && errors.Is(rechecks[len(rechecks)-1], access.ErrUnauthenticated)
	})

	if _, err := mgr.SuspendTenant(ctx, "beta"); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "suspension on replica B", func() bool {
		_, err := opsB.AuthenticateOperator(ctx, betaSecret)
		return errors.Is(err, access.ErrUnauthenticated)
	})
}

// TestResyncCatchesMissedNotifications: a change written without any
// notification still reaches a replica, through the version poll.
func TestResyncCatchesMissedNotifications(t *testing.T) {
	ctx := context.Background()
	srv := natsembedtest.Start(t)
	nc := natsembedtest.Connect(t, srv, "replica")
	store := tenancytest.SQLite(t)
	silent, _ := tenancy.NewManager(tenancy.ManagerConfig{Store: store, CheckRule: acceptRule, Log: quiet})
	if _, err := silent.CreateTenant(ctx, tenancy.TenantSpec{ID: "acme"}); err != nil {
		t.Fatal(err)
	}
	rec, secret, _ := silent.IssueToken(ctx, "acme", tenancy.TokenSpec{Role: access.RoleOperator})
	ops := tenancy.NewOperatorAuth(store, tenancy.CacheConfig{}, quiet)
	startWatcher(t, tenancy.NewWatcher(nc, tenancy.WatcherConfig{Store: store, ResyncInterval: 50 * time.Millisecond}, quiet, ops))
	if _, err := ops.AuthenticateOperator(ctx, secret); err != nil {
		t.Fatal(err)
	}
	if _, err := silent.RevokeToken(ctx, "acme", rec.ID); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "resync", func() bool {
		_, err := ops.AuthenticateOperator(ctx, secret)
		return errors.Is(err, access.ErrUnauthenticated)
	})
}
