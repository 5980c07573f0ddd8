package main

import (
	"context"
	"strings"
	"testing"

	"github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw/internal/devstack"
	"github.com/xiaoclaw/xiaoclaw/services/shim/upstream"
)

// The banner of xiaoclaw dev names an upstream only when --upstream-url
// configured one (the stack runs an upstream worker for stored upstreams
// either way).
func TestDevBannerNamesTheUpstreamOnlyWhenConfigured(t *testing.T) {
	for _, tc := range []struct {
		name string
		up   upstream.Upstream
		want string // "" for no upstream line
	}{
		{"none", upstream.Upstream{}, ""},
		{"flag", upstream.Upstream{Name: "home", URL: "ws://127.0.0.1:1", Token: "t"},
			"upstream   ws://127.0.0.1:1 publishes every device (policy principal upstream:home)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			st, err := devstack.Start(ctx, devstack.Config{DataDir: t.TempDir(), DeviceToken: "dtok", OperatorToken: "otok",
				Upstream: tc.up})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			var b strings.Builder
			printBanner(&b, st, devCredentials{DeviceToken: "dtok", OperatorToken: "otok"}, &devFlags{dataDir: "/data"})
			got := b.String()
			if tc.want == "" && strings.Contains(got, "upstream ") {
				t.Fatalf("banner names an upstream none configured:\n%s", got)
			}
			if !strings.Contains(got, tc.want) {
				t.Fatalf("banner without %q:\n%s", tc.want, got)
			}
		})
	}
}
