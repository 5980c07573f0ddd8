package gateway_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/services/gateway"
)

// recordingAuditor keeps the gateways' audit records.
type recordingAuditor struct {
	mu   sync.Mutex
	recs []gateway.InvokeAudit
}

func (a *recordingAuditor) AuditInvoke(_ context.Context, r gateway.InvokeAudit) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.recs = append(a.recs, r)
	return nil
}

func (a *recordingAuditor) outcomes() []gateway.InvokeAudit {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []gateway.InvokeAudit
	for _, r := range a.recs {
		if !r.Attempt {
			out = append(out, r)
		}
	}
	return out
}

// routeMCP sends the MCP client's POSTs and DELETEs to the replica `to`
// names and its GET stream to `get`, with a bearer token.
type routeMCP struct {
	token   string
	to, get atomic.Pointer[string]
}

func (rt *routeMCP) RoundTrip(r *http.Request) (*http.Response, error) {
	host := *rt.to.Load()
	if r.Method == http.MethodGet {
		host = *rt.get.Load()
	}
	r = r.Clone(r.Context())
	r.URL.Host, r.Host = host, host
	r.Header.Set("Authorization", "Bearer "+rt.token)
	return http.DefaultTransport.RoundTrip(r)
}

// TestMCPSessionAcrossGatewayReplicas: a session initialized on replica A
// is served by B (its calls audited by B with the client A saw at
// initialize), B's GET stream hears list_changed, and a DELETE on B ends
// the session on A.
func TestMCPSessionAcrossGatewayReplicas(t *testing.T) {
	e := newEnv(t)
	aud := &recordingAuditor{}
	gwA := e.gateway(func(c *gateway.Config) { c.Instance, c.Auditor = "gw-a", aud })
	gwB := e.gateway(func(c *gateway.Config) { c.Instance, c.Auditor = "gw-b", aud })
	const node = "xz-a1b2c3d4e5f6"
	e.putNode(device(tenantAcme, node, "kitchen", true))
	e.shim(tenantAcme, echoShim)
	c := operator(t, gwB, tokOperator, "operator.read")
	waitListed(t, c, node, true)

	addrA, addrB := gwA.Addr(), gwB.Addr()
	rt := &routeMCP{token: tokOperator}
	rt.to.Store(&addrA)
	rt.get.Store(&addrB)
	var heard atomic.Int64
	client := mcp.NewClient(&mcp.Implementation{Name: "agent-x", Version: "2.0.1"}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { heard.Add(1) }})
	cs, err := client.Connect(ctxT(t), &mcp.StreamableClientTransport{Endpoint: "http://" + addrA + "/mcp",
		HTTPClient: &http.Client{Transport: rt}, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	if gwA.MCPSessions() != 1 {
		t.Fatalf("replica A holds %d sessions after initialize, want 1", gwA.MCPSessions())
	}

	rt.to.Store(&addrB)
	const tool = "kitchen__self_audio_speaker_set_volume"
	var listed []string
	for tl, err := range cs.Tools(ctxT(t), nil) {
		if err != nil {
			t.Fatal(err)
		}
		listed = append(listed, tl.Name)
	}
	if !strings.Contains(strings.Join(listed, ","), tool) {
		t.Fatalf("tools/list on B: %v", listed)
	}
	res, err := cs.CallTool(ctxT(t), &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"volume": 30}})
	if err != nil || res.IsError {
		t.Fatalf("tools/call on B: %v %+v", err, res)
	}
	eventually.True(t, "the call's audit record", func() bool { return len(aud.outcomes()) == 1 })
	r := aud.outcomes()[0]
	if r.Instance != "gw-b" || r.Via != gateway.ViaMCP || r.Client != "agent-x/2.0.1" || r.RequestID != "mcp-"+cs.ID() || r.Outcome != gateway.OutcomeOK {
		t.Fatalf("audit record %+v: want gw-b, via mcp, client agent-x/2.0.1, request mcp-%s, ok", r, cs.ID())
	}

	// A device joins: the stream B holds hears it.
	e.putNode(device(tenantAcme, "xz-0000000000c2", "hall", true))
	eventually.True(t, "list_changed on B's stream", func() bool { return heard.Load() > 0 })

	// DELETE on B; A closes its session and answers 404.
	if err := cs.Close(); err != nil {
		t.Fatal(err)
	}
	eventually.True(t, "A to end the session", func() bool { return gwA.MCPSessions() == 0 && gwB.MCPSessions() == 0 })
	req, _ := http.NewRequest(http.MethodPost, "http://"+addrA+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
	req.Header.Set("Authorization", "Bearer "+tokOperator)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Session-Id", cs.ID())
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("A after the DELETE on B: %d %s, want 404", resp.StatusCode, body)
	}
}
