//go:build interop

package devstack

// Upstream mode against the REAL OpenClaw gateway (npm `openclaw`, run on
// loopback from the reference install): xiaoclaw publishes its simulated
// devices as nodes there, the stock CLI approves, lists and invokes them,
// and the publishing tenant's policy still decides.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/openclawref"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/services/shim/upstream"
)

const refGatewayToken = "ref-gateway-token-0123456789"

// refGateway is `openclaw gateway run` on a loopback port with its own
// HOME, configured to admit the MCP bridge commands from nodes.
type refGateway struct {
	t    testing.TB
	bin  string
	env  []string
	home string
	port int
	cmd  *exec.Cmd
	log  bytes.Buffer
}

func startRefGateway(t testing.TB, bin string, env []string) *refGateway {
	t.Helper()
	return startRefGatewayAuth(t, bin, env, map[string]any{"mode": "token", "token": refGatewayToken})
}

// startRefGatewayAuth starts the reference gateway with gateway.auth set to auth.
func startRefGatewayAuth(t testing.TB, bin string, env []string, auth map[string]any) *refGateway {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &refGateway{t: t, bin: bin, env: env, home: t.TempDir(), port: l.Addr().(*net.TCPAddr).Port}
	l.Close()
	cfg := map[string]any{
		"gateway": map[string]any{
			"mode": "local", "port": g.port, "bind": "loopback",
			"auth":      auth,
			"tailscale": map[string]any{"mode": "off"},
			"nodes": map[string]any{
				"pairing":  map[string]any{"sshVerify": false},
				"commands": map[string]any{"allow": upstream.Commands},
			},
		},
		"discovery": map[string]any{"mdns": map[string]any{"mode": "off"}},
		"update":    map[string]any{"checkOnStart": false},
	}
	b, _ := json.Marshal(cfg)
	if err := os.MkdirAll(filepath.Join(g.home, ".openclaw"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(g.home, ".openclaw", "openclaw.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		g.stop()
		if t.Failed() {
			t.Logf("reference gateway output (tail):\n%s", tail(g.log.String(), 4000))
		}
	})
	g.start()
	return g
}

func (g *refGateway) url() string { return fmt.Sprintf("ws://127.0.0.1:%d", g.port) }

// start runs the gateway and waits until /readyz answers.
func (g *refGateway) start() {
	t := g.t
	t.Helper()
	cmd := exec.Command(g.bin, "gateway", "run", "--port", fmt.Sprint(g.port), "--bind", "loopback")
	cmd.Env = append(g.env, "HOME="+g.home)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Stdout, cmd.Stderr = &g.log, &g.log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	g.cmd = cmd
	deadline := time.Now().Add(3 * time.Minute)
	for {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/readyz", g.port))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reference OpenClaw gateway did not get ready: %v", err)
		}
		time.Sleep(500 * time.Millisecond) // polling /readyz of a starting process
	}
}

// stop ends the gateway's process group (its own, by PID) with SIGTERM,
// so it shuts down as on a restart.
func (g *refGateway) stop() {
	if g.cmd == nil {
		return
	}
	pid := g.cmd.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = g.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-done
	}
	g.cmd = nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func TestInteropUpstreamRealOpenClawGateway(t *testing.T) {
	bin, env := openclawref.Require(t)
	gw := startRefGateway(t, bin, env)
	url, gwHome := gw.url(), gw.home
	openclaw := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, append(args, "--url", url, "--token", refGatewayToken, "--json")...)
		cmd.Env = append(env, "HOME="+gwHome)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			return out.String(), &cliError{err: err, stderr: errb.String(), stdout: out.String()}
		}
		return out.String(), nil
	}

	home := startStack(t, Config{Upstream: upstream.Upstream{Name: "ref", URL: url, Token: refGatewayToken}})
	hello := time.Now()
	dev := connectDevices(t, home, 0, 1, 11, nil)[0]
	for {
		if s := home.Upstreams[0].Status(); len(s) == 1 && s[0].State == upstream.StateOnline {
			t.Logf("device hello to online on the real OpenClaw gateway: %s (link connect %d ms)",
				time.Since(hello).Round(time.Millisecond), s[0].OnlineAfterMs)
			break
		}
		if time.Since(hello) > time.Minute {
			t.Fatalf("link not online: %+v", home.Upstreams[0].Status())
		}
		time.Sleep(2 * time.Millisecond) // polling a state, for the figure
	}

	// The node shows up with a pairing request; approve it as an OpenClaw
	// operator would (the device identity itself is paired silently on
	// loopback).
	type pending struct {
		RequestID string   `json:"requestId"`
		NodeID    string   `json:"nodeId"`
		Platform  string   `json:"platform"`
		Commands  []string `json:"commands"`
	}
	var nodeID string
	deadline := time.Now().Add(2 * time.Minute)
	for nodeID == "" {
		out, err := openclaw("nodes", "pending")
		var reqs []pending
		if err == nil && json.Unmarshal([]byte(out), &reqs) == nil {
			for _, r := range reqs {
				if r.Platform == upstream.Platform && strings.Contains(strings.Join(r.Commands, ","), "mcp.tools.call") {
					if out, err := openclaw("nodes", "approve", r.RequestID); err != nil {
						t.Fatalf("openclaw nodes approve: %v\n%s", err, out)
					}
					nodeID = r.NodeID
				}
			}
		}
		if nodeID == "" && time.Now().After(deadline) {
			t.Fatalf("no pairing request of a xiaozhi node: %v\n%s\nlinks: %+v", err, out, home.Upstreams[0].Status())
		}
		if nodeID == "" {
			time.Sleep(time.Second) // each CLI run takes seconds
		}
	}
	st := home.Upstreams[0].Status()
	if len(st) != 1 || st[0].DeviceID != nodeID || st[0].State != upstream.StateOnline {
		t.Fatalf("link status %+v, approved node %s", st, nodeID)
	}

	out, err := openclaw("nodes", "list")
	if err != nil || !strings.Contains(out, nodeID) || !strings.Contains(out, `"platform": "xiaozhi"`) {
		t.Fatalf("openclaw nodes list: %v\n%s", err, out)
	}

	// The real gateway's node.invoke reaches the device through xiaoclaw.
	deadline = time.Now().Add(time.Minute)
	for {
		out, err = openclaw("nodes", "invoke", "--node", nodeID, "--command", "mcp.tools.call",
			"--params", `{"name":"self.audio_speaker.set_volume","arguments":{"volume":27}}`)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second) // the approved command surface may take a moment to apply
	}
	if err != nil || dev.Volume() != 27 || !strings.Contains(out, `"isError": false`) {
		t.Fatalf("openclaw nodes invoke: volume %d, %v\n%s", dev.Volume(), err, out)
	}

	// A deny rule for the upstream in xiaoclaw refuses the call.
	if _, err := home.Tenancy.Manager.AddRule(context.Background(), tenancy.Rule{Tenant: DevTenant, Effect: tenancy.EffectDeny,
		Subject: upstream.Principal("ref"), Object: "*", Action: "mcp.tools.call:self.reboot"}); err != nil {
		t.Fatal(err)
	}
	before := dev.Requests("tools/call")
	out, err = openclaw("nodes", "invoke", "--node", nodeID, "--command", "mcp.tools.call",
		"--params", `{"name":"self.reboot","arguments":{}}`)
	if err == nil || !strings.Contains(err.Error(), "POLICY_DENIED") {
		t.Fatalf("want POLICY_DENIED, got %v\n%s", err, out)
	}
	if dev.Requests("tools/call") != before {
		t.Fatal("the denied call reached the device")
	}

	// The gateway restarts: the link comes back on its own, with the same
	// identity and pairing, and calls work again.
	gw.stop()
	waitLink := func(want upstream.State) upstream.Status {
		t.Helper()
		deadline := time.Now().Add(3 * time.Minute)
		for {
			if s := home.Upstreams[0].Status(); len(s) == 1 && s[0].State == want {
				return s[0]
			}
			if time.Now().After(deadline) {
				t.Fatalf("link not %s: %+v", want, home.Upstreams[0].Status())
			}
			time.Sleep(50 * time.Millisecond) // polling a state
		}
	}
	if s := waitLink(upstream.StateBackoff); s.LastError == "" {
		t.Fatalf("backoff without the reason: %+v", s)
	}
	gw.start()
	if s := waitLink(upstream.StateOnline); s.DeviceID != nodeID {
		t.Fatalf("another node id after the restart: %+v", s)
	}
	deadline = time.Now().Add(time.Minute)
	for {
		out, err = openclaw("nodes", "invoke", "--node", nodeID, "--command", "mcp.tools.call",
			"--params", `{"name":"self.audio_speaker.set_volume","arguments":{"volume":61}}`)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second) // the node's command surface may take a moment after a restart
	}
	if err != nil || dev.Volume() != 61 {
		t.Fatalf("invoke after the gateway restart: volume %d, %v\n%s", dev.Volume(), err, out)
	}
}

// TestInteropStoredUpstreamWithPassword: an upstream stored through the
// admin API with the real OpenClaw gateway's password (gateway.auth.mode
// password) reaches the shims, which start without any upstream flag, and
// the device's link comes online there.
func TestInteropStoredUpstreamWithPassword(t *testing.T) {
	bin, env := openclawref.Require(t)
	const password = "ref-gateway-password-0123456789"
	gw := startRefGatewayAuth(t, bin, env, map[string]any{"mode": "password", "password": password})
	home := startStack(t, Config{AdminToken: upstreamAdminToken})
	if status, raw := adminCall(t, home, "POST", "/api/tenants/"+DevTenant+"/upstreams",
		map[string]any{"name": "ref", "url": gw.url(), "password": password}); status != 201 {
		t.Fatalf("add upstream: %d %s", status, raw)
	}
	added := time.Now()
	connectDevices(t, home, 0, 1, 13, nil)
	eventually.Within(t, time.Minute, "link online on the real gateway with the password", func() bool {
		s := home.Upstreams[0].Status()
		return len(s) == 1 && s[0].State == upstream.StateOnline
	})
	t.Logf("upstream added to link online: %s", time.Since(added).Round(time.Millisecond))
}
