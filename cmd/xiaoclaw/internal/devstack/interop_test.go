//go:build interop

package devstack

// The real OpenClaw CLI and node host against xiaoclaw: `make interop`
// installs them from npm (../shared/tools/openclaw/openclaw-ref.sh) and runs
// this test. It fails, never skips, when they are missing.

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/openclawref"
	"github.com/xiaoclaw/xiaoclaw/services/shim/upstream"
)

func TestInteropOpenClaw(t *testing.T) {
	ocBin, env := openclawref.Require(t)
	// The device also has a link to an upstream nothing listens on, so
	// node.list carries xiaoclaw's extra "upstreams" field, which the stock
	// CLI must take.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_ = ln.Close()
	st := startStack(t, Config{Upstream: upstream.Upstream{Name: "lab", URL: "ws://" + ln.Addr().String(), Token: "t"}})
	dev := connectDevices(t, st, 0, 1, 9, nil)[0]
	url := st.GatewayURL(0)
	home := t.TempDir()

	openclaw := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, ocBin, args...)
		cmd.Env = append(env, "HOME="+home)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		if err != nil {
			return out.String(), &cliError{err: err, stderr: errb.String(), stdout: out.String()}
		}
		return out.String(), nil
	}

	// A stock headless node host, with its own identity in its own HOME.
	nodeHome := t.TempDir()
	port := url[strings.LastIndex(url, ":")+1:]
	nodeHost := exec.Command(ocBin, "node", "run", "--host", "127.0.0.1", "--port", port, "--display-name", "interop-node")
	nodeHost.Env = append(env, "HOME="+nodeHome, "OPENCLAW_GATEWAY_TOKEN="+testOperatorToken)
	var nodeLog bytes.Buffer
	nodeHost.Stdout, nodeHost.Stderr = &nodeLog, &nodeLog
	if err := nodeHost.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = nodeHost.Process.Kill()
		_ = nodeHost.Wait()
		if t.Failed() {
			t.Logf("node host output:\n%s", nodeLog.String())
		}
	})

	devNode := nodeID(dev)
	type listed struct {
		NodeID      string `json:"nodeId"`
		DisplayName string `json:"displayName"`
		Connected   bool   `json:"connected"`
		Upstreams   []struct {
			Name string `json:"name"`
		} `json:"upstreams"`
	}
	var hostNode string
	deadline := time.Now().Add(90 * time.Second)
	for {
		out, err := openclaw("gateway", "call", "node.list", "--url", url, "--token", testOperatorToken, "--json")
		var res struct {
			Nodes []listed `json:"nodes"`
		}
		if err == nil && json.Unmarshal([]byte(out), &res) == nil {
			seenDev := false
			for _, n := range res.Nodes {
				if n.NodeID == devNode && n.Connected && len(n.Upstreams) == 1 {
					seenDev = true
				}
				if n.DisplayName == "interop-node" && n.Connected {
					hostNode = n.NodeID
				}
			}
			if seenDev && hostNode != "" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("openclaw gateway call node.list never listed both nodes: %v\n%s", err, out)
		}
		time.Sleep(time.Second) // each CLI run takes seconds; poll for the node host to connect
	}

	out, err := openclaw("nodes", "list", "--url", url, "--token", testOperatorToken, "--json")
	if err != nil || !strings.Contains(out, devNode) || !strings.Contains(out, "interop-node") {
		t.Fatalf("openclaw nodes list: %v\n%s", err, out)
	}

	out, err = openclaw("nodes", "invoke", "--url", url, "--token", testOperatorToken, "--node", devNode,
		"--command", "mcp.tools.call", "--params", `{"name":"self.audio_speaker.set_volume","arguments":{"volume":30}}`, "--json")
	if err != nil || dev.Volume() != 30 {
		t.Fatalf("openclaw nodes invoke mcp.tools.call: volume %d, %v\n%s", dev.Volume(), err, out)
	}

	out, err = openclaw("nodes", "invoke", "--url", url, "--token", testOperatorToken, "--node", "interop-node",
		"--command", "system.which", "--params", `{"bins":["sh"]}`, "--json")
	if err != nil || !strings.Contains(out, "/sh") {
		t.Fatalf("openclaw nodes invoke system.which on the stock node host: %v\n%s", err, out)
	}
	t.Logf("system.which via xiaoclaw: %s", strings.TrimSpace(out))
}

type cliError struct {
	err            error
	stdout, stderr string
}

func (e *cliError) Error() string { return e.err.Error() + ": " + e.stderr + e.stdout }
