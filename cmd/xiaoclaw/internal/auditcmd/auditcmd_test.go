package auditcmd_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw/internal/auditcmd"
	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/audit"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/auditapi"
)

func server(t *testing.T) *httptest.Server {
	ctx := context.Background()
	s, err := audit.OpenSQLite(ctx, filepath.Join(t.TempDir(), "a.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	var batch []audit.Event
	for i := range 120 {
		e := audit.Event{ID: "e" + time.Duration(i).String(), Time: now.Add(-time.Duration(i) * time.Minute), Kind: audit.KindInvoke,
			Tenant: "acme", Principal: "tok_op", Node: "xz-a1b2c3d4e5f6", Command: "mcp.tools.call", Tool: "set_volume",
			Decision: audit.DecisionAllow, Outcome: "ok", LatencyUs: 1200}
		if i%4 == 0 {
			e.Tool, e.Decision, e.RuleID, e.Outcome, e.ErrorCode = "reboot", audit.DecisionDeny, "rule-no-reboot", "denied", "POLICY_DENIED"
		}
		batch = append(batch, e)
	}
	if _, err := s.Write(ctx, batch); err != nil {
		t.Fatal(err)
	}
	h, err := auditapi.New(auditapi.Config{Store: s, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Operators: access.StaticTokens{"viewer": {Tenant: "acme", ID: "tok_v", Role: access.RoleViewer}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func run(env map[string]string, args ...string) (string, error) {
	cmd := auditcmd.CommandWithEnv(func(k string) string { return env[k] })
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(io.Discard)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

func TestAuditCommand(t *testing.T) {
	srv := server(t)
	env := map[string]string{"XIAOCLAW_SERVER": srv.URL, "XIAOCLAW_TOKEN": "viewer"}

	out, err := run(env, "--tenant", "acme", "--since", "1h", "--outcome", "denied")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	// 60 minutes back: events 0..59 (the 60th is on the edge), every 4th denied.
	if len(lines) != 1+15 || !strings.HasPrefix(lines[0], "TIME") || !strings.Contains(lines[1], "rule-no-reboot") {
		t.Fatalf("%d lines:\n%s", len(lines), out)
	}

	// JSON lines across pages (the API pages at 1000, the command at --limit).
	out, err = run(env, "--json", "--limit", "110", "--tool", "set_volume")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var e audit.Event
		if err := json.Unmarshal([]byte(l), &e); err != nil || e.Tool != "set_volume" {
			t.Fatalf("line %q: %v", l, err)
		}
		n++
	}
	if n != 90 {
		t.Fatalf("%d events, want 90", n)
	}

	for _, c := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{map[string]string{"XIAOCLAW_SERVER": srv.URL}, nil, "no token"},
		{map[string]string{"XIAOCLAW_SERVER": srv.URL, "XIAOCLAW_TOKEN": "wrong"}, nil, "unauthenticated"},
		{env, []string{"--tenant", "globex"}, "not_found"},
		{env, []string{"--since", "last tuesday"}, "--since"},
		{env, []string{"--limit", "0"}, "--limit"},
		{map[string]string{"XIAOCLAW_TOKEN": "x"}, []string{"--server", "ftp://x"}, "scheme"},
		{map[string]string{"XIAOCLAW_TOKEN": "x", "XIAOCLAW_SERVER": "http://127.0.0.1:1"}, nil, "cannot reach"},
	} {
		if _, err := run(c.env, c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v %v: %v, want %q", c.env, c.args, err, c.want)
		}
	}
}
