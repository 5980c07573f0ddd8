package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/registry"
)

// replicaPair is two MCP servers (two gateway replicas) sharing one node
// registry and the sessions bucket of one embedded NATS server, each with
// its own NATS connection, HTTP server and invoker.
type replicaPair struct {
	t     testing.TB
	nodes *fakeNodes
	a, b  *replicaUnderTest

	mu     sync.Mutex
	served []served // JSON-RPC methods and HTTP methods, by replica
}

type replicaUnderTest struct {
	name string
	srv  *Server
	inv  *fakeInvoker
	http *httptest.Server
}

type served struct{ replica, method string }

func newReplicaPair(t testing.TB, cfg Config) *replicaPair {
	t.Helper()
	ns, err := natsembed.Start(natsembed.Config{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ns.Shutdown)
	p := &replicaPair{t: t, nodes: &fakeNodes{}}
	cfg.Auth = tokens
	cfg.Authorizer = access.AllowAll{}
	cfg.Nodes = p.nodes
	if cfg.NotifyDelay == 0 {
		cfg.NotifyDelay = 20 * time.Millisecond
	}
	start := func(name string) *replicaUnderTest {
		nc, err := ns.Connect("gateway-" + name)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		kv, err := wire.OpenBucket(ctx, js, wire.MCPSessionsBucketConfig())
		if err != nil {
			t.Fatal(err)
		}
		r := &replicaUnderTest{name: name, inv: &fakeInvoker{fail: map[string]*CallError{}}}
		c := cfg
		c.Invoker = r.inv
		if r.srv, err = New(c); err != nil {
			t.Fatal(err)
		}
		if err := r.srv.ShareSessions(ctx, kv); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(r.srv.Close)
		r.http = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			method := req.Method
			if req.Method == http.MethodPost {
				body, _ := io.ReadAll(req.Body)
				req.Body = io.NopCloser(bytes.NewReader(body))
				var m struct {
					Method string `json:"method"`
				}
				_ = json.Unmarshal(body, &m)
				method = m.Method
			}
			p.mu.Lock()
			p.served = append(p.served, served{name, method})
			p.mu.Unlock()
			r.srv.ServeHTTP(w, req)
		}))
		t.Cleanup(r.http.Close)
		return r
	}
	p.a, p.b = start("A"), start("B")
	p.nodes.onSet = func(tenant, nodeID string, n *registry.Node) {
		p.a.srv.NodeChanged(tenant, nodeID, n)
		p.b.srv.NodeChanged(tenant, nodeID, n)
	}
	return p
}

// servedBy reports whether replica served the JSON-RPC (or HTTP) method.
func (p *replicaPair) servedBy(replica, method string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.served {
		if s == (served{replica, method}) {
			return true
		}
	}
	return false
}

// balancer is a load balancer without session affinity: POSTs and DELETEs
// go to the replicas in turn, the GET stream to B; pin sends everything to
// one replica.
type balancer struct {
	p     *replicaPair
	token string
	n     atomic.Int64
	pin   atomic.Pointer[replicaUnderTest]
}

func (lb *balancer) RoundTrip(r *http.Request) (*http.Response, error) {
	to := lb.p.a
	switch {
	case lb.pin.Load() != nil:
		to = lb.pin.Load()
	case r.Method == http.MethodGet:
		to = lb.p.b
	case lb.n.Add(1)%2 == 0:
		to = lb.p.b
	}
	u, _ := url.Parse(to.http.URL)
	r = r.Clone(r.Context())
	r.URL.Host, r.Host = u.Host, u.Host
	r.Header.Set("Authorization", "Bearer "+lb.token)
	return http.DefaultTransport.RoundTrip(r)
}

// connect opens a session through a balancer over both replicas.
func (p *replicaPair) connect(token string, opts *mcp.ClientOptions, sse bool) (*mcp.ClientSession, *balancer) {
	p.t.Helper()
	lb := &balancer{p: p, token: token}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := mcp.NewClient(&mcp.Implementation{Name: "go-test", Version: "1.2.3"}, opts)
	cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: p.a.http.URL + "/mcp",
		HTTPClient: &http.Client{Transport: lb}, DisableStandaloneSSE: !sse, MaxRetries: -1}, nil)
	if err != nil {
		p.t.Fatalf("connect: %v", err)
	}
	p.t.Cleanup(func() { _ = cs.Close() })
	return cs, lb
}

// rawPost sends one JSON-RPC request to a replica with a session id and
// returns the HTTP status and body.
func rawPost(t *testing.T, r *replicaUnderTest, token, sessionID, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, r.http.URL+"/mcp", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	if sessionID != "" {
		req.Header.Set("Mcp-Session-Id", sessionID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

const listBody = `{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{}}`

func TestSessionIsServedByEveryReplica(t *testing.T) {
	p := newReplicaPair(t, Config{})
	p.nodes.set(device("acme", "xz-1", "Kitchen speaker", "self.audio_speaker.set_volume"))
	var heard atomic.Int64
	cs, _ := p.connect("op-a", &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
		heard.Add(1)
	}}, true)
	ctx := context.Background()
	// Two of each, so each replica serves one.
	for range 2 {
		if got := names(listAll(t, cs)); len(got) != 1 || got[0] != "Kitchen_speaker__self_audio_speaker_set_volume" {
			t.Fatalf("tools/list: %v", got)
		}
	}
	for i := range 2 {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "Kitchen_speaker__self_audio_speaker_set_volume", Arguments: map[string]any{"v": i}})
		if err != nil || res.IsError {
			t.Fatalf("tools/call: %v %+v", err, res)
		}
	}
	// The client's first POST is server/discover: whichever replica got
	// initialize, the other served a list and a call of the session too.
	opener, other := p.a, p.b
	if p.servedBy("B", "initialize") {
		opener, other = p.b, p.a
	}
	for _, want := range []served{{opener.name, "initialize"}, {other.name, "tools/list"}, {other.name, "tools/call"}, {"B", http.MethodGet}} {
		if !p.servedBy(want.replica, want.method) {
			t.Errorf("replica %s never served %s: %v", want.replica, want.method, p.served)
		}
	}
	// The call served by the other replica is audited with the client that
	// initialized on the opener.
	other.inv.mu.Lock()
	calls := append([]ToolCall(nil), other.inv.calls...)
	other.inv.mu.Unlock()
	if len(calls) != 1 || calls[0].Client != "go-test/1.2.3" || calls[0].SessionID != cs.ID() || calls[0].Principal.ID != "tok_op" {
		t.Fatalf("calls served by %s: %+v", other.name, calls)
	}

	// A device joins: the GET stream, held by B, hears list_changed.
	p.nodes.set(device("acme", "xz-2", "Desk lamp", "self.light.set"))
	eventually.True(t, "list_changed on the stream held by B", func() bool { return heard.Load() > 0 })
	if got := names(listAll(t, cs)); len(got) != 2 {
		t.Fatalf("after the join tools/list: %v", got)
	}
}

func TestDeleteOnOneReplicaEndsTheSessionEverywhere(t *testing.T) {
	p := newReplicaPair(t, Config{})
	p.nodes.set(device("acme", "xz-1", "Kitchen speaker", "self.audio_speaker.set_volume"))
	cs, lb := p.connect("op-a", nil, true)
	id := cs.ID()
	listAll(t, cs) // on A
	listAll(t, cs) // on B
	eventually.True(t, "a copy on each replica", func() bool { return p.a.srv.Sessions() == 1 && p.b.srv.Sessions() == 1 })

	lb.pin.Store(p.b)
	if err := cs.Close(); err != nil {
		t.Fatal(err)
	}
	if !p.servedBy("B", http.MethodDelete) {
		t.Fatalf("the DELETE did not reach B: %v", p.served)
	}
	// A, which opened the session, closes it when it sees the record go.
	eventually.True(t, "A to close its session", func() bool { return p.a.srv.Sessions() == 0 && p.b.srv.Sessions() == 0 })
	for _, r := range []*replicaUnderTest{p.a, p.b} {
		if code, body := rawPost(t, r, "op-a", id, listBody); code != http.StatusNotFound {
			t.Errorf("replica %s after DELETE: %d %s, want 404", r.name, code, body)
		}
	}
}

func TestSessionIDAloneNeverAuthorizes(t *testing.T) {
	p := newReplicaPair(t, Config{})
	cs, _ := p.connect("op-a", nil, false)
	listAll(t, cs)
	listAll(t, cs)
	_, unknown := rawPost(t, p.b, "op-a", "0123456789abcdef0123456789abcdef", listBody)
	for _, r := range []*replicaUnderTest{p.a, p.b} {
		// Another principal of the tenant, and another tenant's.
		for _, token := range []string{"viewer-a", "op-b"} {
			code, body := rawPost(t, r, token, cs.ID(), listBody)
			if code != http.StatusNotFound || body != unknown {
				t.Errorf("replica %s, token %s with op-a's session: %d %q, want the 404 of an unknown session %q", r.name, token, code, body, unknown)
			}
		}
		// The owner still uses it.
		if code, body := rawPost(t, r, "op-a", cs.ID(), listBody); code != http.StatusOK {
			t.Errorf("replica %s, the owner: %d %s", r.name, code, body)
		}
	}
}

func TestIdleCopiesCloseAndTheSessionLivesOn(t *testing.T) {
	p := newReplicaPair(t, Config{SessionTimeout: 300 * time.Millisecond})
	p.nodes.set(device("acme", "xz-1", "Kitchen speaker", "self.audio_speaker.set_volume"))
	cs, _ := p.connect("op-a", nil, false)
	listAll(t, cs)
	listAll(t, cs)
	eventually.True(t, "both copies to close when idle", func() bool { return p.a.srv.Sessions() == 0 && p.b.srv.Sessions() == 0 })
	// The record outlives the copies: both replicas serve the session again.
	for range 2 {
		if got := listAll(t, cs); len(got) != 1 {
			t.Fatalf("tools/list after the copies closed: %v", names(got))
		}
	}
}

func TestSessionsPerPrincipalAreCapped(t *testing.T) {
	p := newReplicaPair(t, Config{MaxSessionsPerPrincipal: 2})
	first, _ := p.connect("op-a", nil, false)
	p.connect("op-a", nil, false)
	c := mcp.NewClient(&mcp.Implementation{Name: "go-test", Version: "1.2.3"}, nil)
	lb := &balancer{p: p, token: "op-a"}
	_, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: p.a.http.URL + "/mcp",
		HTTPClient: &http.Client{Transport: lb}, DisableStandaloneSSE: true, MaxRetries: -1}, nil)
	if err == nil || !strings.Contains(err.Error(), "Too Many Requests") {
		t.Fatalf("a third session: %v", err)
	}
	// The answer says why, on either replica.
	for _, r := range []*replicaUnderTest{p.a, p.b} {
		code, body := rawPost(t, r, "op-a", "", `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
		if code != http.StatusTooManyRequests || !strings.Contains(body, "too many MCP sessions open for this token (limit 2)") {
			t.Errorf("replica %s, a third session: %d %s", r.name, code, body)
		}
	}
	// Another token has its own budget; a DELETE frees one.
	p.connect("viewer-a", nil, false)
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	p.connect("op-a", nil, false)
}

// TestDeleteAnswers204OnTheOpeningReplica: the replica's own watcher sees
// the record go while it answers the DELETE; the client still gets 204
// (the TypeScript and OpenAI Agents SDKs report anything else).
func TestDeleteAnswers204OnTheOpeningReplica(t *testing.T) {
	p := newReplicaPair(t, Config{})
	for range 20 {
		lb := &balancer{p: p, token: "op-a"}
		lb.pin.Store(p.a)
		c := mcp.NewClient(&mcp.Implementation{Name: "go-test", Version: "1.2.3"}, nil)
		cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: p.a.http.URL + "/mcp",
			HTTPClient: &http.Client{Transport: lb}, DisableStandaloneSSE: true, MaxRetries: -1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest(http.MethodDelete, p.a.http.URL+"/mcp", nil)
		req.Header.Set("Authorization", "Bearer op-a")
		req.Header.Set("Mcp-Session-Id", cs.ID())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent {
			t.Fatalf("DELETE on the opening replica: %d, want 204", resp.StatusCode)
		}
	}
}
