package devstack

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/services/shim/upstream"
)

// upstreamNode is a node of the upstream gateway's node.list.
type upstreamNode struct {
	NodeID       string   `json:"nodeId"`
	DisplayName  string   `json:"displayName"`
	Platform     string   `json:"platform"`
	DeviceFamily string   `json:"deviceFamily"`
	Connected    bool     `json:"connected"`
	Commands     []string `json:"commands"`
}

// waitUpstreamNode polls the upstream's node.list for a connected node of
// platform xiaozhi.
func waitUpstreamNode(t *testing.T, c *occlient.Client) upstreamNode {
	t.Helper()
	var raw json.RawMessage
	var found upstreamNode
	if !eventually.Until(waitLimit, func() bool {
		var err error
		if raw, err = c.Call(context.Background(), "node.list", map[string]any{}); err != nil {
			t.Fatalf("node.list upstream: %v", err)
		}
		var res struct {
			Nodes []upstreamNode `json:"nodes"`
		}
		_ = json.Unmarshal(raw, &res)
		for _, n := range res.Nodes {
			if n.Platform == upstream.Platform && n.Connected {
				found = n
				return true
			}
		}
		return false
	}) {
		t.Fatalf("no xiaozhi node connected upstream within %s: %s", waitLimit, raw)
	}
	return found
}

// TestUpstreamModeThroughAnOpenClawGateway publishes a stack's devices to
// another gateway that speaks the OpenClaw protocol (a second xiaoclaw
// stack here; the interop test uses the real OpenClaw gateway): an
// operator there reaches the device, and the publishing tenant's policy
// decides on every call as the principal upstream:<name>.
func TestUpstreamModeThroughAnOpenClawGateway(t *testing.T) {
	up := startStack(t, Config{})
	home := startStack(t, Config{Upstream: upstream.Upstream{Name: "lab", URL: up.GatewayURL(0), Token: testOperatorToken}})
	started := time.Now()
	dev := connectDevices(t, home, 0, 1, 7, nil)[0]
	remote := operator(t, up.GatewayURL(0))
	n := waitUpstreamNode(t, remote)
	t.Logf("device hello to node listed upstream: %s", time.Since(started).Round(time.Millisecond))
	if n.DisplayName == "" || !strings.Contains(strings.Join(n.Commands, ","), "mcp.tools.call") {
		t.Fatalf("upstream node %+v", n)
	}
	// The upstream lists the node before its hello-ok reaches the link.
	var st []upstream.Status
	if !eventually.Until(waitLimit, func() bool {
		st = home.Upstreams[0].Status()
		return len(st) == 1 && st[0].State == upstream.StateOnline
	}) {
		t.Fatalf("link status %+v", st)
	}
	if st[0].DeviceID != n.NodeID {
		t.Fatalf("link status %+v, upstream node %s", st, n.NodeID)
	}
	t.Logf("link online after %d ms", st[0].OnlineAfterMs)

	ctx := context.Background()
	raw, err := callTool(ctx, remote, n.NodeID, "self.audio_speaker.set_volume", map[string]int{"volume": 42}, 5*time.Second)
	if err != nil {
		t.Fatalf("invoke through the upstream: %v", err)
	}
	if dev.Volume() != 42 || !strings.Contains(string(raw), `"content"`) {
		t.Fatalf("device volume %d, result %s", dev.Volume(), raw)
	}

	// A deny rule for the upstream principal in the publishing tenant
	// refuses the call; the tenant's own operator is not affected.
	if _, err := home.Tenancy.Manager.AddRule(ctx, tenancy.Rule{Tenant: DevTenant, Effect: tenancy.EffectDeny,
		Subject: upstream.Principal("lab"), Object: "*", Action: "mcp.tools.call:self.reboot"}); err != nil {
		t.Fatal(err)
	}
	// The rule reaches the policy cache asynchronously.
	eventually.Until(waitLimit, func() bool {
		_, err = callTool(ctx, remote, n.NodeID, "self.reboot", map[string]any{}, 5*time.Second)
		return err != nil
	})
	if err == nil || !strings.Contains(err.Error(), "POLICY_DENIED") || !strings.Contains(err.Error(), "denied by policy") {
		t.Fatalf("want the upstream call refused by policy, got %v", err)
	}
	if got := dev.Requests("tools/call"); got != 1 {
		t.Fatalf("device saw %d tool calls, want only the allowed one", got)
	}
	local := operator(t, home.GatewayURL(0))
	if _, err := callTool(ctx, local, nodeID(dev), "self.get_device_status", map[string]any{}, 5*time.Second); err != nil {
		t.Fatalf("the tenant's own operator: %v", err)
	}

	// The device leaves: its node goes offline upstream.
	dev.Close()
	if !eventually.Until(waitLimit, func() bool {
		if raw, err = remote.Call(ctx, "node.list", map[string]any{}); err != nil {
			t.Fatal(err)
		}
		return !strings.Contains(string(raw), `"connected":true`)
	}) {
		t.Fatalf("node still connected upstream after the device left: %s", raw)
	}
}
