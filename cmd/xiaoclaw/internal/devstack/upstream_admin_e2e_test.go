package devstack

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/services/shim/upstream"
)

// TestUpstreamAddedThroughTheAdminAPI adds an upstream (a second stack's
// gateway) to the dev tenant through the admin API, runs a shim upstream
// worker with the stored upstream and the caller token the API answered,
// and checks that the device appears upstream and that a deny rule for
// upstream:<name> refuses the upstream's call.
func TestUpstreamAddedThroughTheAdminAPI(t *testing.T) {
	const adminToken = "global-admin-token-for-upstream-tests"
	up := startStack(t, Config{})
	home := startStack(t, Config{AdminToken: adminToken})
	api := "http" + strings.TrimPrefix(home.GatewayURL(0), "ws")
	post := func(path string, body any) (int, []byte) {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequest("POST", api+path, bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+adminToken)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		raw, _ := io.ReadAll(res.Body)
		return res.StatusCode, raw
	}

	status, raw := post("/api/tenants/"+DevTenant+"/upstreams", map[string]any{"name": "lab", "url": up.GatewayURL(0), "token": testOperatorToken})
	if status != http.StatusCreated || strings.Contains(string(raw), testOperatorToken) {
		t.Fatalf("add upstream: %d %s", status, raw)
	}
	var added struct {
		CallerToken string `json:"callerToken"`
	}
	if err := json.Unmarshal(raw, &added); err != nil || added.CallerToken == "" {
		t.Fatalf("add upstream answered %s", raw)
	}

	// The shim's part: the stored upstream, and the caller token for its calls.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stored, err := home.Tenancy.Store.Upstream(ctx, DevTenant, "lab")
	if err != nil {
		t.Fatal(err)
	}
	nc, err := home.Connect("upstream-admin-test")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	inv := &upstream.GatewayInvoker{URL: home.GatewayURL(0), Tokens: map[string]string{stored.Name: added.CallerToken}}
	defer inv.Close()
	svc, err := upstream.New(upstream.Config{Instance: "admin-test", Invoker: inv,
		Upstreams: []upstream.Upstream{{Name: stored.Name, Tenant: stored.Tenant, URL: stored.URL, Token: stored.Secret}}},
		nc, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	defer func() { cancel(); <-done }()

	dev := connectDevices(t, home, 0, 1, 7, nil)[0]
	remote := operator(t, up.GatewayURL(0))
	n := waitUpstreamNode(t, remote)
	if _, err := callTool(ctx, remote, n.NodeID, "self.audio_speaker.set_volume", map[string]int{"volume": 33}, 5*time.Second); err != nil {
		t.Fatalf("invoke through the upstream: %v", err)
	}
	if dev.Volume() != 33 {
		t.Fatalf("device volume %d", dev.Volume())
	}

	status, raw = post("/api/tenants/"+DevTenant+"/policy/rules", map[string]any{"effect": "deny",
		"subject": "upstream:lab", "object": "*", "action": "mcp.tools.call:self.audio_speaker.set_volume"})
	if status != http.StatusCreated {
		t.Fatalf("deny rule: %d %s", status, raw)
	}
	deadline := time.Now().Add(waitLimit)
	for {
		_, err = callTool(ctx, remote, n.NodeID, "self.audio_speaker.set_volume", map[string]int{"volume": 90}, 5*time.Second)
		if err != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // the rule reaches the policy cache asynchronously
	}
	if err == nil || !strings.Contains(err.Error(), "POLICY_DENIED") {
		t.Fatalf("want the upstream's call refused by the rule for upstream:lab, got %v", err)
	}
	if got := dev.Requests("tools/call"); got != 1 || dev.Volume() != 33 {
		t.Fatalf("device saw %d tool calls (volume %d), want only the allowed one", got, dev.Volume())
	}
}
