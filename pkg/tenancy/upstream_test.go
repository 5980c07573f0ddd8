package tenancy_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/xiaoclaw/xiaoclaw/pkg/policy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy/tenancytest"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

func wireTenantChange(tenant string) wire.TenancyChange {
	return wire.TenancyChange{Tenant: tenant, Kind: wire.ChangeTenant}
}

func TestStoreUpstreams(t *testing.T) {
	tenancytest.Each(t, func(t *testing.T, s *tenancy.SQLStore) {
		ctx := context.Background()
		mustTenant(t, s, "acme")
		mustTenant(t, s, "beta")
		m, err := tenancy.NewManager(tenancy.ManagerConfig{Store: s, CheckRule: policy.CheckRule,
			Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		v := version(t, s, "acme")
		got, _, err := m.AddUpstream(ctx, "acme", tenancy.UpstreamSpec{Name: "lab", URL: "wss://gw.example:18789",
			Password: "pw-secret", InsecureSkipVerify: true,
			Publish: tenancy.Publish{Mode: tenancy.PublishNodes, Nodes: []string{"xz-b", "xz-a", "xz-b"}}})
		if err != nil {
			t.Fatal(err)
		}
		if version(t, s, "acme") != v+1 {
			t.Fatal("adding an upstream did not bump the tenant's version")
		}
		if _, _, err := m.AddUpstream(ctx, "acme", tenancy.UpstreamSpec{Name: "lab", URL: "ws://x", Token: "t"}); !errors.Is(err, tenancy.ErrConflict) {
			t.Fatalf("duplicate name: %v", err)
		}
		if _, _, err := m.AddUpstream(ctx, "nope", tenancy.UpstreamSpec{Name: "lab", URL: "ws://x", Token: "t"}); !errors.Is(err, tenancy.ErrNotFound) {
			t.Fatalf("unknown tenant: %v", err)
		}
		if _, _, err := m.AddUpstream(ctx, "acme", tenancy.UpstreamSpec{Name: "home", URL: "ws://127.0.0.1:18789", Token: "tok-secret"}); err != nil {
			t.Fatal(err)
		}
		list, err := s.Upstreams(ctx, "acme")
		if err != nil || len(list) != 2 || list[0].Name != "home" || list[1].Name != "lab" {
			t.Fatalf("upstreams = %v, %v", list, err)
		}
		lab := list[1]
		if lab.Auth != tenancy.UpstreamAuthPassword || lab.Secret != "pw-secret" || !lab.InsecureSkipVerify ||
			lab.Publish.Mode != tenancy.PublishNodes || !slices.Equal(lab.Publish.Nodes, []string{"xz-a", "xz-b"}) ||
			!lab.CreatedAt.Equal(got.CreatedAt) {
			t.Fatalf("stored upstream = %+v (secret %q)", lab, lab.Secret)
		}
		if list[0].Publish.Mode != tenancy.PublishAll || list[0].Secret != "tok-secret" || list[0].Auth != tenancy.UpstreamAuthToken {
			t.Fatalf("default publish mode / token: %+v", list[0])
		}
		for _, f := range []string{"%v", "%+v", "%#v", "%s"} {
			if out := fmt.Sprintf(f, lab); strings.Contains(out, "pw-secret") {
				t.Fatalf("%s shows the secret: %s", f, out)
			}
		}
		if other, _ := s.Upstreams(ctx, "beta"); len(other) != 0 {
			t.Fatalf("another tenant sees %v", other)
		}
		if err := m.RemoveUpstream(ctx, "beta", "lab"); !errors.Is(err, tenancy.ErrNotFound) {
			t.Fatalf("removing another tenant's upstream: %v", err)
		}
		if err := m.RemoveUpstream(ctx, "acme", "lab"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Upstream(ctx, "acme", "lab"); !errors.Is(err, tenancy.ErrNotFound) {
			t.Fatalf("removed upstream: %v", err)
		}
	})
}

func TestUpstreamCallerToken(t *testing.T) {
	tenancytest.Each(t, func(t *testing.T, s *tenancy.SQLStore) {
		ctx := context.Background()
		mustTenant(t, s, "acme")
		mustTenant(t, s, "beta")
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		m, err := tenancy.NewManager(tenancy.ManagerConfig{Store: s, CheckRule: policy.CheckRule, Log: quiet})
		if err != nil {
			t.Fatal(err)
		}
		ops := tenancy.NewOperatorAuth(s, tenancy.CacheConfig{}, quiet)
		_, caller, err := m.AddUpstream(ctx, "acme", tenancy.UpstreamSpec{Name: "my_lab-1", URL: "ws://gw:1", Token: "t"})
		if err != nil {
			t.Fatal(err)
		}
		p, err := ops.AuthenticateOperator(ctx, caller)
		if err != nil || p.Tenant != "acme" || p.ID != "upstream:my_lab-1" || p.Role != "operator" {
			t.Fatalf("caller token: %+v %v", p, err)
		}
		if err := ops.Recheck(ctx, p); err != nil {
			t.Fatalf("recheck of a live upstream: %v", err)
		}
		// A caller token names its tenant: moved to another tenant or
		// altered, it is refused.
		forged := strings.Replace(caller, "xcu_acme_", "xcu_beta_", 1)
		tampered := caller[:len(caller)-1] + map[bool]string{true: "b", false: "a"}[strings.HasSuffix(caller, "a")]
		for _, bad := range []string{forged, tampered, "xcu_acme_my_lab-1_", caller + "a"} {
			if _, err := ops.AuthenticateOperator(ctx, bad); err == nil {
				t.Fatalf("%q authenticated", bad)
			}
		}
		susp := tenancy.StatusSuspended
		if _, err := m.UpdateTenant(ctx, "acme", tenancy.TenantUpdate{Status: &susp}); err != nil {
			t.Fatal(err)
		}
		ops.TenancyChanged(wireTenantChange("acme"))
		if _, err := ops.AuthenticateOperator(ctx, caller); err == nil {
			t.Fatal("a suspended tenant's upstream authenticated")
		}
		act := tenancy.StatusActive
		if _, err := m.UpdateTenant(ctx, "acme", tenancy.TenantUpdate{Status: &act}); err != nil {
			t.Fatal(err)
		}
		ops.TenancyChanged(wireTenantChange("acme"))
		if err := m.RemoveUpstream(ctx, "acme", "my_lab-1"); err != nil {
			t.Fatal(err)
		}
		if _, err := ops.AuthenticateOperator(ctx, caller); err == nil {
			t.Fatal("a removed upstream's caller token authenticated")
		}
		if err := ops.Recheck(ctx, p); err == nil {
			t.Fatal("recheck kept a removed upstream's connection")
		}
	})
}

func FuzzParseUpstreamCallerToken(f *testing.F) {
	f.Add("xcu_acme_lab_" + strings.Repeat("a", 52))
	f.Add("xcu_acme_my_lab_" + strings.Repeat("7", 52))
	f.Add("xcu__" + strings.Repeat("a", 52))
	f.Add("xco_abc")
	f.Fuzz(func(t *testing.T, token string) {
		tenant, name, err := tenancy.ParseUpstreamCallerToken(token)
		if err != nil {
			return
		}
		if !tenancy.ValidUpstreamName(name) || tenant == "" || strings.Contains(tenant, "_") ||
			!strings.HasPrefix(token, "xcu_"+tenant+"_"+name+"_") || len(token) != len("xcu_"+tenant+"_"+name+"_")+52 {
			t.Fatalf("%q parsed as tenant %q, name %q", token, tenant, name)
		}
	})
}
