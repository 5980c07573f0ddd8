package main

import (
	"strings"
	"testing"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
)

func TestParseTokens(t *testing.T) {
	got, err := parseTokens([]string{"acme=t1", "acme:viewer=t2", " "})
	if err != nil {
		t.Fatal(err)
	}
	if got["t1"].Tenant != "acme" || got["t1"].Role != access.RoleAdmin || got["t2"].Role != access.RoleViewer || len(got) != 2 {
		t.Fatalf("got %+v", got)
	}
	for in, want := range map[string]string{
		"acme":         "want TENANT=TOKEN",
		"acme=":        "want TENANT=TOKEN",
		"Bad.Tenant=t": "invalid id",
		"acme:root=t":  "unknown role",
	} {
		if _, err := parseTokens([]string{in}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseTokens(%q) = %v, want %q", in, err, want)
		}
	}
	if _, err := parseTokens([]string{"a=t", "b=t"}); err == nil {
		t.Error("accepted the same token for two tenants")
	}
}

func TestRunRefusesWithoutTokens(t *testing.T) {
	t.Setenv("XIAOCLAW_OPERATOR_TOKEN", "")
	err := run([]string{"--nats-url", "nats://127.0.0.1:1", "--log-format", "text"})
	if err == nil || !strings.Contains(err.Error(), "no operator credentials") {
		t.Fatalf("got %v", err)
	}
}
