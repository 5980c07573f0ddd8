package admincmd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw/internal/admincmd"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/adminapi"
)

// upstreamCLI runs `xiaoclaw upstream …` with the admin commands under the
// upstream group, as main wires them.
func upstreamCLI(env map[string]string, args ...string) (string, error) {
	root := &cobra.Command{Use: "xiaoclaw", SilenceErrors: true, SilenceUsage: true}
	up := &cobra.Command{Use: "upstream"}
	up.AddCommand(admincmd.UpstreamCommands(func(k string) string { return env[k] })...)
	root.AddCommand(up)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(append([]string{"upstream"}, args...))
	err := root.Execute()
	return out.String(), err
}

func TestUpstreamCLIRoundTrip(t *testing.T) {
	srv, store := server(t)
	ctx := context.Background()
	global := map[string]string{"XIAOCLAW_SERVER": srv.URL, "XIAOCLAW_TOKEN": globalToken}
	if out, err := xiaoclaw(global, "tenant", "create", "acme"); err != nil {
		t.Fatalf("tenant create: %v %s", err, out)
	}
	const secret = "openclaw-gateway-token-42"
	env := map[string]string{"XIAOCLAW_SERVER": srv.URL, "XIAOCLAW_TOKEN": globalToken, "XIAOCLAW_UPSTREAM_TOKEN": secret}
	out, err := upstreamCLI(env, "add", "lab", "--tenant", "acme", "--url", "ws://127.0.0.1:18790", "--publish", "nodes:xz-b,xz-a")
	if err != nil {
		t.Fatalf("upstream add: %v\n%s", err, out)
	}
	if !strings.Contains(out, "lab") || !strings.Contains(out, "nodes:xz-a,xz-b") || strings.Contains(out, secret) {
		t.Fatalf("upstream add printed:\n%s", out)
	}
	if _, name, err := tenancy.ParseUpstreamCallerToken(lastLine(out)); err != nil || name != "lab" {
		t.Fatalf("last line of upstream add is not the caller token: %q", lastLine(out))
	}
	u, err := store.Upstream(ctx, "acme", "lab")
	if err != nil || u.Secret != secret || u.Auth != tenancy.UpstreamAuthToken || u.URL != "ws://127.0.0.1:18790" {
		t.Fatalf("stored: %v %v", u, err)
	}

	// Refused input: an error naming the problem, nothing stored.
	out, err = upstreamCLI(env, "add", "bad", "--tenant", "acme", "--url", "http://127.0.0.1:18790")
	if err == nil || !strings.Contains(err.Error(), "ws://") {
		t.Fatalf("http url: %v\n%s", err, out)
	}
	out, err = upstreamCLI(env, "add", "bad", "--tenant", "acme", "--url", "ws://gw:1", "--publish", "some")
	if err == nil || !strings.Contains(err.Error(), "publish mode") {
		t.Fatalf("unknown publish mode: %v\n%s", err, out)
	}

	out, err = upstreamCLI(env, "list", "--tenant", "acme")
	if err != nil || !strings.Contains(out, "lab") || !strings.Contains(out, "ws://127.0.0.1:18790") || strings.Contains(out, "bad") || strings.Contains(out, secret) {
		t.Fatalf("upstream list: %v\n%s", err, out)
	}
	out, err = upstreamCLI(env, "list", "--tenant", "acme", "--json")
	var l adminapi.UpstreamList
	if err != nil || json.Unmarshal([]byte(out), &l) != nil || len(l.Upstreams) != 1 || strings.Contains(out, secret) {
		t.Fatalf("upstream list --json: %v\n%s", err, out)
	}

	if out, err := upstreamCLI(env, "remove", "lab", "--tenant", "acme"); err != nil || !strings.Contains(out, "removed") {
		t.Fatalf("upstream remove: %v\n%s", err, out)
	}
	if left, _ := store.Upstreams(ctx, "acme"); len(left) != 0 {
		t.Fatalf("after remove: %v", left)
	}
	if _, err := upstreamCLI(env, "remove", "lab", "--tenant", "acme"); err == nil {
		t.Fatal("removing an unknown upstream succeeded")
	}
}
