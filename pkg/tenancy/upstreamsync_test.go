package tenancy_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed"
	"github.com/xiaoclaw/xiaoclaw/pkg/policy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy/tenancytest"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// entry reads an upstream's bucket entry; ok is false when there is none.
func entry(t *testing.T, kv jetstream.KeyValue, tenant, name string) (wire.UpstreamEntry, bool) {
	t.Helper()
	e, err := kv.Get(context.Background(), wire.UpstreamKey(tenant, name))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return wire.UpstreamEntry{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	u, err := wire.ParseUpstreamEntry(e.Value())
	if err != nil {
		t.Fatal(err)
	}
	return u, true
}

// The bucket follows the store: an added upstream's entry carries a caller
// token that authenticates as upstream:<name> and that the API never
// returned; a group change renders the entry again; a lost entry comes
// back with a new working token (the old one stops working) from exactly
// one of two gateway replicas; a removed upstream's entry goes.
func TestUpstreamBucketFollowsTheStore(t *testing.T) {
	tenancytest.Each(t, func(t *testing.T, s *tenancy.SQLStore) {
		ctx := context.Background()
		srv, err := natsembed.Start(natsembed.Config{StoreDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
		log := slog.New(slog.DiscardHandler)
		var syncs []*tenancy.UpstreamSync
		for _, name := range []string{"gateway-a", "gateway-b"} {
			nc, err := srv.Connect(name)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(nc.Close)
			js, _ := jetstream.New(nc)
			sy, err := tenancy.NewUpstreamSync(tenancy.UpstreamSyncConfig{Store: s, JS: js,
				ResyncInterval: 100 * time.Millisecond, Grace: time.Second}, log)
			if err != nil {
				t.Fatal(err)
			}
			syncs = append(syncs, sy)
			runCtx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- sy.Run(runCtx) }()
			t.Cleanup(func() { cancel(); <-done })
		}
		mustTenant(t, s, "acme")
		m, err := tenancy.NewManager(tenancy.ManagerConfig{Store: s, CheckRule: policy.CheckRule, Log: log,
			Upstreams: syncs[0], Notify: func(_ context.Context, c wire.TenancyChange) error {
				for _, sy := range syncs {
					sy.TenancyChanged(c)
				}
				return nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		auth := tenancy.NewOperatorAuth(s, tenancy.CacheConfig{}, log)
		nc, _ := srv.Connect("reader")
		t.Cleanup(nc.Close)
		js, _ := jetstream.New(nc)
		kv, err := wire.OpenBucket(ctx, js, wire.UpstreamsBucketConfig())
		if err != nil {
			t.Fatal(err)
		}
		authenticates := func(token string) bool {
			p, err := auth.AuthenticateOperator(ctx, token)
			if err != nil && !errors.Is(err, access.ErrUnauthenticated) {
				t.Fatal(err)
			}
			return err == nil && p.ID == "upstream:lab" && p.Tenant == "acme"
		}

		if err := m.SetGroup(ctx, "acme", "kitchen", []string{"xz-2", "xz-1"}); err != nil {
			t.Fatal(err)
		}
		_, caller, err := m.AddUpstream(ctx, "acme", tenancy.UpstreamSpec{Name: "lab", URL: "ws://gw.example:18789",
			Token: "oc-secret", Publish: tenancy.Publish{Mode: tenancy.PublishGroup, Group: "kitchen"}})
		if err != nil || caller != "" {
			t.Fatalf("add: caller %q, %v (the caller token must stay in the bucket)", caller, err)
		}
		e, ok := entry(t, kv, "acme", "lab") // written before AddUpstream returned
		if !ok || e.Secret != "oc-secret" || e.Auth != wire.UpstreamAuthToken || e.Publish != wire.PublishGroup ||
			!slices.Equal(e.Nodes, []string{"xz-1", "xz-2"}) || !authenticates(e.CallerToken) {
			t.Fatalf("entry %+v present %v", e, ok)
		}
		first := e.CallerToken

		if err := m.SetGroup(ctx, "acme", "kitchen", []string{"xz-3"}); err != nil {
			t.Fatal(err)
		}
		eventually.Within(t, 10*time.Second, "entry rendered with the new members", func() bool {
			e, _ = entry(t, kv, "acme", "lab")
			return slices.Equal(e.Nodes, []string{"xz-3"})
		})
		if e.CallerToken != first {
			t.Fatal("a group change replaced the caller token")
		}

		// The entry is lost (as with a NATS store lost or purged by hand).
		if err := kv.Purge(ctx, wire.UpstreamKey("acme", "lab")); err != nil {
			t.Fatal(err)
		}
		eventually.Within(t, 10*time.Second, "entry recreated with a working token", func() bool {
			e, ok = entry(t, kv, "acme", "lab")
			return ok && e.CallerToken != first && authenticates(e.CallerToken)
		})
		if authenticates(first) {
			t.Fatal("the lost entry's caller token still authenticates")
		}
		if st, _ := kv.Status(ctx); st.Values() != 1 {
			t.Fatalf("bucket holds %d values, want the one entry", st.Values())
		}
		// Both replicas keep running: the token stays (no replica fights
		// over it) through several resyncs.
		for range 5 {
			if err := syncs[1].SyncAll(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if again, _ := entry(t, kv, "acme", "lab"); again.CallerToken != e.CallerToken || !authenticates(e.CallerToken) {
			t.Fatal("the replicas replaced a working caller token")
		}

		// The whole bucket is lost: the next resync creates it again, with
		// the entry and another new token.
		if err := js.DeleteKeyValue(ctx, wire.BucketUpstreams); err != nil {
			t.Fatal(err)
		}
		lost := e.CallerToken
		eventually.Within(t, 10*time.Second, "bucket and entry recreated", func() bool {
			kv, err = js.KeyValue(ctx, wire.BucketUpstreams)
			if err != nil {
				return false
			}
			e, ok = entry(t, kv, "acme", "lab")
			return ok && e.CallerToken != lost && authenticates(e.CallerToken)
		})

		if err := m.RemoveUpstream(ctx, "acme", "lab"); err != nil {
			t.Fatal(err)
		}
		if _, ok := entry(t, kv, "acme", "lab"); ok {
			t.Fatal("a removed upstream's entry is still there")
		}
		// An entry without a stored upstream (its removal's delete lost)
		// goes at the next resync.
		b := []byte(`{"tenant":"acme","name":"gone","url":"ws://x","auth":"token","secret":"s","publish":"all","callerToken":"t"}`)
		if _, err := kv.Put(ctx, wire.UpstreamKey("acme", "gone"), b); err != nil {
			t.Fatal(err)
		}
		eventually.Within(t, 10*time.Second, "orphan entry removed", func() bool {
			_, ok := entry(t, kv, "acme", "gone")
			return !ok
		})
	})
}
