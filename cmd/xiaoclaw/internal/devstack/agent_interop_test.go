//go:build interop

package devstack

// A real stdio MCP server from npm (@modelcontextprotocol/server-everything,
// which `make interop` installs beside OpenClaw) relayed by `xiaoclaw
// agent` and called with the stock OpenClaw CLI. It fails, never skips,
// when either is missing.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw/internal/agent"
	"github.com/xiaoclaw/xiaoclaw/pkg/openclawref"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

func TestInteropAgentRelaysNpmServer(t *testing.T) {
	ocBin, env := openclawref.Require(t)
	everything := filepath.Join(filepath.Dir(ocBin), "mcp-server-everything")
	if _, err := os.Stat(everything); err != nil {
		t.Fatalf("@modelcontextprotocol/server-everything is not installed beside OpenClaw (%v): run make interop", err)
	}
	envOf := func(k string) string {
		for i := len(env) - 1; i >= 0; i-- {
			if v, ok := strings.CutPrefix(env[i], k+"="); ok {
				return v
			}
		}
		return ""
	}
	st := startStack(t, Config{})
	cfg := fmt.Sprintf(`{"mcpServers":{"everything":{"command":%q,"args":["stdio"]}}}`, everything)
	cfgPath := filepath.Join(t.TempDir(), "agent.json")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	a := startAgent(t, st, cfgPath, "02:ae:00:00:00:09", func(o *agent.Options) { o.Env = envOf })
	dev, _ := wire.CanonicalDevice(a.DeviceID())
	node := wire.DeviceNodeID(dev)
	op := operator(t, st.GatewayURL(0))
	waitTools(t, op, node, func(n []string) bool { return has(n, "everything.echo") })
	t.Logf("npm server's tools listed through the hub %s after the agent started", time.Since(start))

	url := st.GatewayURL(0)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, ocBin, "nodes", "invoke", "--url", url, "--token", testOperatorToken, "--node", node,
		"--command", "mcp.tools.call", "--params", `{"name":"everything.echo","arguments":{"message":"relayed by xiaoclaw"}}`, "--json")
	cmd.Env = append(env, "HOME="+t.TempDir())
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil || !strings.Contains(out.String(), "Echo: relayed by xiaoclaw") {
		t.Fatalf("openclaw nodes invoke everything.echo: %v\n%s\n%s", err, out.String(), errb.String())
	}
	t.Logf("openclaw nodes invoke: %s", strings.TrimSpace(out.String()))
}
