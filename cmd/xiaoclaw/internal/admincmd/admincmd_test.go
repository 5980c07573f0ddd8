package admincmd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw/internal/admincmd"
	"github.com/xiaoclaw/xiaoclaw/pkg/policy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy/tenancytest"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/adminapi"
)

const globalToken = "global-admin-token-for-cli-tests"

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// server runs the real admin API on a SQLite store.
func server(t *testing.T) (*httptest.Server, tenancy.Store) {
	t.Helper()
	return serverOn(t, tenancytest.SQLite(t))
}

// serverOn runs the real admin API on store.
func serverOn(t *testing.T, store *tenancy.SQLStore) (*httptest.Server, tenancy.Store) {
	t.Helper()
	ops := tenancy.NewOperatorAuth(store, tenancy.CacheConfig{}, quiet)
	engine, err := policy.New(policy.Config{Store: store, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := tenancy.NewManager(tenancy.ManagerConfig{Store: store, CheckRule: policy.CheckRule, Log: quiet,
		Notify: func(_ context.Context, c wire.TenancyChange) error {
			ops.TenancyChanged(c)
			engine.TenancyChanged(c)
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := adminapi.New(adminapi.Config{Manager: mgr, Operators: ops, Policy: engine, AdminTokens: []string{globalToken}, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/api/", h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, store
}

// xiaoclaw runs one command line and returns its output and error.
func xiaoclaw(env map[string]string, args ...string) (string, error) {
	root := &cobra.Command{Use: "xiaoclaw", SilenceErrors: true, SilenceUsage: true}
	root.AddCommand(admincmd.CommandsWithEnv(func(k string) string { return env[k] })...)
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

func TestCLIWorkflow(t *testing.T) {
	srv, store := server(t)
	ctx := context.Background()
	global := map[string]string{"XIAOCLAW_SERVER": srv.URL, "XIAOCLAW_TOKEN": globalToken}
	run := func(env map[string]string, args ...string) string {
		t.Helper()
		out, err := xiaoclaw(env, args...)
		if err != nil {
			t.Fatalf("xiaoclaw %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}

	out := run(global, "tenant", "create", "acme", "--display-name", "ACME Corp")
	if !strings.Contains(out, "acme") || !strings.Contains(out, "active") {
		t.Fatalf("tenant create: %s", out)
	}
	var list adminapi.TenantList
	if err := json.Unmarshal([]byte(run(global, "tenant", "list", "--json")), &list); err != nil || len(list.Tenants) != 1 || list.Tenants[0].DisplayName != "ACME Corp" {
		t.Fatalf("tenant list --json: %+v %v", list, err)
	}

	// The new token is the last line, and it works as the admin's --token.
	adminTok := lastLine(run(global, "token", "create", "--tenant", "acme", "--role", "admin", "--name", "root"))
	if _, err := tenancy.ParseOperatorToken(adminTok); err != nil {
		t.Fatalf("last line of token create is not a token: %q", adminTok)
	}
	admin := map[string]string{"XIAOCLAW_TOKEN": adminTok} // server from the flag this time
	opTok := lastLine(run(admin, "--server", srv.URL, "token", "create", "--tenant", "acme", "--role", "operator", "--expires-in", "48h"))
	opID, _ := tenancy.ParseOperatorToken(opTok)
	if out := run(admin, "token", "list", "--tenant", "acme", "--server", srv.URL); !strings.Contains(out, opID) || strings.Contains(out, opTok) {
		t.Fatalf("token list: %s", out)
	}

	// Policy: add prints the rule id last; explain shows it deciding.
	admin["XIAOCLAW_SERVER"] = srv.URL
	ruleID := lastLine(run(admin, "policy", "add", "--tenant", "acme", "--effect", "deny", "--subject", "operator",
		"--object", "xz-*", "--action", "mcp.tools.call:self.audio_speaker.set_volume", "--when", "volume>60"))
	if !tenancy.ValidRuleID(ruleID) {
		t.Fatalf("last line of policy add is not a rule id: %q", ruleID)
	}
	if rules, _ := store.Rules(ctx, "acme"); len(rules) != 1 || rules[0].ID != ruleID || rules[0].When != "volume > 60" {
		t.Fatalf("stored rules: %+v", rules)
	}
	if out := run(admin, "policy", "list", "--tenant", "acme"); !strings.Contains(out, ruleID) || !strings.Contains(out, "volume > 60") {
		t.Fatalf("policy list: %s", out)
	}
	out = run(admin, "policy", "explain", "--tenant", "acme", "--subject", opID, "--object", "xz-a1b2c3d4e5f6",
		"--action", "mcp.tools.call:self.audio_speaker.set_volume", "--args", `{"volume":80}`)
	if !strings.HasPrefix(out, "DENY") || !strings.Contains(out, ruleID) {
		t.Fatalf("policy explain: %s", out)
	}
	out = run(admin, "policy", "explain", "--tenant", "acme", "--subject", opID, "--object", "xz-a1b2c3d4e5f6",
		"--action", "mcp.tools.call:self.audio_speaker.set_volume", "--args", `{"volume":20}`, "--json")
	var ex adminapi.ExplainResponse
	if err := json.Unmarshal([]byte(out), &ex); err != nil || !ex.Allowed || len(ex.Matched) != 1 || ex.Matched[0].Applies {
		t.Fatalf("policy explain --json: %+v %v", ex, err)
	}
	run(admin, "policy", "remove", "--tenant", "acme", ruleID)
	if rules, _ := store.Rules(ctx, "acme"); len(rules) != 0 {
		t.Fatalf("rules after remove: %+v", rules)
	}

	// Device keys: the secret is the last line.
	secret := lastLine(run(admin, "device-key", "create", "--tenant", "acme"))
	keys, _ := store.DeviceKeys(ctx, "acme")
	if len(keys) != 1 || keys[0].Secret != secret {
		t.Fatalf("device-key create printed %q; stored %+v", secret, keys)
	}
	secret2 := lastLine(run(admin, "device-key", "rotate", "--tenant", "acme", "--overlap", "2h"))
	keys, _ = store.DeviceKeys(ctx, "acme")
	// Both keys may carry the same creation millisecond: find them by secret.
	var oldKey, newKey *tenancy.DeviceKey
	for i := range keys {
		switch keys[i].Secret {
		case secret:
			oldKey = &keys[i]
		case secret2:
			newKey = &keys[i]
		}
	}
	if len(keys) != 2 || oldKey == nil || newKey == nil || oldKey.RetireAt.IsZero() || !newKey.RetireAt.IsZero() {
		t.Fatalf("after rotate: %+v", keys)
	}
	if out := run(admin, "device-key", "list", "--tenant", "acme"); strings.Contains(out, secret) || !strings.Contains(out, oldKey.ID) {
		t.Fatalf("device-key list: %s", out)
	}

	// Allowlist and groups.
	run(admin, "allowlist", "set", "--tenant", "acme", "AA:BB:CC:DD:EE:FF")
	if on, devs, _ := store.Allowlist(ctx, "acme"); !on || len(devs) != 1 || devs[0] != "aabbccddeeff" {
		t.Fatalf("allowlist: %v %v", on, devs)
	}
	run(admin, "group", "set", "--tenant", "acme", "kitchen", "xz-aabbccddeeff", "xz-112233445566")
	if out := run(admin, "group", "list", "--tenant", "acme"); !strings.Contains(out, "kitchen") {
		t.Fatalf("group list: %s", out)
	}
	run(admin, "group", "delete", "--tenant", "acme", "kitchen")

	// Revoke and suspend.
	run(admin, "token", "revoke", opID)
	if tok, _ := store.Token(ctx, opID); tok.RevokedAt.IsZero() {
		t.Fatal("token revoke did not revoke")
	}
	run(global, "tenant", "update", "acme", "--default", "deny")
	run(global, "tenant", "suspend", "acme")
	if tn, _ := store.Tenant(ctx, "acme"); tn.Status != tenancy.StatusSuspended || tn.DefaultEffect != "deny" {
		t.Fatalf("tenant after update and suspend: %+v", tn)
	}
	if _, err := xiaoclaw(admin, "token", "list", "--tenant", "acme"); err == nil {
		t.Fatal("the admin token of a suspended tenant still works")
	}
	run(global, "tenant", "resume", "acme")
}

func TestCLIErrors(t *testing.T) {
	srv, store := server(t)
	global := map[string]string{"XIAOCLAW_SERVER": srv.URL, "XIAOCLAW_TOKEN": globalToken}
	if _, err := xiaoclaw(global, "tenant", "create", "acme"); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{global, []string{"policy", "add", "--tenant", "acme", "--effect", "permit", "--action", "x"}, "invalid_argument"},
		{global, []string{"policy", "add", "--tenant", "acme", "--effect", "deny", "--action", "mcp.tools.call:x", "--when", "volume >"}, "invalid_argument"},
		{global, []string{"policy", "add", "--tenant", "acme", "--effect", "deny"}, `"action" not set`},
		{global, []string{"policy", "explain", "--tenant", "acme", "--subject", "*", "--object", "xz-1", "--action", "x", "--args", "{"}, "not valid JSON"},
		{global, []string{"token", "create", "--tenant", "acme", "--role", "root"}, "invalid_argument"},
		{global, []string{"token", "create", "--tenant", "ghost"}, "not_found"},
		{global, []string{"token", "revoke", "tok_aaaaaaaaaaaaaaaa"}, "not_found"},
		{global, []string{"tenant", "create", "acme"}, "already_exists"},
		{global, []string{"tenant", "create", "Bad_Name"}, "invalid_argument"},
		{global, []string{"tenant", "update", "acme"}, "nothing to change"},
		{global, []string{"tenant", "set-limits", "acme"}, "nothing to change"},
		{global, []string{"tenant", "set-limits", "acme", "--max-inflight", "-1"}, "invalid_argument"},
		{global, []string{"tenant", "set-limits", "acme", "--max-inflight-per-device", "2000000"}, "invalid_argument"},
		{global, []string{"tenant", "set-limits", "acme", "--max-inflight", "ten"}, "invalid argument"},
		{global, []string{"tenant", "set-limits", "ghost", "--max-inflight", "10"}, "not_found"},
		{map[string]string{"XIAOCLAW_SERVER": srv.URL}, []string{"tenant", "list"}, "no token"},
		{map[string]string{"XIAOCLAW_SERVER": srv.URL, "XIAOCLAW_TOKEN": "wrong"}, []string{"tenant", "list"}, "unauthenticated"},
		{map[string]string{"XIAOCLAW_SERVER": "http://127.0.0.1:1", "XIAOCLAW_TOKEN": "x"}, []string{"tenant", "list"}, "cannot reach"},
		{map[string]string{"XIAOCLAW_SERVER": "ftp://x", "XIAOCLAW_TOKEN": "x"}, []string{"tenant", "list"}, "scheme"},
	} {
		out, err := xiaoclaw(c.env, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("xiaoclaw %s: err %v (output %q), want an error containing %q", strings.Join(c.args, " "), err, out, c.want)
		}
	}
	if rules, _ := store.Rules(context.Background(), "acme"); len(rules) != 0 {
		t.Fatalf("failed commands stored rules: %+v", rules)
	}
	if ts, _ := store.Tenants(context.Background()); len(ts) != 1 {
		t.Fatalf("failed commands created tenants: %+v", ts)
	}
	// A ws:// URL (as the operator commands take) works too.
	ws := map[string]string{"XIAOCLAW_SERVER": "ws" + strings.TrimPrefix(srv.URL, "http"), "XIAOCLAW_TOKEN": globalToken}
	if out, err := xiaoclaw(ws, "tenant", "list"); err != nil || !strings.Contains(out, "acme") {
		t.Fatalf("ws:// server: %v %s", err, out)
	}
}

// tenant set-limits and tenant limits against the real admin API, on both
// stores; a tenant admin reads its limits but cannot change them.
func TestCLITenantLimits(t *testing.T) {
	tenancytest.Each(t, func(t *testing.T, store *tenancy.SQLStore) {
		srv, _ := serverOn(t, store)
		global := map[string]string{"XIAOCLAW_SERVER": srv.URL, "XIAOCLAW_TOKEN": globalToken}
		run := func(env map[string]string, args ...string) string {
			t.Helper()
			out, err := xiaoclaw(env, args...)
			if err != nil {
				t.Fatalf("xiaoclaw %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			return out
		}
		run(global, "tenant", "create", "acme")
		if out := run(global, "tenant", "limits", "acme"); strings.Join(strings.Fields(lastLine(out)), " ") != "acme default default" {
			t.Fatalf("new tenant limits:\n%s", out)
		}
		out := run(global, "tenant", "set-limits", "acme", "--max-inflight", "200", "--max-inflight-per-device", "4")
		if f := strings.Fields(lastLine(out)); len(f) != 3 || f[1] != "200" || f[2] != "4" {
			t.Fatalf("set-limits printed:\n%s", out)
		}
		run(global, "tenant", "set-limits", "acme", "--max-inflight-per-device", "0")
		tn, err := store.Tenant(context.Background(), "acme")
		if err != nil || tn.Limits != (tenancy.Limits{MaxInflight: 200}) {
			t.Fatalf("stored limits = %+v, %v", tn.Limits, err)
		}
		var l tenancy.Limits
		if err := json.Unmarshal([]byte(run(global, "tenant", "limits", "acme", "--json")), &l); err != nil || l.MaxInflight != 200 {
			t.Fatalf("--json limits = %+v, %v", l, err)
		}
		admin := map[string]string{"XIAOCLAW_SERVER": srv.URL,
			"XIAOCLAW_TOKEN": lastLine(run(global, "token", "create", "--tenant", "acme", "--role", "admin"))}
		if f := strings.Fields(lastLine(run(admin, "tenant", "limits", "acme"))); len(f) != 3 || f[1] != "200" {
			t.Fatalf("tenant admin reads %v", f)
		}
		if out, err := xiaoclaw(admin, "tenant", "set-limits", "acme", "--max-inflight", "100000"); err == nil || !strings.Contains(err.Error(), "permission_denied") {
			t.Fatalf("tenant admin set its own limits: %v %s", err, out)
		}
	})
}
