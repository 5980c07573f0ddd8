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
)

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
		got, err := m.AddUpstream(ctx, "acme", tenancy.UpstreamSpec{Name: "lab", URL: "wss://gw.example:18789",
			Password: "pw-secret", InsecureSkipVerify: true,
			Publish: tenancy.Publish{Mode: tenancy.PublishNodes, Nodes: []string{"xz-b", "xz-a", "xz-b"}}})
		if err != nil {
			t.Fatal(err)
		}
		if version(t, s, "acme") != v+1 {
			t.Fatal("adding an upstream did not bump the tenant's version")
		}
		if _, err := m.AddUpstream(ctx, "acme", tenancy.UpstreamSpec{Name: "lab", URL: "ws://x", Token: "t"}); !errors.Is(err, tenancy.ErrConflict) {
			t.Fatalf("duplicate name: %v", err)
		}
		if _, err := m.AddUpstream(ctx, "nope", tenancy.UpstreamSpec{Name: "lab", URL: "ws://x", Token: "t"}); !errors.Is(err, tenancy.ErrNotFound) {
			t.Fatalf("unknown tenant: %v", err)
		}
		if _, err := m.AddUpstream(ctx, "acme", tenancy.UpstreamSpec{Name: "home", URL: "ws://127.0.0.1:18789", Token: "tok-secret"}); err != nil {
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
