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

// Every flag falls back to XIAOCLAW_<FLAG>, typed like the flag, and
// XIAOCLAW_OPERATOR_TOKEN takes a comma-separated list.
func TestRunReadsFlagsFromTheEnvironment(t *testing.T) {
	for _, c := range []struct{ name, value, want string }{
		{"XIAOCLAW_IDEMPOTENCY_REPLICAS", "9", "want 1 to 5"},
		{"XIAOCLAW_IDEMPOTENCY_TTL", "10ms", "want at least 1s"},
		{"XIAOCLAW_HANDSHAKE_TIMEOUT", "soon", "XIAOCLAW_HANDSHAKE_TIMEOUT"},
		{"XIAOCLAW_MCP", "maybe", "XIAOCLAW_MCP"},
		{"XIAOCLAW_OPERATOR_TOKEN", "acme=t1,acme:root=t2", "unknown role"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv(c.name, c.value)
			err := run([]string{"--nats-url", "nats://127.0.0.1:1", "--log-format", "text"})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%s=%s: %v, want an error with %q", c.name, c.value, err, c.want)
			}
		})
	}
}
