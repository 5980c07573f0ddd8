package devstack

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw/internal/mcpstdio"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
)

// headerTransport adds fixed headers to every request.
type headerTransport map[string]string

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h {
		r.Header.Set(k, v)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// mcpConnect opens an MCP session on a gateway with the Go SDK's client.
func mcpConnect(t testing.TB, url string, headers map[string]string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "e2e-agent", Version: "0.9"}, opts)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: headerTransport(headers)}}, nil)
	if err != nil {
		t.Fatalf("mcp connect %s: %v", url, err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func mcpURL(st *Stack, i int, path string) string {
	return "http" + strings.TrimPrefix(st.GatewayURL(i), "ws") + path
}

func mcpTools(t testing.TB, cs *mcp.ClientSession) map[string]*mcp.Tool {
	t.Helper()
	out := map[string]*mcp.Tool{}
	for tool, err := range cs.Tools(context.Background(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		out[tool.Name] = tool
	}
	return out
}

// toolOf finds the exposed name of a node's tool.
func toolOf(tools map[string]*mcp.Tool, node, tool string) string {
	for name, t := range tools {
		if t.Meta["xiaoclaw/nodeId"] == node && t.Meta["xiaoclaw/tool"] == tool {
			return name
		}
	}
	return ""
}

func resultText(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// TestMCPEndToEnd drives simulated devices through the gateway's MCP
// endpoint with the official Go SDK client: the tools are listed under
// valid names, a call changes the device, a device error, a policy denial
// and a --when denial come back as tool errors, a denied tool is not
// listed, the audit row says the call came over MCP from which client with
// the caller's trace id, and list_changed follows devices joining and
// leaving.
func TestMCPEndToEnd(t *testing.T) {
	st := startStack(t, Config{})
	ctx := context.Background()
	m := st.Tenancy.Manager
	acme := newTenant(t, st, "acme")
	dev, err := tenantDevice(t, st, acme.id, 0, "02:0e:00:00:00:01")
	if err != nil {
		t.Fatal(err)
	}
	node := nodeID(dev)
	for _, r := range []tenancy.Rule{
		{Tenant: acme.id, Effect: "deny", Subject: "*", Object: "*", Action: "mcp.tools.call:self.reboot"},
		{Tenant: acme.id, Effect: "deny", Subject: "*", Object: node, Action: "mcp.tools.call:self.audio_speaker.set_volume", When: "volume > 80"},
	} {
		if _, err := m.AddRule(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	var changed atomic.Int64
	cs := mcpConnect(t, mcpURL(st, 0, "/mcp"), map[string]string{
		"Authorization": "Bearer " + acme.token,
		"traceparent":   "00-" + traceID + "-00f067aa0ba902b7-01",
	}, &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { changed.Add(1) }})

	// The device is registered through the shim and the registry watch:
	// its tools are listed once that is done.
	var tools map[string]*mcp.Tool
	waitFor(t, func() bool {
		tools = mcpTools(t, cs)
		return toolOf(tools, node, "self.audio_speaker.set_volume") != "" && toolOf(tools, node, "self.get_device_status") != ""
	})
	setVolume := toolOf(tools, node, "self.audio_speaker.set_volume")
	if toolOf(tools, node, "self.reboot") != "" {
		t.Error("self.reboot is listed though the policy denies it")
	}

	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: setVolume, Arguments: map[string]any{"volume": 35},
		Meta: mcp.Meta{"xiaoclaw/idempotencyKey": "mcp-e2e-1"}})
	if err != nil || res.IsError {
		t.Fatalf("set_volume: %v %s", err, resultText(res))
	}
	if dev.Volume() != 35 {
		t.Errorf("device volume %d after the call, want 35", dev.Volume())
	}
	row := auditRow(t, st, acme.id, node, "mcp-e2e-1")
	if row.Outcome != "ok" || row.Tool != "self.audio_speaker.set_volume" || !strings.Contains(row.Detail, "via mcp client e2e-agent/0.9") ||
		row.TraceID != traceID {
		t.Errorf("audit row %+v: want ok, the tool, via mcp client e2e-agent/0.9, trace %s", row, traceID)
	}

	// The --when rule denies above 80 and the error names it.
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: setVolume, Arguments: map[string]any{"volume": 95}})
	if err != nil || !res.IsError || !strings.Contains(resultText(res), "denied by policy rule") {
		t.Errorf("a --when denial: %v %q", err, resultText(res))
	}
	// The device refuses a brightness outside its schema's range: its
	// message comes back as a tool error.
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: toolOf(tools, node, "self.screen.set_brightness"), Arguments: map[string]any{"brightness": -5}})
	if err != nil || !res.IsError || resultText(res) == "" || strings.Contains(resultText(res), "DEVICE_ERROR") {
		t.Errorf("a device error: %v %q, want isError with the device's message", err, resultText(res))
	}

	// Arguments over the invoke path's params cap are refused before the
	// device, as a WebSocket node.invoke's.
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: setVolume, Arguments: map[string]any{"volume": 1, "pad": strings.Repeat("x", 200<<10)}})
	if err != nil || !res.IsError || !strings.Contains(resultText(res), "exceed the limit") || dev.Volume() != 35 {
		t.Errorf("oversized arguments: %v %q, volume %d", err, resultText(res), dev.Volume())
	}

	// A second device joins, then leaves: the session hears both.
	before := changed.Load()
	dev2, err := tenantDevice(t, st, acme.id, 0, "02:0e:00:00:00:02")
	if err != nil {
		t.Fatal(err)
	}
	var tools2 map[string]*mcp.Tool
	waitFor(t, func() bool {
		tools2 = mcpTools(t, cs)
		return changed.Load() > before && toolOf(tools2, nodeID(dev2), "self.get_device_status") != ""
	})
	before = changed.Load()
	dev2.Close()
	waitFor(t, func() bool {
		return changed.Load() > before && toolOf(mcpTools(t, cs), nodeID(dev2), "self.get_device_status") == ""
	})

	// A call to the device after it left is a clear tool error.
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: toolOf(tools2, nodeID(dev2), "self.get_device_status")})
	if err != nil || !res.IsError || !strings.Contains(resultText(res), "offline") {
		t.Errorf("a call to a device that left: %v %q, want a tool error saying it is offline", err, resultText(res))
	}
}

// TestMCPAuth: no token and a wrong token answer 401 with a Bearer
// challenge; a tenant's token sees only its own devices.
func TestMCPAuth(t *testing.T) {
	st := startStack(t, Config{})
	acme, bravo := newTenant(t, st, "acme"), newTenant(t, st, "bravo")
	if _, err := tenantDevice(t, st, acme.id, 0, "02:0e:00:00:01:01"); err != nil {
		t.Fatal(err)
	}
	for _, token := range []string{"", "not-a-token"} {
		req, _ := http.NewRequest(http.MethodPost, mcpURL(st, 0, "/mcp"), strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer ") {
			t.Errorf("token %q: %d %q", token, resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
		}
	}
	a := mcpConnect(t, mcpURL(st, 0, "/mcp"), map[string]string{"Authorization": "Bearer " + acme.token}, nil)
	waitFor(t, func() bool { return len(mcpTools(t, a)) > 0 })
	b := mcpConnect(t, mcpURL(st, 0, "/mcp"), map[string]string{"Authorization": "Bearer " + bravo.token}, nil)
	if n := len(mcpTools(t, b)); n != 0 {
		t.Errorf("bravo sees %d tools of acme's device", n)
	}
}

// TestMCPScopes: a group scope serves the nodes of the tenant's policy
// group (the policy engine's groups), a node scope one node under the
// device's own tool names.
func TestMCPScopes(t *testing.T) {
	st := startStack(t, Config{})
	acme := newTenant(t, st, "acme")
	in, err := tenantDevice(t, st, acme.id, 0, "02:0e:00:00:02:01")
	if err != nil {
		t.Fatal(err)
	}
	out, err := tenantDevice(t, st, acme.id, 0, "02:0e:00:00:02:02")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Tenancy.Manager.SetGroup(context.Background(), acme.id, "kitchen", []string{nodeID(in)}); err != nil {
		t.Fatal(err)
	}
	auth := map[string]string{"Authorization": "Bearer " + acme.token}
	all := mcpConnect(t, mcpURL(st, 0, "/mcp"), auth, nil)
	waitFor(t, func() bool {
		tools := mcpTools(t, all)
		return toolOf(tools, nodeID(in), "self.get_device_status") != "" && toolOf(tools, nodeID(out), "self.get_device_status") != ""
	})
	group := mcpTools(t, mcpConnect(t, mcpURL(st, 0, "/mcp/groups/kitchen"), auth, nil))
	if toolOf(group, nodeID(in), "self.get_device_status") == "" || toolOf(group, nodeID(out), "self.get_device_status") != "" {
		t.Errorf("the kitchen group lists %d tools: want the member's only", len(group))
	}
	node := mcpConnect(t, mcpURL(st, 0, "/mcp/nodes/"+nodeID(out)), auth, nil)
	if _, ok := mcpTools(t, node)["self.audio_speaker.set_volume"]; !ok {
		t.Error("a node scope does not use the device's own tool names")
	}
	res, err := node.CallTool(context.Background(), &mcp.CallToolParams{Name: "self.audio_speaker.set_volume", Arguments: map[string]any{"volume": 12}})
	if err != nil || res.IsError || out.Volume() != 12 {
		t.Errorf("a node-scoped call: %v %+v, volume %d", err, res, out.Volume())
	}
}

// TestMCPStdio runs `xiaoclaw mcp`'s server on pipes against a gateway and
// talks to it with the Go SDK's client: the tools, a call, a bad token.
func TestMCPStdio(t *testing.T) {
	st := startStack(t, Config{})
	dev := connectDevices(t, st, 0, 1, 31, nil)[0]
	endpoint, err := mcpstdio.EndpointURL(st.GatewayURL(0), "/mcp")
	if err != nil {
		t.Fatal(err)
	}
	connect := func(token string) (*mcp.ClientSession, error) {
		cr, sw := io.Pipe()
		sr, cw := io.Pipe()
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		go func() {
			_ = mcpstdio.Serve(ctx, mcpstdio.Config{Endpoint: endpoint, Token: token, Version: "test"}, sr, sw)
		}()
		c := mcp.NewClient(&mcp.Implementation{Name: "stdio-test", Version: "1"}, nil)
		cctx, ccancel := context.WithTimeout(ctx, waitLimit)
		defer ccancel()
		return c.Connect(cctx, &mcp.IOTransport{Reader: cr, Writer: cw}, nil)
	}
	cs, err := connect(testOperatorToken)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	var setVolume string
	waitFor(t, func() bool {
		setVolume = toolOf(mcpTools(t, cs), nodeID(dev), "self.audio_speaker.set_volume")
		return setVolume != ""
	})
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: setVolume, Arguments: map[string]any{"volume": 23}})
	if err != nil || res.IsError || dev.Volume() != 23 {
		t.Errorf("a call over stdio: %v %+v, volume %d", err, res, dev.Volume())
	}
	if _, err := connect("wrong-token"); err == nil || !strings.Contains(err.Error(), "401") && !strings.Contains(err.Error(), "Unauthorized") {
		t.Errorf("a bad token over stdio: %v, want the gateway's 401", err)
	}
}
