package devstack

import (
	"context"
	"encoding/json"
	"io"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/xiaoclaw/xiaoclaw/pkg/deviceauth"
	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/devicehub"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/adminapi"
)

// wsServerTransport carries an MCP server over one WebSocket with one bare
// JSON-RPC message per text frame: the XiaoZhi MCP endpoint framing that
// mcp_pipe and xiaozhi-client speak.
type wsServerTransport struct {
	ws   *websocket.Conn
	once sync.Once
}

func (t *wsServerTransport) Connect(context.Context) (mcp.Connection, error) { return t, nil }
func (t *wsServerTransport) Read(ctx context.Context) (jsonrpc.Message, error) {
	typ, b, err := t.ws.Read(ctx)
	if err != nil {
		return nil, io.EOF
	}
	if typ != websocket.MessageText {
		return t.Read(ctx)
	}
	return jsonrpc.DecodeMessage(b)
}
func (t *wsServerTransport) Write(ctx context.Context, m jsonrpc.Message) error {
	b, err := jsonrpc.EncodeMessage(m)
	if err != nil {
		return err
	}
	return t.ws.Write(ctx, websocket.MessageText, b)
}
func (t *wsServerTransport) Close() error {
	t.once.Do(func() { t.ws.Close(websocket.StatusNormalClosure, "bye") })
	return nil
}
func (t *wsServerTransport) SessionID() string { return "" }

func endpointURL(st *Stack, token string) string {
	return "ws://" + st.Hubs[0].DeviceAddr() + devicehub.EndpointPath + "?token=" + token
}

// TestEndpointToolHostBecomesNode: a program that is an MCP server (the
// official Go SDK's) dials the hub's /mcp/ endpoint and becomes a node whose
// tools operators call; a token without a valid device token is refused.
func TestEndpointToolHostBecomesNode(t *testing.T) {
	st := startStack(t, Config{Hubs: 1, Shims: 1, Gateways: 1})
	op := operator(t, st.GatewayURL(0))
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()

	if _, resp, err := websocket.Dial(ctx, endpointURL(st, "calc-host.wrong"), nil); err == nil || resp == nil || resp.StatusCode != 401 {
		t.Fatalf("bad token: want HTTP 401, got %v", err)
	}
	if _, resp, err := websocket.Dial(ctx, endpointURL(st, testDeviceToken), nil); err == nil || resp == nil || resp.StatusCode != 401 {
		t.Fatalf("token without a device id: want HTTP 401, got %v", err)
	}

	ws, _, err := websocket.Dial(ctx, endpointURL(st, deviceauth.EndpointToken("calc-host", testDeviceToken)), nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: "calculator", Version: "1"}, nil)
	type addIn struct {
		A int `json:"a"`
		B int `json:"b"`
	}
	type addOut struct {
		Sum int `json:"sum"`
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "add", Description: "adds"}, func(_ context.Context, _ *mcp.CallToolRequest, in addIn) (*mcp.CallToolResult, addOut, error) {
		return nil, addOut{Sum: in.A + in.B}, nil
	})
	ss, err := srv.Connect(context.Background(), &wsServerTransport{ws: ws}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })

	node := wire.DeviceNodeID("calc-host")
	waitTools(t, op, node, func(n []string) bool { return has(n, "add") })
	p, err := invokeText(t, op, node, "add", map[string]int{"a": 2, "b": 40})
	if err != nil || p.IsError || !strings.Contains(p.text(), `"sum":42`) {
		t.Fatalf("add through the endpoint: %v %+v", err, p)
	}

	// A catalog change on the tool host reaches operators (list_changed).
	mcp.AddTool(srv, &mcp.Tool{Name: "neg", Description: "negates"}, func(_ context.Context, _ *mcp.CallToolRequest, in addIn) (*mcp.CallToolResult, addOut, error) {
		return nil, addOut{Sum: -in.A}, nil
	})
	waitTools(t, op, node, func(n []string) bool { return has(n, "add", "neg") })

	ss.Close()
	waitNodes(t, op, false, node)
}

// TestEndpointTokenFromAdminAPI: a tenant admin mints an endpoint token
// bound to one node; the tool host connecting with it is that node of that
// tenant, and the token does not admit any other node identity.
func TestEndpointTokenFromAdminAPI(t *testing.T) {
	st := startStack(t, Config{Hubs: 1, Shims: 1, Gateways: 1})
	acme := newTenant(t, st, "acme")
	_, adminSecret, err := st.Tenancy.Manager.IssueToken(context.Background(), "acme", tenancy.TokenSpec{Name: "root", Role: "admin"})
	if err != nil {
		t.Fatal(err)
	}
	mint := func(body string) (int, adminapi.EndpointTokenResponse) {
		req := httptest.NewRequest("POST", "/api/tenants/acme/endpoint-tokens", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+adminSecret)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		st.Tenancy.AdminAPI.ServeHTTP(rec, req)
		var res adminapi.EndpointTokenResponse
		_ = json.Unmarshal(rec.Body.Bytes(), &res)
		return rec.Code, res
	}
	if code, _ := mint(`{"nodeId":"not-a-node"}`); code != 400 {
		t.Fatalf("bad node id: HTTP %d", code)
	}
	code, res := mint(`{"nodeId":"xz-calc-pi"}`)
	if code != 201 || res.Device != "calc-pi" || res.NodeID != "xz-calc-pi" || !strings.HasPrefix(res.Token, "calc-pi.") {
		t.Fatalf("mint: HTTP %d %+v", code, res)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	_, sig, _ := strings.Cut(res.Token, ".")
	if _, resp, err := websocket.Dial(ctx, endpointURL(st, deviceauth.EndpointToken("other-node", sig)), nil); err == nil || resp == nil || resp.StatusCode != 401 {
		t.Fatalf("token moved to another node: want HTTP 401, got %v", err)
	}
	ws, _, err := websocket.Dial(ctx, endpointURL(st, res.Token), nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: "pi", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "uptime", Description: "uptime"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "up 3 days"}}}, nil, nil
	})
	ss, err := srv.Connect(context.Background(), &wsServerTransport{ws: ws}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	op := dialAs(t, st.GatewayURL(0), acme.token, nil)
	waitTools(t, op, "xz-calc-pi", func(n []string) bool { return has(n, "uptime") })
	if p, err := invokeText(t, op, "xz-calc-pi", "uptime", map[string]any{}); err != nil || p.text() != "up 3 days" {
		t.Fatalf("uptime: %v %+v", err, p)
	}
	devOp := operator(t, st.GatewayURL(0))
	if _, ok := listNodes(t, devOp)["xz-calc-pi"]; ok {
		t.Fatal("another tenant lists acme's endpoint node")
	}
}

// TestEndpointKeptAliveByHubPings: a tool host that sends nothing while
// idle (as xiaozhi-client) stays connected past the hub's idle limit, since
// the hub probes it with MCP pings as the XiaoZhi cloud does.
func TestEndpointKeptAliveByHubPings(t *testing.T) {
	idle := 900 * time.Millisecond
	st := startStack(t, Config{Hubs: 1, Shims: 1, Gateways: 1, TuneHub: func(c *devicehub.Config) { c.IdleTimeout = idle }})
	op := operator(t, st.GatewayURL(0))
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, endpointURL(st, deviceauth.EndpointToken("quiet-host", testDeviceToken)), nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: "quiet", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "still", Description: "still there"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "yes"}}}, nil, nil
	})
	var pings atomic.Int64
	srv.AddReceivingMiddleware(func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method == "ping" {
				pings.Add(1)
			}
			return next(ctx, method, req)
		}
	})
	ss, err := srv.Connect(context.Background(), &wsServerTransport{ws: ws}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ss.Close() })
	node := wire.DeviceNodeID("quiet-host")
	waitTools(t, op, node, func(n []string) bool { return has(n, "still") })
	// Stay silent for three idle limits: only the hub's pings keep the session.
	if !eventually.Until(waitLimit, func() bool { return pings.Load() >= 6 }) {
		t.Fatalf("only %d pings from the hub", pings.Load())
	}
	if p, err := invokeText(t, op, node, "still", map[string]any{}); err != nil || p.text() != "yes" {
		t.Fatalf("after %d pings: %v %+v", pings.Load(), err, p)
	}
}
