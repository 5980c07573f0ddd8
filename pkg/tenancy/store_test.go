package tenancy_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/migrations"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy/tenancytest"
)

// The conformance suite: every test here runs against SQLite and
// PostgreSQL through the same Store interface.

var t0 = time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)

func mustTenant(t *testing.T, s tenancy.Store, id string) {
	t.Helper()
	if err := s.CreateTenant(context.Background(), tenancy.Tenant{ID: id, Status: tenancy.StatusActive,
		DefaultEffect: tenancy.EffectAllow, CreatedAt: t0}); err != nil {
		t.Fatalf("create tenant %s: %v", id, err)
	}
}

func version(t *testing.T, s tenancy.Store, id string) int64 {
	t.Helper()
	tn, err := s.Tenant(context.Background(), id)
	if err != nil {
		t.Fatalf("tenant %s: %v", id, err)
	}
	return tn.Version
}

func TestStoreTenants(t *testing.T) {
	tenancytest.Each(t, func(t *testing.T, s *tenancy.SQLStore) {
		ctx := context.Background()
		mustTenant(t, s, "beta")
		mustTenant(t, s, "acme")
		err := s.CreateTenant(ctx, tenancy.Tenant{ID: "acme", Status: tenancy.StatusActive, DefaultEffect: tenancy.EffectAllow, CreatedAt: t0})
		if !errors.Is(err, tenancy.ErrConflict) {
			t.Fatalf("duplicate tenant: got %v, want ErrConflict", err)
		}
		list, err := s.Tenants(ctx)
		if err != nil || len(list) != 2 || list[0].ID != "acme" || list[1].ID != "beta" {
			t.Fatalf("tenants = %+v, %v", list, err)
		}
		a := list[0]
		if a.Status != tenancy.StatusActive || a.DefaultEffect != tenancy.EffectAllow || a.DeviceAllowlist || !a.CreatedAt.Equal(t0) || a.Version != 1 {
			t.Fatalf("tenant = %+v", a)
		}
		susp, deny := tenancy.StatusSuspended, tenancy.EffectDeny
		u, err := s.UpdateTenant(ctx, "acme", tenancy.TenantUpdate{Status: &susp, DefaultEffect: &deny}, t0.Add(time.Minute))
		if err != nil || u.Status != susp || u.DefaultEffect != deny || u.Version != 2 {
			t.Fatalf("update = %+v, %v", u, err)
		}
		got, _ := s.Tenant(ctx, "acme")
		if got.Status != susp || got.DefaultEffect != deny || !got.UpdatedAt.Equal(t0.Add(time.Minute)) {
			t.Fatalf("after update = %+v", got)
		}
		if got.RequireToolApproval {
			t.Fatal("a new tenant requires tool approval")
		}
		on := true
		if u, err := s.UpdateTenant(ctx, "beta", tenancy.TenantUpdate{RequireToolApproval: &on}, t0); err != nil || !u.RequireToolApproval {
			t.Fatalf("require tool approval: %+v %v", u, err)
		}
		if got, _ := s.Tenant(ctx, "beta"); !got.RequireToolApproval || got.DefaultEffect != tenancy.EffectAllow {
			t.Fatalf("after requiring tool approval: %+v", got)
		}
		if _, err := s.Tenant(ctx, "nope"); !errors.Is(err, tenancy.ErrNotFound) {
			t.Fatalf("unknown tenant: %v", err)
		}
		if _, err := s.UpdateTenant(ctx, "nope", tenancy.TenantUpdate{Status: &susp}, t0); !errors.Is(err, tenancy.ErrNotFound) {
			t.Fatalf("update unknown tenant: %v", err)
		}
		v, err := s.TenantVersions(ctx)
		if err != nil || v["acme"] != 2 || v["beta"] != 2 || len(v) != 2 {
			t.Fatalf("versions = %v, %v", v, err)
		}
	})
}

func TestStoreTenantLimits(t *testing.T) {
	tenancytest.Each(t, func(t *testing.T, s *tenancy.SQLStore) {
		ctx := context.Background()
		mustTenant(t, s, "acme")
		if got, _ := s.Tenant(ctx, "acme"); got.Limits != (tenancy.Limits{}) {
			t.Fatalf("new tenant limits = %+v, want defaults", got.Limits)
		}
		n, d := 200, 4
		u, err := s.UpdateTenant(ctx, "acme", tenancy.TenantUpdate{MaxInflight: &n, MaxInflightPerDevice: &d}, t0)
		if err != nil || u.Limits != (tenancy.Limits{MaxInflight: 200, MaxInflightPerDevice: 4}) || u.Version != 2 {
			t.Fatalf("update = %+v, %v", u, err)
		}
		name := "Acme"
		if _, err := s.UpdateTenant(ctx, "acme", tenancy.TenantUpdate{DisplayName: &name}, t0); err != nil {
			t.Fatal(err)
		}
		if got, _ := s.Tenant(ctx, "acme"); got.Limits != (tenancy.Limits{MaxInflight: 200, MaxInflightPerDevice: 4}) {
			t.Fatalf("limits after another change = %+v", got.Limits)
		}
		zero := 0
		if _, err := s.UpdateTenant(ctx, "acme", tenancy.TenantUpdate{MaxInflight: &zero}, t0); err != nil {
			t.Fatal(err)
		}
		list, err := s.Tenants(ctx)
		if err != nil || len(list) != 1 || list[0].Limits != (tenancy.Limits{MaxInflightPerDevice: 4}) {
			t.Fatalf("tenants = %+v, %v", list, err)
		}
		// The database refuses a negative limit even past the manager.
		neg := -3
		if _, err := s.UpdateTenant(ctx, "acme", tenancy.TenantUpdate{MaxInflight: &neg}, t0); err == nil {
			t.Fatal("store accepted a negative limit")
		}
		if got, _ := s.Tenant(ctx, "acme"); got.Limits != (tenancy.Limits{MaxInflightPerDevice: 4}) || got.Version != 4 {
			t.Fatalf("refused update changed the tenant: %+v", got)
		}
	})
}

func TestStoreTokens(t *testing.T) {
	tenancytest.Each(t, func(t *testing.T, s *tenancy.SQLStore) {
		ctx := context.Background()
		mustTenant(t, s, "acme")
		mustTenant(t, s, "beta")
		tok := tenancy.Token{ID: "tok_aaaaaaaaaaaaaaaa", Tenant: "acme", Name: "ci", Role: "operator",
			SecretHash: "ab12", CreatedAt: t0, ExpiresAt: t0.Add(time.Hour)}
		if err := s.CreateToken(ctx, tok); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateToken(ctx, tok); !errors.Is(err, tenancy.ErrConflict) {
			t.Fatalf("duplicate token id: %v", err)
		}
		if err := s.CreateToken(ctx, tenancy.Token{ID: "tok_bbbbbbbbbbbbbbbb", Tenant: "ghost", Role: "viewer", SecretHash: "x", CreatedAt: t0}); !errors.Is(err, tenancy.ErrNotFound) {
			t.Fatalf("token of unknown tenant: %v", err)
		}
		got, err := s.Token(ctx, tok.ID)
		if err != nil || got != tok {
			t.Fatalf("token = %+v, %v; want %+v", got, err, tok)
		}
		if version(t, s, "acme") != 2 {
			t.Fatal("creating a token did not bump the tenant version")
		}
		if l, _ := s.Tokens(ctx, "beta"); len(l) != 0 {
			t.Fatalf("beta sees acme's tokens: %+v", l)
		}
		// Another tenant cannot revoke it, and the token stays usable.
		if _, err := s.RevokeToken(ctx, "beta", tok.ID, t0); !errors.Is(err, tenancy.ErrNotFound) {
			t.Fatalf("cross-tenant revoke: %v", err)
		}
		if got, _ := s.Token(ctx, tok.ID); !got.RevokedAt.IsZero() {
			t.Fatal("cross-tenant revoke changed the token")
		}
		r, err := s.RevokeToken(ctx, "acme", tok.ID, t0.Add(time.Minute))
		if err != nil || !r.RevokedAt.Equal(t0.Add(time.Minute)) || r.Usable(t0.Add(2*time.Minute)) {
			t.Fatalf("revoke = %+v, %v", r, err)
		}
		r, err = s.RevokeToken(ctx, "acme", tok.ID, t0.Add(time.Hour))
		if err != nil || !r.RevokedAt.Equal(t0.Add(time.Minute)) {
			t.Fatalf("second revoke = %+v, %v; the first time must stay", r, err)
		}
		l, err := s.Tokens(ctx, "acme")
		if err != nil || len(l) != 1 || l[0].RevokedAt.IsZero() {
			t.Fatalf("tokens = %+v, %v", l, err)
		}
		if _, err := s.Token(ctx, "tok_cccccccccccccccc"); !errors.Is(err, tenancy.ErrNotFound) {
			t.Fatalf("unknown token: %v", err)
		}
	})
}

func TestStoreDeviceKeysRotation(t *testing.T) {
	tenancytest.Each(t, func(t *testing.T, s *tenancy.SQLStore) {
		ctx := context.Background()
		mustTenant(t, s, "acme")
		mustTenant(t, s, "beta")
		k1 := tenancy.DeviceKey{ID: "dk_aaaaaaaaaaaaaaaa", Tenant: "acme", Secret: "s1", CreatedAt: t0}
		kb := tenancy.DeviceKey{ID: "dk_bbbbbbbbbbbbbbbb", Tenant: "beta", Secret: "sb", CreatedAt: t0}
		for _, k := range []tenancy.DeviceKey{k1, kb} {
			if err := s.CreateDeviceKey(ctx, k); err != nil {
				t.Fatal(err)
			}
		}
		// A key already retiring sooner than the overlap keeps its time.
		early := tenancy.DeviceKey{ID: "dk_eeeeeeeeeeeeeeee", Tenant: "acme", Secret: "se", CreatedAt: t0, RetireAt: t0.Add(time.Minute)}
		if err := s.CreateDeviceKey(ctx, early); err != nil {
			t.Fatal(err)
		}
		k2 := tenancy.DeviceKey{ID: "dk_cccccccccccccccc", Tenant: "acme", Secret: "s2", CreatedAt: t0.Add(time.Second)}
		retire := t0.Add(time.Hour)
		all, err := s.RotateDeviceKeys(ctx, k2, retire)
		if err != nil || len(all) != 3 {
			t.Fatalf("rotate = %+v, %v", all, err)
		}
		byID := map[string]tenancy.DeviceKey{}
		for _, k := range all {
			byID[k.ID] = k
		}
		if !byID[k1.ID].RetireAt.Equal(retire) || !byID[early.ID].RetireAt.Equal(t0.Add(time.Minute)) || !byID[k2.ID].RetireAt.IsZero() {
			t.Fatalf("retire times after rotation: %+v", byID)
		}
		if !byID[k1.ID].Active(retire.Add(-time.Millisecond)) || byID[k1.ID].Active(retire) {
			t.Fatal("the old key must verify until its retire time and not after")
		}
		if got, err := s.DeviceKey(ctx, kb.ID); err != nil || !got.RetireAt.IsZero() || got.Secret != "sb" {
			t.Fatalf("rotation of acme touched beta's key: %+v, %v", got, err)
		}
		if l, _ := s.DeviceKeys(ctx, "beta"); len(l) != 1 {
			t.Fatalf("beta keys = %+v", l)
		}
		if _, err := s.RotateDeviceKeys(ctx, tenancy.DeviceKey{ID: "dk_dddddddddddddddd", Tenant: "ghost", Secret: "x", CreatedAt: t0}, retire); !errors.Is(err, tenancy.ErrNotFound) {
			t.Fatalf("rotate unknown tenant: %v", err)
		}
		if _, err := s.DeviceKey(ctx, "dk_dddddddddddddddd"); !errors.Is(err, tenancy.ErrNotFound) {
			t.Fatalf("failed rotation left a key: %v", err)
		}
	})
}

func TestStoreAllowlist(t *testing.T) {
	tenancytest.Each(t, func(t *testing.T, s *tenancy.SQLStore) {
		ctx := context.Background()
		mustTenant(t, s, "acme")
		mustTenant(t, s, "beta")
		if err := s.SetAllowlist(ctx, "acme", true, []string{"bbb", "aaa", "bbb"}, t0); err != nil {
			t.Fatal(err)
		}
		on, list, err := s.Allowlist(ctx, "acme")
		if err != nil || !on || !slices.Equal(list, []string{"aaa", "bbb"}) {
			t.Fatalf("allowlist = %v %v %v", on, list, err)
		}
		if tn, _ := s.Tenant(ctx, "acme"); !tn.DeviceAllowlist {
			t.Fatal("tenant does not show its allowlist as enabled")
		}
		if on, list, _ := s.Allowlist(ctx, "beta"); on || len(list) != 0 {
			t.Fatalf("beta allowlist = %v %v", on, list)
		}
		if err := s.SetAllowlist(ctx, "acme", false, []string{"ccc"}, t0); err != nil {
			t.Fatal(err)
		}
		if on, list, _ := s.Allowlist(ctx, "acme"); on || !slices.Equal(list, []string{"ccc"}) {
			t.Fatalf("replaced allowlist = %v %v", on, list)
		}
		if err := s.SetAllowlist(ctx, "ghost", true, nil, t0); !errors.Is(err, tenancy.ErrNotFound) {
			t.Fatalf("allowlist of unknown tenant: %v", err)
		}
	})
}

func TestStoreRulesAndGroups(t *testing.T) {
	tenancytest.Each(t, func(t *testing.T, s *tenancy.SQLStore) {
		ctx := context.Background()
		mustTenant(t, s, "acme")
		mustTenant(t, s, "beta")
		r1 := tenancy.Rule{ID: "rul_aaaaaaaaaaaaaaaa", Tenant: "acme", Effect: "deny", Subject: "*", Object: "xz-*",
			Action: "mcp.tools.call:self.audio_speaker.set_volume", When: "volume > 60", Description: "loud", CreatedAt: t0}
		r2 := tenancy.Rule{ID: "rul_bbbbbbbbbbbbbbbb", Tenant: "acme", Effect: "allow", Subject: "role:operator", Object: "*",
			Action: "*", CreatedAt: t0.Add(time.Second)}
		for _, r := range []tenancy.Rule{r2, r1} { // insertion order is by time, not call order
			if err := s.AddRule(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.AddRule(ctx, r1); !errors.Is(err, tenancy.ErrConflict) {
			t.Fatalf("duplicate rule: %v", err)
		}
		rules, err := s.Rules(ctx, "acme")
		if err != nil || len(rules) != 2 || rules[0] != r1 || rules[1] != r2 {
			t.Fatalf("rules = %+v, %v", rules, err)
		}
		if l, _ := s.Rules(ctx, "beta"); len(l) != 0 {
			t.Fatalf("beta sees acme's rules: %+v", l)
		}
		if err := s.RemoveRule(ctx, "beta", r1.ID, t0); !errors.Is(err, tenancy.ErrNotFound) {
			t.Fatalf("cross-tenant remove: %v", err)
		}
		before := version(t, s, "acme")
		if err := s.RemoveRule(ctx, "acme", r1.ID, t0); err != nil {
			t.Fatal(err)
		}
		if version(t, s, "acme") != before+1 {
			t.Fatal("removing a rule did not bump the version")
		}
		if rules, _ := s.Rules(ctx, "acme"); len(rules) != 1 || rules[0].ID != r2.ID {
			t.Fatalf("rules after remove = %+v", rules)
		}
		if err := s.RemoveRule(ctx, "acme", r1.ID, t0); !errors.Is(err, tenancy.ErrNotFound) {
			t.Fatalf("second remove: %v", err)
		}

		if err := s.SetGroup(ctx, "acme", "kitchen", []string{"xz-2", "xz-1", "xz-1"}, t0); err != nil {
			t.Fatal(err)
		}
		if err := s.SetGroup(ctx, "beta", "kitchen", []string{"xz-9"}, t0); err != nil {
			t.Fatal(err)
		}
		g, err := s.Groups(ctx, "acme")
		if err != nil || len(g) != 1 || !slices.Equal(g["kitchen"], []string{"xz-1", "xz-2"}) {
			t.Fatalf("groups = %v, %v", g, err)
		}
		if err := s.SetGroup(ctx, "acme", "kitchen", nil, t0); err != nil {
			t.Fatal(err)
		}
		if g, _ := s.Groups(ctx, "acme"); len(g) != 0 {
			t.Fatalf("emptied group still listed: %v", g)
		}
		if g, _ := s.Groups(ctx, "beta"); !slices.Equal(g["kitchen"], []string{"xz-9"}) {
			t.Fatalf("beta's group changed: %v", g)
		}
	})
}

func TestMigrationsUpDownUp(t *testing.T) {
	tenancytest.Each(t, func(t *testing.T, s *tenancy.SQLStore) {
		ctx := context.Background()
		d := migrations.SQLite
		if _, err := s.DB().ExecContext(ctx, `SELECT pg_backend_pid()`); err == nil {
			d = migrations.Postgres
		}
		if applied, err := migrations.Up(ctx, s.DB(), d); err != nil || len(applied) != 0 {
			t.Fatalf("second Up applied %v, %v; want nothing", applied, err)
		}
		if err := migrations.Down(ctx, s.DB(), d, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Tenants(ctx); err == nil {
			t.Fatal("tenants table survived Down to 0")
		}
		if applied, err := migrations.Up(ctx, s.DB(), d); err != nil || len(applied) == 0 || applied[0] != 1 {
			t.Fatalf("Up after Down applied %v, %v", applied, err)
		}
		mustTenant(t, s, "acme")
	})
}
