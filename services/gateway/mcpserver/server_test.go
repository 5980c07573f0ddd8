package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/toolcall"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/registry"
)

// fakeNodes is an in-memory registry.
type fakeNodes struct {
	mu    sync.Mutex
	nodes map[string]map[string]*registry.Node
	onSet func(tenant, nodeID string, n *registry.Node)
}

func (f *fakeNodes) List(tenant string) []*registry.Node {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*registry.Node
	for _, n := range f.nodes[tenant] {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].NodeID < out[j].NodeID })
	return out
}

func (f *fakeNodes) Get(tenant, id string) *registry.Node {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nodes[tenant][id]
}

func (f *fakeNodes) set(rec wire.NodeRecord) {
	n := registry.NewNode(rec, 1)
	f.mu.Lock()
	if f.nodes == nil {
		f.nodes = map[string]map[string]*registry.Node{}
	}
	if f.nodes[rec.Tenant] == nil {
		f.nodes[rec.Tenant] = map[string]*registry.Node{}
	}
	f.nodes[rec.Tenant][rec.NodeID] = n
	cb := f.onSet
	f.mu.Unlock()
	if cb != nil {
		cb(rec.Tenant, rec.NodeID, n)
	}
}

// device is a node record with the given tools, connected, taking
// mcp.tools.call.
func device(tenant, id, name string, tools ...string) wire.NodeRecord {
	raws := make([]json.RawMessage, len(tools))
	for i, t := range tools {
		raws[i] = json.RawMessage(fmt.Sprintf(`{"name":%q,"description":"does %s","inputSchema":{"type":"object","properties":{"v":{"type":"integer"}}}}`, t, t))
	}
	b, _ := json.Marshal(raws)
	return wire.NodeRecord{NodeID: id, Tenant: tenant, Kind: wire.NodeKindXiaoZhi, DisplayName: name,
		Commands: []string{toolcall.CommandCall, "mcp.tools.list"}, Tools: b, Connected: true}
}

// denyTools denies the listed tool names (and everything of node "locked").
type denyTools map[string]string // tool -> rule id

func (d denyTools) Authorize(_ context.Context, r access.Request) access.Decision {
	if rule, ok := d[r.Tool]; ok {
		return access.Decision{RuleID: rule, Reason: "denied by test"}
	}
	return access.Decision{Allowed: true}
}

type groupMap map[string]map[string]bool

func (g groupMap) GroupMembers(_ context.Context, _, group string) (map[string]bool, bool, error) {
	m, ok := g[group]
	return m, ok, nil
}

// fakeInvoker answers every call with its arguments echoed, or with the
// error set for the tool.
type fakeInvoker struct {
	mu    sync.Mutex
	calls []ToolCall
	fail  map[string]*CallError
}

func (f *fakeInvoker) InvokeTool(_ context.Context, c ToolCall) ToolResult {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
	if e := f.fail[c.Tool]; e != nil {
		return ToolResult{Err: e}
	}
	text, _ := json.Marshal(c.NodeID + " " + c.Tool + " " + string(c.Arguments))
	return ToolResult{Payload: json.RawMessage(`{"content":[{"type":"text","text":` + string(text) + `}],"isError":false}`)}
}

var tokens = access.StaticTokens{
	"op-a":     {Tenant: "acme", ID: "tok_op", Name: "op", Role: access.RoleOperator},
	"viewer-a": {Tenant: "acme", ID: "tok_view", Name: "viewer", Role: access.RoleViewer},
	"op-b":     {Tenant: "beta", ID: "tok_b", Name: "b", Role: access.RoleOperator},
}

type harness struct {
	t     testing.TB
	nodes *fakeNodes
	inv   *fakeInvoker
	srv   *Server
	http  *httptest.Server
}

func newHarness(t testing.TB, cfg Config) *harness {
	t.Helper()
	h := &harness{t: t, nodes: &fakeNodes{}, inv: &fakeInvoker{fail: map[string]*CallError{}}}
	cfg.Auth = tokens
	if cfg.Authorizer == nil {
		cfg.Authorizer = access.AllowAll{}
	}
	cfg.Nodes, cfg.Invoker = h.nodes, h.inv
	if cfg.NotifyDelay == 0 {
		cfg.NotifyDelay = 20 * time.Millisecond
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.srv = srv
	h.nodes.onSet = srv.NodeChanged
	h.http = httptest.NewServer(srv.Handler())
	t.Cleanup(h.http.Close)
	return h
}

// bearer adds an Authorization header to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	r.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	return b.next.RoundTrip(r)
}

// connect opens a session with the Go SDK's client.
func (h *harness) connect(token, path string, opts *mcp.ClientOptions) *mcp.ClientSession {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "go-test", Version: "1.2.3"}, opts)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: h.http.URL + path,
		HTTPClient: &http.Client{Transport: bearer{token, http.DefaultTransport}}}, nil)
	if err != nil {
		h.t.Fatalf("connect %s: %v", path, err)
	}
	h.t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func listAll(t *testing.T, cs *mcp.ClientSession) []*mcp.Tool {
	t.Helper()
	var out []*mcp.Tool
	for tool, err := range cs.Tools(context.Background(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, tool)
	}
	return out
}

func names(tools []*mcp.Tool) []string {
	out := make([]string, len(tools))
	for i, t := range tools {
		out[i] = t.Name
	}
	return out
}

func TestListsConnectedToolsWithValidUniqueNames(t *testing.T) {
	h := newHarness(t, Config{})
	h.nodes.set(device("acme", "xz-1", "Kitchen speaker", "self.audio_speaker.set_volume", "self.get_device_status"))
	h.nodes.set(device("acme", "xz-2", "Kitchen speaker", "self.audio_speaker.set_volume")) // same display name
	h.nodes.set(device("acme", "xz-3", "Desk lamp", "self.light.set"))
	off := device("acme", "xz-4", "Garage", "self.door.open")
	off.Connected = false
	h.nodes.set(off)
	h.nodes.set(device("beta", "xz-9", "Other tenant", "self.secret"))

	tools := listAll(t, h.connect("op-a", "/mcp", nil))
	got := names(tools)
	if len(got) != 4 {
		t.Fatalf("listed %v, want the 4 tools of the 3 connected acme nodes", got)
	}
	seen := map[string]bool{}
	for _, tool := range tools {
		if !ValidToolName(tool.Name) || seen[tool.Name] {
			t.Errorf("name %q invalid or repeated", tool.Name)
		}
		seen[tool.Name] = true
		if tool.Meta[MetaNodeID] == "" || tool.Meta[MetaTool] == "" || !strings.Contains(tool.Title, tool.Meta[MetaNodeID].(string)) {
			t.Errorf("tool %q lacks its node and device tool: meta %v title %q", tool.Name, tool.Meta, tool.Title)
		}
		schema, _ := json.Marshal(tool.InputSchema)
		if !strings.Contains(string(schema), `"properties"`) {
			t.Errorf("tool %q lost its inputSchema: %s", tool.Name, schema)
		}
	}
	if !seen["Desk_lamp__self_light_set"] {
		t.Errorf("the lamp's tool has no plain name: %v", got)
	}
	for _, n := range got {
		if strings.HasPrefix(n, "Kitchen_speaker__self_audio_speaker_set_volume") && n == "Kitchen_speaker__self_audio_speaker_set_volume" {
			t.Errorf("two kitchen speakers share a plain name: %v", got)
		}
	}
	if !seen["Kitchen_speaker__self_get_device_status"] {
		t.Errorf("a tool without a clash lost its plain name: %v", got)
	}
}

func TestToolsListPaginatesWithCursors(t *testing.T) {
	h := newHarness(t, Config{PageSize: 7})
	for i := range 5 {
		tools := make([]string, 5)
		for j := range tools {
			tools[j] = fmt.Sprintf("self.t%d", j)
		}
		h.nodes.set(device("acme", fmt.Sprintf("xz-%d", i), fmt.Sprintf("dev%d", i), tools...))
	}
	cs := h.connect("op-a", "/mcp", nil)
	ctx := context.Background()
	var all []string
	cursor, pages := "", 0
	for {
		res, err := cs.ListTools(ctx, &mcp.ListToolsParams{Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		pages++
		if len(res.Tools) > 7 {
			t.Fatalf("page of %d tools, page size 7", len(res.Tools))
		}
		all = append(all, names(res.Tools)...)
		if res.NextCursor == "" {
			break
		}
		cursor = res.NextCursor
	}
	if len(all) != 25 || pages != 4 {
		t.Fatalf("got %d tools in %d pages, want 25 in 4", len(all), pages)
	}
	if !sort.StringsAreSorted(all) {
		t.Errorf("pages overlap or are out of order: %v", all)
	}
	if _, err := cs.ListTools(ctx, &mcp.ListToolsParams{Cursor: "!!not-ours"}); err == nil || !strings.Contains(err.Error(), "invalid cursor") {
		t.Errorf("a foreign cursor: err %v, want invalid cursor", err)
	}
}

func TestScopesNodeAndGroup(t *testing.T) {
	h := newHarness(t, Config{Groups: groupMap{"kitchen": {"xz-1": true, "xz-2": true}, "empty": {}}})
	h.nodes.set(device("acme", "xz-1", "Kitchen speaker", "self.audio_speaker.set_volume", "self.get_device_status"))
	h.nodes.set(device("acme", "xz-2", "Kitchen light", "self.light.set"))
	h.nodes.set(device("acme", "xz-3", "Desk lamp", "self.light.set"))

	node := listAll(t, h.connect("op-a", "/mcp/nodes/xz-1", nil))
	if got := strings.Join(names(node), ","); got != "self.audio_speaker.set_volume,self.get_device_status" {
		t.Errorf("node scope lists %s, want the device's own names", got)
	}
	group := names(listAll(t, h.connect("op-a", "/mcp/groups/kitchen", nil)))
	if len(group) != 3 || strings.Contains(strings.Join(group, ","), "Desk") {
		t.Errorf("group scope lists %v, want the 3 kitchen tools only", group)
	}
	// A tool outside the scope cannot be called through it.
	cs := h.connect("op-a", "/mcp/groups/kitchen", nil)
	if _, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "Desk_lamp__self_light_set"}); err == nil {
		t.Error("a group session called a tool of a node outside the group")
	}
	nodeSess := h.connect("op-a", "/mcp/nodes/xz-1", nil)
	res, err := nodeSess.CallTool(context.Background(), &mcp.CallToolParams{Name: "self.get_device_status", Arguments: map[string]any{"v": 1}})
	if err != nil || res.IsError {
		t.Fatalf("node-scoped call: %v %+v", err, res)
	}
	if c := h.inv.calls[len(h.inv.calls)-1]; c.NodeID != "xz-1" || c.Tool != "self.get_device_status" || string(c.Arguments) != `{"v":1}` {
		t.Errorf("invoked %+v", c)
	}

	for _, path := range []string{"/mcp/nodes/xz-9", "/mcp/groups/nope", "/mcp/other"} {
		resp := h.post(t, path, "op-a", initializeBody)
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("POST %s: %d, want 404", path, resp.StatusCode)
		}
	}
	// Another tenant's node is as unknown as a node that does not exist.
	h.nodes.set(device("beta", "xz-b", "B", "self.x"))
	if resp := h.post(t, "/mcp/nodes/xz-b", "op-a", initializeBody); resp.StatusCode != http.StatusNotFound {
		t.Errorf("another tenant's node: %d, want 404", resp.StatusCode)
	}
}

func TestPolicyHidesToolsAndNamesTheRuleOfADenial(t *testing.T) {
	h := newHarness(t, Config{Authorizer: denyTools{"self.door.open": "r-doors"}})
	h.nodes.set(device("acme", "xz-1", "Garage", "self.door.open", "self.light.set"))
	cs := h.connect("op-a", "/mcp", nil)
	got := names(listAll(t, cs))
	if strings.Join(got, ",") != "Garage__self_light_set" {
		t.Errorf("listed %v: a tool the principal may never call is shown", got)
	}
	h.inv.fail["self.light.set"] = &CallError{Code: "DENIED", Message: "denied by policy rule r-when: brightness above 50"}
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "Garage__self_light_set", Arguments: map[string]any{"v": 99}})
	if err != nil {
		t.Fatal(err)
	}
	if !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "r-when") {
		t.Errorf("a denial came back as %+v, want a tool error naming the rule", res)
	}
}

func TestCallResultsAndErrors(t *testing.T) {
	h := newHarness(t, Config{})
	h.nodes.set(device("acme", "xz-1", "Speaker", "self.ok", "self.broken"))
	h.inv.fail["self.broken"] = &CallError{Code: "DEVICE_ERROR", Message: "volume out of range"}
	cs := h.connect("op-a", "/mcp", nil)
	ctx := context.Background()

	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "Speaker__self_ok", Arguments: map[string]any{"v": 3},
		Meta: mcp.Meta{MetaIdempotencyKey: "k-1"}})
	if err != nil || res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, `xz-1 self.ok {"v":3}`) {
		t.Fatalf("call: %v %+v", err, res)
	}
	c := h.inv.calls[0]
	if c.IdempotencyKey != "k-1" || c.Client != "go-test/1.2.3" || c.Principal.ID != "tok_op" || c.SessionID == "" ||
		c.Traceparent != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" {
		t.Errorf("the invoke path got %+v", c)
	}
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "Speaker__self_broken"})
	if err != nil || !res.IsError || res.Content[0].(*mcp.TextContent).Text != "volume out of range" {
		t.Errorf("a device error: %v %+v, want isError with the device's message", err, res)
	}
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "no_such_tool"}); err == nil || !strings.Contains(err.Error(), "unknown tool") {
		t.Errorf("unknown tool: %v", err)
	}
	// A viewer lists but does not call.
	vs := h.connect("viewer-a", "/mcp", nil)
	if len(listAll(t, vs)) != 2 {
		t.Error("a viewer does not see the tools")
	}
	res, err = vs.CallTool(ctx, &mcp.CallToolParams{Name: "Speaker__self_ok"})
	if err != nil || !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "viewer") {
		t.Errorf("a viewer's call: %v %+v", err, res)
	}
	if len(h.inv.calls) != 2 {
		t.Errorf("%d calls reached the invoke path, want 2", len(h.inv.calls))
	}
}

const initializeBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}`

func (h *harness) post(t *testing.T, path, token, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, h.http.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp
}

func TestAuthFailures(t *testing.T) {
	h := newHarness(t, Config{})
	for _, tc := range []struct{ token, wantErr string }{{"", ""}, {"wrong", `error="invalid_token"`}} {
		resp := h.post(t, "/mcp", tc.token, initializeBody)
		www := resp.Header.Get("WWW-Authenticate")
		if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(www, "Bearer ") ||
			!strings.Contains(www, "resource_metadata=") || !strings.Contains(www, tc.wantErr) {
			t.Errorf("token %q: %d %q, want 401 with a Bearer challenge %s", tc.token, resp.StatusCode, www, tc.wantErr)
		}
	}
	// The metadata the challenge points to.
	resp, err := http.Get(h.http.URL + ProtectedResourcePath)
	if err != nil {
		t.Fatal(err)
	}
	var md map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&md)
	resp.Body.Close()
	if md["resource"] != h.http.URL+"/mcp" {
		t.Errorf("resource metadata %v", md)
	}

	// A session cannot be used with another tenant's token or on another path.
	resp = h.post(t, "/mcp", "op-a", initializeBody)
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != http.StatusOK || sid == "" {
		t.Fatalf("initialize: %d session %q", resp.StatusCode, sid)
	}
	for _, tc := range []struct{ token, path string }{{"op-b", "/mcp"}, {"viewer-a", "/mcp"}, {"op-a", "/mcp/groups/x"}} {
		req, _ := http.NewRequest(http.MethodPost, h.http.URL+tc.path, strings.NewReader(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Authorization", "Bearer "+tc.token)
		req.Header.Set("Mcp-Session-Id", sid)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound {
			t.Errorf("session of op-a used by %s on %s: %d, want 404", tc.token, tc.path, resp.StatusCode)
		}
	}
	// DELETE ends the session.
	req, _ := http.NewRequest(http.MethodDelete, h.http.URL+"/mcp", nil)
	req.Header.Set("Authorization", "Bearer op-a")
	req.Header.Set("Mcp-Session-Id", sid)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("DELETE: %d", resp.StatusCode)
	}
	eventually.True(t, "the session to be forgotten", func() bool { return h.srv.Sessions() == 0 })
}

func TestListChangedReachesTheSessionsInScope(t *testing.T) {
	h := newHarness(t, Config{Groups: groupMap{"kitchen": {"xz-1": true}}})
	h.nodes.set(device("acme", "xz-1", "Kitchen", "self.a"))
	h.nodes.set(device("acme", "xz-2", "Desk", "self.b"))
	eventually.True(t, "the setup's changes to be flushed", h.srv.notify.idle)
	type counter struct {
		mu sync.Mutex
		n  int
	}
	open := func(token, path string) *counter {
		c := &counter{}
		h.connect(token, path, &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			c.mu.Lock()
			c.n++
			c.mu.Unlock()
		}})
		return c
	}
	count := func(c *counter) int { c.mu.Lock(); defer c.mu.Unlock(); return c.n }
	tenant, kitchen, desk, other := open("op-a", "/mcp"), open("op-a", "/mcp/groups/kitchen"), open("op-a", "/mcp/nodes/xz-2"), open("op-b", "/mcp")
	eventually.True(t, "the sessions to register", func() bool { return h.srv.Sessions() == 4 })

	// The desk goes offline: the tenant and the desk's node session hear it.
	off := device("acme", "xz-2", "Desk", "self.b")
	off.Connected = false
	h.nodes.set(off)
	eventually.True(t, "list_changed for the desk", func() bool { return count(tenant) == 1 && count(desk) == 1 })
	// A record change the catalog does not show is not announced.
	off.LastSeenMs = 42
	h.nodes.set(off)
	// A kitchen change reaches the tenant and the kitchen group.
	h.nodes.set(device("acme", "xz-1", "Kitchen", "self.a", "self.c"))
	eventually.True(t, "list_changed for the kitchen", func() bool { return count(tenant) == 2 && count(kitchen) == 1 })
	// Fences: a later change that the desk's session and the other
	// tenant's session each hear. A session hears its notifications in
	// order, so a wrong one from the changes above arrives before its fence.
	h.nodes.set(device("acme", "xz-2", "Desk", "self.b"))
	h.nodes.set(device("beta", "xz-9", "Other", "self.z"))
	eventually.True(t, "the fences", func() bool { return count(tenant) >= 3 && count(desk) >= 2 && count(other) >= 1 })
	if count(tenant) != 3 || count(kitchen) != 1 || count(desk) != 2 || count(other) != 1 {
		t.Errorf("notifications: tenant %d kitchen %d desk %d other tenant %d; want 3 1 2 1",
			count(tenant), count(kitchen), count(desk), count(other))
	}
}

// fakeThrottle refuses a source after three failures.
type fakeThrottle struct {
	mu     sync.Mutex
	failed int
}

func (f *fakeThrottle) RetryAfter(*http.Request) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failed >= 3 {
		return 1500 * time.Millisecond
	}
	return 0
}

func (f *fakeThrottle) Failed(*http.Request, bool) { f.mu.Lock(); f.failed++; f.mu.Unlock() }

// Failed authentications spend the gateway's per-source budget; once it is
// spent the endpoint answers 429 with Retry-After, even to a good token.
func TestFailedAuthenticationsAreThrottled(t *testing.T) {
	th := &fakeThrottle{}
	h := newHarness(t, Config{Throttle: th})
	for i, token := range []string{"", "wrong", "wrong"} {
		if resp := h.post(t, "/mcp", token, initializeBody); resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("attempt %d: %d", i, resp.StatusCode)
		}
	}
	resp := h.post(t, "/mcp", "op-a", initializeBody)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "2" {
		t.Errorf("after 3 failures: %d Retry-After %q, want 429 and 2", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if th.failed != 3 {
		t.Errorf("%d failures recorded, want 3", th.failed)
	}
}
