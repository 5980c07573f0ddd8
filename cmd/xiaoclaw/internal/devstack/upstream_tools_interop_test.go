//go:build interop

package devstack

// Upstream mode against the REAL OpenClaw gateway, continued: the
// device's MCP tools become the node's plugin tools there (agent tools),
// follow catalog changes, and device notifications and presence arrive as
// node events.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/openclawref"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/services/shim/upstream"
)

// refCLI runs the stock openclaw CLI against a reference gateway.
type refCLI struct {
	bin string
	env []string
	gw  *refGateway
}

func (c refCLI) run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, append(args, "--url", c.gw.url(), "--token", refGatewayToken, "--json")...)
	cmd.Env = append(c.env, "HOME="+c.gw.home)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), &cliError{err: err, stderr: errb.String(), stdout: out.String()}
	}
	return out.String(), nil
}

// call runs a gateway method through `openclaw gateway call`.
func (c refCLI) call(method string, params any) (json.RawMessage, error) {
	b, _ := json.Marshal(params)
	out, err := c.run("gateway", "call", method, "--params", string(b))
	if err != nil {
		return nil, err
	}
	return json.RawMessage(out), nil
}

// approveXiaozhi approves every pending xiaozhi node request and returns
// the approved node ids, once there are want of them.
func (c refCLI) approveXiaozhi(t *testing.T, want int) []string {
	t.Helper()
	type pending struct {
		RequestID string `json:"requestId"`
		NodeID    string `json:"nodeId"`
		Platform  string `json:"platform"`
	}
	var ids []string
	deadline := time.Now().Add(3 * time.Minute)
	for len(ids) < want {
		out, err := c.run("nodes", "pending")
		var reqs []pending
		if err == nil && json.Unmarshal([]byte(out), &reqs) == nil {
			for _, r := range reqs {
				if r.Platform != upstream.Platform || slices.Contains(ids, r.NodeID) {
					continue
				}
				if out, err := c.run("nodes", "approve", r.RequestID); err != nil {
					t.Fatalf("openclaw nodes approve: %v\n%s", err, out)
				}
				ids = append(ids, r.NodeID)
			}
		}
		if len(ids) < want && time.Now().After(deadline) {
			t.Fatalf("%d of %d xiaozhi pairing requests: %v\n%s", len(ids), want, err, out)
		}
		if len(ids) < want {
			time.Sleep(time.Second) // each CLI run takes seconds
		}
	}
	return ids
}

// describedNode is what node.describe of the real gateway says of a node.
type describedNode struct {
	NodeID          string `json:"nodeId"`
	Connected       bool   `json:"connected"`
	LastSeenReason  string `json:"lastSeenReason"`
	NodePluginTools []struct {
		PluginID    string         `json:"pluginId"`
		Name        string         `json:"name"`
		Description string         `json:"description"`
		Parameters  map[string]any `json:"parameters"`
		Command     string         `json:"command"`
		MCP         struct {
			Server string `json:"server"`
			Tool   string `json:"tool"`
		} `json:"mcp"`
	} `json:"nodePluginTools"`
}

func (n describedNode) toolNames() []string {
	var out []string
	for _, t := range n.NodePluginTools {
		out = append(out, t.Name)
	}
	return out
}

func (c refCLI) describe(nodeID string) (describedNode, error) {
	out, err := c.call("node.describe", map[string]string{"nodeId": nodeID})
	if err != nil {
		return describedNode{}, err
	}
	var n describedNode
	return n, json.Unmarshal(out, &n)
}

// waitDescribed polls node.describe until ok holds.
func (c refCLI) waitDescribed(t *testing.T, nodeID, what string, ok func(describedNode) bool) describedNode {
	t.Helper()
	var last describedNode
	var lastErr error
	deadline := time.Now().Add(time.Minute)
	for {
		last, lastErr = c.describe(nodeID)
		if lastErr == nil && ok(last) {
			return last
		}
		if time.Now().After(deadline) {
			t.Fatalf("node %s not %s on the real gateway: %v\n%+v", nodeID, what, lastErr, last)
		}
		time.Sleep(time.Second) // each CLI run takes seconds
	}
}

func TestInteropUpstreamPluginToolsAndEvents(t *testing.T) {
	bin, env := openclawref.Require(t)
	gw := startRefGateway(t, bin, env)
	cli := refCLI{bin: bin, env: env, gw: gw}
	home := startStack(t, Config{Upstream: upstream.Upstream{Name: "ref", URL: gw.url(), Token: refGatewayToken}})
	dev := connectDevices(t, home, 0, 1, 21, nil)[0]
	nodeID := cli.approveXiaozhi(t, 1)[0]

	// The device's MCP tools are the node's plugin tools, as OpenClaw's own
	// node host publishes the tools of the MCP servers it hosts.
	n := cli.waitDescribed(t, nodeID, "with the device's tools", func(n describedNode) bool {
		return slices.Contains(n.toolNames(), "xiaozhi_self_audio_speaker_set_volume")
	})
	for _, tool := range n.NodePluginTools {
		if tool.PluginID != "node-mcp" || tool.Command != "mcp.tools.call.v1" || tool.MCP.Server != "xiaozhi" ||
			tool.MCP.Tool == "" || tool.Description == "" || tool.Parameters["type"] != "object" {
			t.Fatalf("plugin tool as the real gateway keeps it: %+v", tool)
		}
	}
	t.Logf("plugin tools on the real gateway: %v", n.toolNames())
	if n.LastSeenReason != "connect" {
		t.Fatalf("presence: lastSeenReason %q, want connect (node.presence.alive)", n.LastSeenReason)
	}
	if st := home.Upstreams[0].Status(); len(st) != 1 || st[0].Tools != len(n.NodePluginTools) || st[0].ToolsError != "" {
		t.Fatalf("link status %+v, %d tools upstream", st, len(n.NodePluginTools))
	}

	// An agent tool call as OpenClaw's agents make it: node.invoke of the
	// descriptor's command with {server, tool, arguments}.
	var out json.RawMessage
	var err error
	eventually.Within(t, time.Minute, "node.invoke mcp.tools.call.v1 through the real gateway", func() bool {
		out, err = cli.call("node.invoke", map[string]any{"nodeId": nodeID, "command": "mcp.tools.call.v1",
			"params":         map[string]any{"server": "xiaozhi", "tool": "self.audio_speaker.set_volume", "arguments": map[string]any{"volume": 42}},
			"idempotencyKey": "agent-tool-call-1"})
		return err == nil
	})
	if dev.Volume() != 42 {
		t.Fatalf("agent-style call: volume %d\n%s", dev.Volume(), out)
	}

	// And through the gateway's own tool dispatcher, by the agent tool's
	// name.
	out, err = cli.call("tools.invoke", map[string]any{"name": "xiaozhi_self_audio_speaker_set_volume",
		"args": map[string]any{"volume": 55}})
	var invoked struct {
		OK       bool   `json:"ok"`
		ToolName string `json:"toolName"`
	}
	_ = json.Unmarshal(out, &invoked)
	if err != nil || dev.Volume() != 55 || !invoked.OK || invoked.ToolName != "xiaozhi_self_audio_speaker_set_volume" {
		t.Fatalf("tools.invoke of the agent tool: volume %d, %v\n%s", dev.Volume(), err, out)
	}

	// xiaoclaw's policy still decides: a deny rule for the upstream
	// refuses the agent tool, and the device is not reached.
	if _, err := home.Tenancy.Manager.AddRule(context.Background(), tenancy.Rule{Tenant: DevTenant, Effect: tenancy.EffectDeny,
		Subject: upstream.Principal("ref"), Object: "*", Action: "mcp.tools.call:self.screen.set_theme"}); err != nil {
		t.Fatal(err)
	}
	theme, calls := dev.Theme(), dev.Requests("tools/call")
	out, err = cli.call("tools.invoke", map[string]any{"name": "xiaozhi_self_screen_set_theme", "args": map[string]any{"theme": "sepia"}})
	invoked.OK = true
	_ = json.Unmarshal(out, &invoked)
	if err != nil || invoked.OK { // OpenClaw's tools.invoke says only "tool execution failed"
		t.Fatalf("tools.invoke of a denied tool: %v\n%s", err, out)
	}
	// The same call as the agent tool sends it names the reason.
	out, err = cli.call("node.invoke", map[string]any{"nodeId": nodeID, "command": "mcp.tools.call.v1",
		"params":         map[string]any{"server": "xiaozhi", "tool": "self.screen.set_theme", "arguments": map[string]any{"theme": "sepia"}},
		"idempotencyKey": "agent-tool-call-2"})
	if err == nil || !strings.Contains(err.Error(), "POLICY_DENIED") {
		t.Fatalf("node.invoke of a denied tool: %v\n%s", err, out)
	}
	if dev.Theme() != theme || dev.Requests("tools/call") != calls {
		t.Fatalf("a denied call reached the device: theme %q", dev.Theme())
	}

	// The catalog changes on the device: the new tool appears upstream.
	dev.SetExtraTools(1)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := dev.Notify(ctx, "notifications/tools/list_changed", nil); err != nil {
		t.Fatal(err)
	}
	cli.waitDescribed(t, nodeID, "with the new tool", func(n describedNode) bool {
		return slices.Contains(n.toolNames(), "xiaozhi_self_sim_extra_0001")
	})

	// A device notification goes up as node.event; the stock gateway takes
	// it (validated, dispatched) and says it has no handler for it.
	if err := dev.Notify(ctx, "notifications/message", json.RawMessage(`{"level":"info","data":"button pressed"}`)); err != nil {
		t.Fatal(err)
	}
	var ack upstream.EventAck
	eventually.Within(t, waitLimit, "the real gateway's answer to the notification's node.event", func() bool {
		st := home.Upstreams[0].Status()
		if len(st) == 1 && st[0].LastEvent != nil && st[0].LastEvent.Event == "mcp.notification" {
			ack = *st[0].LastEvent
			return true
		}
		return false
	})
	if ack.Error != "" || ack.Handled || ack.Reason != "unsupported_event" {
		t.Fatalf("node.event mcp.notification answered %+v", ack)
	}
	t.Logf("node.event mcp.notification: the real gateway answered handled=%v reason=%s", ack.Handled, ack.Reason)

	// The device leaves: the node goes offline and its tools with it.
	if err := dev.Close(); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	cli.waitDescribed(t, nodeID, "offline", func(n describedNode) bool {
		return !n.Connected && len(n.NodePluginTools) == 0
	})
	if strings.Contains(string(out), refGatewayToken) {
		t.Fatal("the token leaked into an answer")
	}
}
