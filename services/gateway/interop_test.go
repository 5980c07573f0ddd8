//go:build interop

package gateway_test

// The real OpenClaw CLI and node host against one gateway with a shim
// stand-in. Install them with `bash /work/shared/tools/openclaw/openclaw-ref.sh
// install` (or `make interop`), then: go test -tags interop -run Interop .
// The test fails, never skips, when they are missing.

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/openclawref"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

func TestInteropStockCLIAndNodeHost(t *testing.T) {
	ocBin, ocEnv := openclawref.Require(t)
	e := newEnv(t)
	gw := e.gateway(nil)
	url := gw.URL()
	port := url[strings.LastIndex(url, ":")+1:]

	// The shim stand-in serves one XiaoZhi device.
	const devNode = "xz-02000000000001"
	e.putNode(device(tenantAcme, devNode, "speaker", true))
	e.shim(tenantAcme, func(req wire.InvokeRequest, m *nats.Msg) {
		reply(m, wire.InvokeReply{OK: true, Payload: json.RawMessage(`{"content":[{"type":"text","text":"true"}],"isError":false,"echo":` + string(req.Params) + `}`)})
	})

	cli := func(args ...string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, ocBin, args...)
		cmd.Env = append(ocEnv, "HOME="+t.TempDir())
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			return out.String(), &exec.ExitError{ProcessState: cmd.ProcessState, Stderr: errb.Bytes()}
		}
		return out.String(), nil
	}

	nodeHost := exec.Command(ocBin, "node", "run", "--host", "127.0.0.1", "--port", port, "--display-name", "interop-host")
	nodeHost.Env = append(ocEnv, "HOME="+t.TempDir(), "OPENCLAW_GATEWAY_TOKEN="+tokOperator)
	var nodeLog bytes.Buffer
	nodeHost.Stdout, nodeHost.Stderr = &nodeLog, &nodeLog
	if err := nodeHost.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = nodeHost.Process.Kill()
		_ = nodeHost.Wait()
		if t.Failed() || testing.Verbose() {
			t.Logf("node host output:\n%s", nodeLog.String())
		}
	})

	// The node host registers; the stock CLI lists both nodes.
	var hostID string
	op := operator(t, gw, tokAdmin, "operator.read")
	// Node.js takes a while to start on a busy machine.
	eventually.Within(t, 120*time.Second, "the stock node host to register", func() bool {
		for _, n := range payload[nodeList](t, call(t, op, "node.list", map[string]any{})).Nodes {
			if n.DisplayName == "interop-host" && n.Connected {
				hostID = n.NodeID
				return true
			}
		}
		return false
	})
	out, err := cli("gateway", "call", "node.list", "--url", url, "--token", tokAdmin, "--json")
	if err != nil {
		t.Fatalf("openclaw gateway call node.list: %v %s\n%s", err, stderr(err), out)
	}
	var list struct {
		Nodes []nodeView `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list.Nodes) != 2 {
		t.Fatalf("node.list via the CLI: %v\n%s", err, out)
	}
	for _, n := range list.Nodes {
		if n.NodeID == hostID && (!n.Connected || !n.Paired || !containsStr(n.Commands, "system.which")) {
			t.Fatalf("node host listed as %+v", n)
		}
	}

	// nodes invoke resolves the node by name and goes to the node host.
	out, err = cli("nodes", "invoke", "--url", url, "--token", tokOperator, "--node", "interop-host",
		"--command", "system.which", "--params", `{"bins":["sh"]}`, "--json")
	if err != nil {
		t.Fatalf("openclaw nodes invoke system.which: %v %s\n%s", err, stderr(err), out)
	}
	var which struct {
		OK      bool   `json:"ok"`
		NodeID  string `json:"nodeId"`
		Command string `json:"command"`
		Payload struct {
			Bins map[string]string `json:"bins"`
		} `json:"payload"`
	}
	if err := json.Unmarshal([]byte(out), &which); err != nil || !which.OK || which.NodeID != hostID || !strings.HasSuffix(which.Payload.Bins["sh"], "/sh") {
		t.Fatalf("system.which result: %v\n%s", err, out)
	}
	t.Logf("system.which through xiaoclaw: %s", strings.TrimSpace(out))

	// And to the XiaoZhi device behind the shim stand-in.
	out, err = cli("nodes", "invoke", "--url", url, "--token", tokOperator, "--node", devNode,
		"--command", "mcp.tools.call", "--params", `{"name":"self.audio_speaker.set_volume","arguments":{"volume":30}}`, "--json")
	if err != nil || !strings.Contains(out, `"volume": 30`) && !strings.Contains(out, `"volume":30`) {
		t.Fatalf("openclaw nodes invoke mcp.tools.call: %v %s\n%s", err, stderr(err), out)
	}

	// A viewer token is refused node.invoke with the missing-scope error.
	out, err = cli("gateway", "call", "node.invoke", "--url", url, "--token", tokViewer, "--json", "--params",
		`{"nodeId":"`+devNode+`","command":"mcp.tools.list","idempotencyKey":"interop-viewer"}`)
	if err == nil || !strings.Contains(stderr(err)+out, "missing scope: operator.write") {
		t.Fatalf("viewer node.invoke: %v %s\n%s", err, stderr(err), out)
	}
}

func stderr(err error) string {
	if ee, ok := err.(*exec.ExitError); ok {
		return string(ee.Stderr)
	}
	return ""
}

func containsStr(ss []string, s string) bool {
	for _, v := range ss {
		if v == s {
			return true
		}
	}
	return false
}
