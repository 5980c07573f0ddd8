package gateway_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed/natsembedtest"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/gwtest"
)

// Tokens of the test tenants.
const (
	tokAdmin    = "tok-acme-admin"
	tokOperator = "tok-acme-operator"
	tokViewer   = "tok-acme-viewer"
	tokGlobex   = "tok-globex-admin"
	tenantAcme  = "acme"
	tenantOther = "globex"
)

var testTokens = access.StaticTokens{
	tokAdmin:    {Tenant: tenantAcme, ID: "tok_admin", Name: "acme admin", Role: access.RoleAdmin},
	tokOperator: {Tenant: tenantAcme, ID: "tok_op", Name: "acme operator", Role: access.RoleOperator},
	tokViewer:   {Tenant: tenantAcme, ID: "tok_view", Name: "acme viewer", Role: access.RoleViewer},
	tokGlobex:   {Tenant: tenantOther, ID: "tok_globex", Name: "globex admin", Role: access.RoleAdmin},
}

// waitFor bounds every wait in these tests.
const waitFor = eventually.Limit

// env is one embedded NATS server with JetStream and any number of gateway
// replicas on it.
type env struct {
	t  testing.TB
	ns *natsembed.Server
	nc *nats.Conn
	js jetstream.JetStream
}

func newEnv(t testing.TB) *env {
	t.Helper()
	ns := natsembedtest.Start(t)
	nc := natsembedtest.Connect(t, ns, "test")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &env{t: t, ns: ns, nc: nc, js: js}
}

func testLogger() *slog.Logger {
	if os.Getenv("GATEWAY_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// replica is a running gateway.
type replica struct {
	*gateway.Service
	stop func() // stops Run and waits for it to return
}

// gateway starts a replica with its own NATS connection.
func (e *env) gateway(mod func(*gateway.Config)) *replica {
	e.t.Helper()
	nc, err := e.ns.Connect("gateway")
	if err != nil {
		e.t.Fatal(err)
	}
	cfg := gateway.Config{Addr: "127.0.0.1:0", Auth: testTokens}
	if mod != nil {
		mod(&cfg)
	}
	svc, err := gateway.New(cfg, nc, testLogger())
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	select {
	case <-svc.Ready():
	case err := <-done:
		e.t.Fatalf("gateway stopped before ready: %v", err)
	case <-time.After(waitFor):
		e.t.Fatal("gateway not ready")
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					e.t.Errorf("Run returned %v", err)
				}
			case <-time.After(waitFor):
				e.t.Error("Run did not return after cancel")
			}
			nc.Close()
		})
	}
	e.t.Cleanup(stop)
	return &replica{Service: svc, stop: stop}
}

// putNode writes a registry record, as the shim does for a device.
func (e *env) putNode(rec wire.NodeRecord) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	kv, err := e.js.KeyValue(ctx, wire.BucketNodes)
	if err != nil {
		e.t.Fatal(err)
	}
	b, _ := json.Marshal(rec)
	if _, err := kv.Put(ctx, wire.NodeKey(rec.Tenant, rec.NodeID), b); err != nil {
		e.t.Fatal(err)
	}
}

// device is a XiaoZhi node record with MCP tools.
func device(tenant, id, name string, connected bool) wire.NodeRecord {
	return wire.NodeRecord{
		NodeID: id, Tenant: tenant, Kind: wire.NodeKindXiaoZhi, Device: id[3:], DisplayName: name,
		Platform: "esp32", DeviceFamily: "xiaozhi", Version: "1.6.0", ClientID: "xiaozhi", ClientMode: "node",
		Caps:     []string{"mcp", "mcp"},
		Commands: []string{"mcp.tools.list", "mcp.tools.call", "mcp.tools.call"},
		Tools: json.RawMessage(`[{"name":"self.audio_speaker.set_volume","description":"volume","inputSchema":{"type":"object"}},` +
			`{"name":"self.reboot","description":"reboot","inputSchema":{"type":"object"}}]`),
		Connected: connected, ConnectedAtMs: 1700000000000, Owner: "hub-1", SessionID: "s-" + id,
		Transport: "mqtt", LastSeenMs: 1700000005000,
	}
}

// shim answers node.invoke for a tenant in the shim queue group.
type shim struct {
	mu    sync.Mutex
	calls []shimCall
	sub   *nats.Subscription
}

type shimCall struct {
	req    wire.InvokeRequest
	header nats.Header
}

func (e *env) shim(tenant string, answer func(req wire.InvokeRequest, m *nats.Msg)) *shim {
	e.t.Helper()
	s := &shim{}
	sub, err := e.nc.QueueSubscribe(wire.NodeInvoke(tenant), wire.QueueShim, func(m *nats.Msg) {
		var req wire.InvokeRequest
		if err := json.Unmarshal(m.Data, &req); err != nil {
			e.t.Errorf("shim got undecodable request %s", m.Data)
			return
		}
		s.mu.Lock()
		s.calls = append(s.calls, shimCall{req, m.Header})
		s.mu.Unlock()
		if answer != nil {
			go answer(req, m) // a slow answer must not hold up the others
		}
	})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := e.nc.Flush(); err != nil {
		e.t.Fatal(err)
	}
	s.sub = sub
	e.t.Cleanup(func() { _ = sub.Unsubscribe() })
	return s
}

func (s *shim) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.calls)
}

func (s *shim) last() shimCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[len(s.calls)-1]
}

// reply answers with a wire.InvokeReply.
func reply(m *nats.Msg, r wire.InvokeReply) {
	b, _ := json.Marshal(r)
	_ = m.Respond(b)
}

// echoShim answers every call with {"echo": <params>}.
func echoShim(req wire.InvokeRequest, m *nats.Msg) {
	p := req.Params
	if p == nil {
		p = json.RawMessage(`null`)
	}
	reply(m, wire.InvokeReply{OK: true, Payload: json.RawMessage(`{"echo":` + string(p) + `}`)})
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	t.Cleanup(cancel)
	return ctx
}

// operator dials a replica and connects like the stock CLI.
func operator(t *testing.T, r *replica, token string, scopes ...string) *gwtest.Client {
	t.Helper()
	c, err := gwtest.Dial(ctxT(t), r.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseNow)
	res, err := c.Connect(ctxT(t), gwtest.OperatorParams(token, scopes...))
	if err != nil {
		t.Fatal(err)
	}
	if !res.OK {
		t.Fatalf("connect refused: %+v", res.Error)
	}
	return c
}

// call performs a request that must get a response frame.
func call(t *testing.T, c *gwtest.Client, method string, params any) gwtest.Frame {
	t.Helper()
	f, err := c.Call(ctxT(t), method, params)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// payload decodes a successful response.
func payload[T any](t *testing.T, f gwtest.Frame) T {
	t.Helper()
	if !f.OK {
		t.Fatalf("expected ok, got error %+v", f.Error)
	}
	var v T
	if err := json.Unmarshal(f.Payload, &v); err != nil {
		t.Fatalf("payload %s: %v", f.Payload, err)
	}
	return v
}

// failure asserts an error response and returns it.
func failure(t *testing.T, f gwtest.Frame) *gwtest.ErrorShape {
	t.Helper()
	if f.OK || f.Error == nil {
		t.Fatalf("expected an error response, got %s", f.Raw)
	}
	return f.Error
}

// nodeView is the part of NodeListNode the tests read.
type nodeView struct {
	NodeID        string            `json:"nodeId"`
	DisplayName   string            `json:"displayName"`
	Platform      string            `json:"platform"`
	Caps          []string          `json:"caps"`
	Commands      []string          `json:"commands"`
	Tools         []json.RawMessage `json:"tools"`
	Paired        bool              `json:"paired"`
	Connected     bool              `json:"connected"`
	ConnectedAtMs int64             `json:"connectedAtMs"`
	RemoteIP      string            `json:"remoteIp"`
	Kind          string            `json:"kind"`
}

type nodeList struct {
	Ts    int64      `json:"ts"`
	Nodes []nodeView `json:"nodes"`
}

// waitListed waits until a replica lists the node with the given state.
func waitListed(t *testing.T, c *gwtest.Client, nodeID string, connected bool) nodeView {
	t.Helper()
	var found nodeView
	eventually.True(t, "node "+nodeID+" listed", func() bool {
		for _, n := range payload[nodeList](t, call(t, c, "node.list", map[string]any{})).Nodes {
			if n.NodeID == nodeID && n.Connected == connected {
				found = n
				return true
			}
		}
		return false
	})
	return found
}

// replyFault answers with a failed wire.InvokeReply.
func replyFault(m *nats.Msg, code, message string) {
	reply(m, wire.InvokeReply{Error: &wire.Fault{Code: code, Message: message}})
}

var keySeq atomic.Int64

// newKey returns a fresh idempotency key.
func newKey() string {
	return "key-" + strconv.FormatInt(keySeq.Add(1), 10) + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
}
