package devstack

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/shim/upstream"
)

const upstreamAdminToken = "global-admin-token-for-upstream-tests"

// adminCall sends an admin API request to the stack's first gateway.
func adminCall(t *testing.T, st *Stack, method, path string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, "http"+strings.TrimPrefix(st.GatewayURL(0), "ws")+path, r)
	req.Header.Set("Authorization", "Bearer "+upstreamAdminToken)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	return res.StatusCode, raw
}

// heldLinks lists the nodes whose links are online, over every worker of
// the stack (the lease bucket).
func heldLinks(t *testing.T, st *Stack) []string {
	t.Helper()
	nc, err := st.Connect("status-reader")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	sts, err := upstream.ReadStatus(context.Background(), nc)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, s := range sts {
		if s.State == upstream.StateOnline {
			out = append(out, s.NodeID)
		}
	}
	slices.Sort(out)
	return out
}

// connectedUpstream counts the nodes connected to an upstream stack that
// has no devices of its own: the published ones.
func connectedUpstream(t *testing.T, remote *occlient.Client) int {
	t.Helper()
	n := 0
	for _, node := range listNodes(t, remote) {
		if node.Connected {
			n++
		}
	}
	return n
}

// TestUpstreamAddedThroughTheAdminAPI adds an upstream (a second stack's
// gateway) to the dev tenant through the admin API; the stack's shims,
// started without any upstream flag, publish the device there; a call
// from there reaches it as upstream:<name>, a deny rule for that principal
// refuses the next; removing the upstream takes the node away.
func TestUpstreamAddedThroughTheAdminAPI(t *testing.T) {
	up := startStack(t, Config{})
	home := startStack(t, Config{AdminToken: upstreamAdminToken, Shims: 2, Gateways: 2})

	status, raw := adminCall(t, home, "POST", "/api/tenants/"+DevTenant+"/upstreams",
		map[string]any{"name": "lab", "url": up.GatewayURL(0), "token": testOperatorToken})
	if status != http.StatusCreated || strings.Contains(string(raw), testOperatorToken) || strings.Contains(string(raw), "xcu_") {
		t.Fatalf("add upstream: %d %s (no secret, no caller token in the answer)", status, raw)
	}

	ctx := context.Background()
	dev := connectDevices(t, home, 0, 1, 7, nil)[0]
	remote := operator(t, up.GatewayURL(0))
	n := waitUpstreamNode(t, remote)
	if _, err := callTool(ctx, remote, n.NodeID, "self.audio_speaker.set_volume", map[string]int{"volume": 33}, 5*time.Second); err != nil {
		t.Fatalf("invoke through the upstream: %v", err)
	}
	if dev.Volume() != 33 {
		t.Fatalf("device volume %d", dev.Volume())
	}

	status, raw = adminCall(t, home, "POST", "/api/tenants/"+DevTenant+"/policy/rules", map[string]any{"effect": "deny",
		"subject": "upstream:lab", "object": "*", "action": "mcp.tools.call:self.audio_speaker.set_volume"})
	if status != http.StatusCreated {
		t.Fatalf("deny rule: %d %s", status, raw)
	}
	var err error
	eventually.Within(t, waitLimit, "the rule refuses the upstream's call", func() bool {
		_, err = callTool(ctx, remote, n.NodeID, "self.audio_speaker.set_volume", map[string]int{"volume": 90}, 5*time.Second)
		return err != nil
	})
	if !strings.Contains(err.Error(), "POLICY_DENIED") {
		t.Fatalf("want the upstream's call refused by the rule for upstream:lab, got %v", err)
	}
	if got := dev.Requests("tools/call"); got != 1 || dev.Volume() != 33 {
		t.Fatalf("device saw %d tool calls (volume %d), want only the allowed one", got, dev.Volume())
	}

	if status, raw := adminCall(t, home, "DELETE", "/api/tenants/"+DevTenant+"/upstreams/lab", nil); status != http.StatusNoContent {
		t.Fatalf("remove upstream: %d %s", status, raw)
	}
	eventually.Within(t, waitLimit, "node gone upstream and links closed", func() bool {
		return connectedUpstream(t, remote) == 0 && len(heldLinks(t, home)) == 0
	})
}

// Publish selection: nodes publishes the listed device only; group the
// group's members, following the group as it changes.
func TestStoredUpstreamPublishesTheSelectedNodes(t *testing.T) {
	up := startStack(t, Config{})
	home := startStack(t, Config{AdminToken: upstreamAdminToken})
	devs := connectDevices(t, home, 0, 2, 11, nil)
	a, b := nodeID(devs[0]), nodeID(devs[1])
	remote := operator(t, up.GatewayURL(0))
	tenantPath := "/api/tenants/" + DevTenant

	if status, raw := adminCall(t, home, "POST", tenantPath+"/upstreams", map[string]any{"name": "listed",
		"url": up.GatewayURL(0), "token": testOperatorToken, "publish": map[string]any{"mode": "nodes", "nodes": []string{b}}}); status != http.StatusCreated {
		t.Fatalf("add: %d %s", status, raw)
	}
	eventually.Within(t, waitLimit, "only the listed device published", func() bool {
		return slices.Equal(heldLinks(t, home), []string{b}) && connectedUpstream(t, remote) == 1
	})
	if status, raw := adminCall(t, home, "DELETE", tenantPath+"/upstreams/listed", nil); status != http.StatusNoContent {
		t.Fatalf("remove: %d %s", status, raw)
	}

	if status, raw := adminCall(t, home, "PUT", tenantPath+"/groups/kitchen", map[string]any{"nodes": []string{a}}); status != http.StatusOK {
		t.Fatalf("group: %d %s", status, raw)
	}
	if status, raw := adminCall(t, home, "POST", tenantPath+"/upstreams", map[string]any{"name": "grouped",
		"url": up.GatewayURL(0), "token": testOperatorToken, "publish": map[string]any{"mode": "group", "group": "kitchen"}}); status != http.StatusCreated {
		t.Fatalf("add: %d %s", status, raw)
	}
	eventually.Within(t, waitLimit, "the group's member published", func() bool {
		return slices.Equal(heldLinks(t, home), []string{a}) && connectedUpstream(t, remote) == 1
	})
	if status, raw := adminCall(t, home, "PUT", tenantPath+"/groups/kitchen", map[string]any{"nodes": []string{b}}); status != http.StatusOK {
		t.Fatalf("group: %d %s", status, raw)
	}
	eventually.Within(t, waitLimit, "the new member published, the old one withdrawn", func() bool {
		return slices.Equal(heldLinks(t, home), []string{b}) && connectedUpstream(t, remote) == 1
	})
}

// A lost bucket entry comes back with a new caller token, and calls from
// the upstream work again with it.
func TestLostUpstreamEntryGetsANewCallerToken(t *testing.T) {
	up := startStack(t, Config{})
	home := startStack(t, Config{AdminToken: upstreamAdminToken})
	if status, raw := adminCall(t, home, "POST", "/api/tenants/"+DevTenant+"/upstreams",
		map[string]any{"name": "lab", "url": up.GatewayURL(0), "token": testOperatorToken}); status != http.StatusCreated {
		t.Fatalf("add: %d %s", status, raw)
	}
	dev := connectDevices(t, home, 0, 1, 5, nil)[0]
	remote := operator(t, up.GatewayURL(0))
	n := waitUpstreamNode(t, remote)

	nc, err := home.Connect("bucket-admin")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(context.Background(), wire.BucketUpstreams)
	if err != nil {
		t.Fatal(err)
	}
	entry := func() (wire.UpstreamEntry, bool) {
		e, err := kv.Get(context.Background(), wire.UpstreamKey(DevTenant, "lab"))
		if err != nil {
			return wire.UpstreamEntry{}, false
		}
		u, err := wire.ParseUpstreamEntry(e.Value())
		return u, err == nil
	}
	first, ok := entry()
	if !ok {
		t.Fatal("no bucket entry for the added upstream")
	}
	if err := kv.Purge(context.Background(), wire.UpstreamKey(DevTenant, "lab")); err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	var second wire.UpstreamEntry
	eventually.Within(t, 30*time.Second, "entry recreated", func() bool {
		second, ok = entry()
		return ok && second.CallerToken != first.CallerToken
	})
	t.Logf("entry recreated %s after it was lost", time.Since(started).Round(time.Millisecond))
	var callErr error
	eventually.Within(t, waitLimit, "a call through the upstream works with the new token", func() bool {
		_, callErr = callTool(context.Background(), remote, n.NodeID, "self.audio_speaker.set_volume", map[string]int{"volume": 44}, 5*time.Second)
		return callErr == nil
	})
	if dev.Volume() != 44 {
		t.Fatalf("device volume %d", dev.Volume())
	}
}
