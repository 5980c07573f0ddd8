package upstream

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// putEntry writes a stored upstream as the gateways do.
func putEntry(t *testing.T, nc *nats.Conn, e wire.UpstreamEntry) {
	t.Helper()
	ctx := context.Background()
	js, _ := jetstream.New(nc)
	kv, err := wire.OpenBucket(ctx, js, wire.UpstreamsBucketConfig())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(e)
	if _, err := kv.Put(ctx, wire.UpstreamKey(e.Tenant, e.Name), b); err != nil {
		t.Fatal(err)
	}
}

func deleteEntry(t *testing.T, nc *nats.Conn, tenant, name string) {
	t.Helper()
	js, _ := jetstream.New(nc)
	kv, err := js.KeyValue(context.Background(), wire.BucketUpstreams)
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(context.Background(), wire.UpstreamKey(tenant, name)); err != nil {
		t.Fatal(err)
	}
}

// callerInvoker records the caller token each call ran with.
type callerInvoker struct {
	mu     sync.Mutex
	tokens []string
}

func (c *callerInvoker) Invoke(context.Context, Call) (json.RawMessage, *wire.Fault) {
	return nil, &wire.Fault{Code: wire.FaultUnavailable, Message: "called without the record"}
}

func (c *callerInvoker) InvokeAs(_ context.Context, up Upstream, _ Call) (json.RawMessage, *wire.Fault) {
	c.mu.Lock()
	c.tokens = append(c.tokens, up.CallerToken)
	c.mu.Unlock()
	return json.RawMessage(`{"ok":true}`), nil
}

func startStoredWorker(t *testing.T, nc *nats.Conn, inv Invoker) *Service {
	t.Helper()
	svc, err := New(Config{Instance: "w", Stored: true, LeaseTTL: 3 * time.Second, Invoker: inv, Timing: fastTiming},
		nc, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	return svc
}

func heldNodes(svc *Service) []string {
	var out []string
	for _, st := range svc.Status() {
		if st.State == StateOnline {
			out = append(out, st.NodeID)
		}
	}
	slices.Sort(out)
	return out
}

// A worker started with no upstream of its own runs what the bucket holds:
// only the selected devices get links, a new selection adds and closes
// links, calls carry the entry's caller token (a new one without a
// reconnect), and removing the entry closes the links.
func TestStoredUpstreamsComeAndGo(t *testing.T) {
	srv := startNATS(t)
	gw := newFakeGateway(t)
	seed := connectNATS(t, srv, "seed")
	for _, n := range []string{"xz-000000000001", "xz-000000000002", "xz-000000000003"} {
		putDevice(t, seed, wire.NodeRecord{NodeID: n, Tenant: "acme", Kind: wire.NodeKindXiaoZhi, Connected: true})
	}
	inv := &callerInvoker{}
	w := startStoredWorker(t, connectNATS(t, srv, "w"), inv)
	entry := wire.UpstreamEntry{Tenant: "acme", Name: "home", URL: gw.url(), Auth: wire.UpstreamAuthToken, Secret: linkToken,
		Publish: wire.PublishNodes, Nodes: []string{"xz-000000000001", "xz-000000000003"}, CallerToken: "xcu_first"}
	putEntry(t, seed, entry)
	waitCond(t, "the two listed devices online", func() bool {
		return slices.Equal(heldNodes(w), []string{"xz-000000000001", "xz-000000000003"})
	})
	if n := gw.connectCount(); n != 2 {
		t.Fatalf("%d connects upstream, want the two listed devices", n)
	}
	c := gw.next(t)
	other := gw.next(t)

	// The group changed (the gateway renders the entry again): device 3
	// leaves, device 2 joins; device 1's link stays.
	entry.Publish, entry.Group, entry.Nodes = wire.PublishGroup, "kitchen", []string{"xz-000000000001", "xz-000000000002"}
	entry.CallerToken = "xcu_second"
	putEntry(t, seed, entry)
	waitCond(t, "devices 1 and 2 online", func() bool {
		return slices.Equal(heldNodes(w), []string{"xz-000000000001", "xz-000000000002"})
	})
	left := other
	if c.params.Client.DisplayName == "xz-000000000003" {
		c, left = other, c
	}
	left.closeStatus(t)
	if n := gw.connectCount(); n != 3 {
		t.Fatalf("%d connects upstream, want one more for device 2", n)
	}
	c.send(t, "node.invoke.request", map[string]any{"id": "inv-1", "nodeId": c.params.Device.ID, "command": "mcp.tools.call",
		"paramsJSON": `{"name":"x"}`, "timeoutMs": 5000})
	var res invokeResult
	_ = json.Unmarshal(c.request(t, "node.invoke.result"), &res)
	inv.mu.Lock()
	tokens := slices.Clone(inv.tokens)
	inv.mu.Unlock()
	if !res.OK || !slices.Equal(tokens, []string{"xcu_second"}) {
		t.Fatalf("result %+v, caller tokens %v", res, tokens)
	}

	deleteEntry(t, seed, "acme", "home")
	c.closeStatus(t)
	waitCond(t, "no links", func() bool { return len(w.Status()) == 0 })
}

// A wss:// upstream with a private CA connects; one with
// insecureSkipVerify connects too and says so in its status.
func TestStoredUpstreamOverTLS(t *testing.T) {
	srv := startNATS(t)
	gw := newFakeGateway(t)
	gw.srv.Close()
	gw.srv = httptest.NewTLSServer(http.HandlerFunc(gw.serve))
	t.Cleanup(gw.srv.Close)
	ca := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: gw.srv.Certificate().Raw}))
	seed := connectNATS(t, srv, "seed")
	const node = "xz-aabbccddeeff"
	putDevice(t, seed, wire.NodeRecord{NodeID: node, Tenant: "acme", Kind: wire.NodeKindXiaoZhi, Connected: true})
	w := startStoredWorker(t, connectNATS(t, srv, "w"), &fakeInvoker{})

	// Without the CA the certificate is refused.
	entry := wire.UpstreamEntry{Tenant: "acme", Name: "tls", URL: gw.url(), Auth: wire.UpstreamAuthToken, Secret: linkToken,
		Publish: wire.PublishAll, CallerToken: "xcu_t"}
	putEntry(t, seed, entry)
	waitCond(t, "refused certificate", func() bool {
		st := w.Status()
		return len(st) == 1 && st[0].State == StateBackoff && st[0].LastError != ""
	})
	if gw.connectCount() != 0 {
		t.Fatal("connected without trusting the certificate")
	}

	entry.CACert = ca
	putEntry(t, seed, entry)
	waitCond(t, "online with the CA", func() bool { return heldOnline(w, node) })
	if st := w.Status(); st[0].Warning != "" {
		t.Fatalf("warning %q with a verified certificate", st[0].Warning)
	}
	gw.next(t)

	entry.CACert, entry.InsecureSkipVerify = "", true
	putEntry(t, seed, entry)
	waitCond(t, "online unverified, with a warning", func() bool {
		st := w.Status()
		return len(st) == 1 && st[0].State == StateOnline && st[0].Warning != ""
	})
	sts, err := ReadStatus(context.Background(), seed)
	if err != nil || len(sts) != 1 || sts[0].Warning == "" {
		t.Fatalf("shared status %+v %v: the warning must show in `xiaoclaw upstream status`", sts, err)
	}
}

// An entry that does not parse is not run and does not stop the worker.
func TestMalformedStoredUpstreamIsIgnored(t *testing.T) {
	srv := startNATS(t)
	gw := newFakeGateway(t)
	seed := connectNATS(t, srv, "seed")
	putDevice(t, seed, wire.NodeRecord{NodeID: "xz-000000000001", Tenant: "acme", Kind: wire.NodeKindXiaoZhi, Connected: true})
	w := startStoredWorker(t, connectNATS(t, srv, "w"), &fakeInvoker{})
	js, _ := jetstream.New(seed)
	kv, err := wire.OpenBucket(context.Background(), js, wire.UpstreamsBucketConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(context.Background(), "acme.bad", []byte(`{"tenant":"acme","name":"bad","url":"`+gw.url()+`"}`)); err != nil {
		t.Fatal(err)
	}
	// A valid entry under another upstream's key is refused as well.
	putEntry(t, seed, wire.UpstreamEntry{Tenant: "acme", Name: "good", URL: gw.url(), Auth: wire.UpstreamAuthToken,
		Secret: linkToken, Publish: wire.PublishAll, CallerToken: "xcu_t"})
	waitCond(t, "the valid upstream online", func() bool { return heldOnline(w, "xz-000000000001") })
	if st := w.Status(); len(st) != 1 || st[0].Upstream != "good" {
		t.Fatalf("links %+v, want only the valid upstream's", st)
	}
}

// The bucket is lost and written again by the gateways (with a new caller
// token): the link stays up throughout, and the worker picks the new
// record up.
func TestStoredUpstreamsSurviveALostBucket(t *testing.T) {
	srv := startNATS(t)
	gw := newFakeGateway(t)
	seed := connectNATS(t, srv, "seed")
	const node = "xz-aabbccddeeff"
	putDevice(t, seed, wire.NodeRecord{NodeID: node, Tenant: "acme", Kind: wire.NodeKindXiaoZhi, Connected: true})
	w := startStoredWorker(t, connectNATS(t, srv, "w"), &fakeInvoker{})
	entry := wire.UpstreamEntry{Tenant: "acme", Name: "home", URL: gw.url(), Auth: wire.UpstreamAuthToken, Secret: linkToken,
		Publish: wire.PublishAll, CallerToken: "xcu_before"}
	putEntry(t, seed, entry)
	waitCond(t, "online", func() bool { return heldOnline(w, node) })

	js, _ := jetstream.New(seed)
	if err := js.DeleteKeyValue(context.Background(), wire.BucketUpstreams); err != nil {
		t.Fatal(err)
	}
	entry.CallerToken = "xcu_after"
	putEntry(t, seed, entry)
	waitCond(t, "the new record taken up", func() bool {
		u, ok := w.upstream("acme", "home")
		return ok && u.CallerToken == "xcu_after"
	})
	if !heldOnline(w, node) || gw.connectCount() != 1 {
		t.Fatalf("link status %+v after %d connects, want the first connection still up", w.Status(), gw.connectCount())
	}
}

// An upstream stored with the gateway's password connects with
// auth.password (and no token).
func TestStoredUpstreamWithAPassword(t *testing.T) {
	srv := startNATS(t)
	auths := make(chan json.RawMessage, 4)
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ws, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer ws.CloseNow()
		ctx := r.Context()
		_ = ws.Write(ctx, websocket.MessageText, []byte(`{"type":"event","event":"connect.challenge","payload":{"nonce":"n","ts":1}}`))
		_, b, err := ws.Read(ctx)
		if err != nil {
			return
		}
		var req struct {
			ID     string `json:"id"`
			Params struct {
				Auth json.RawMessage `json:"auth"`
			} `json:"params"`
		}
		_ = json.Unmarshal(b, &req)
		select {
		case auths <- req.Params.Auth:
		default:
		}
		_ = ws.Write(ctx, websocket.MessageText, []byte(`{"type":"res","id":"`+req.ID+`","ok":false,"error":{"code":"INVALID_REQUEST","message":"checked"}}`))
	}))
	t.Cleanup(gw.Close)
	seed := connectNATS(t, srv, "seed")
	putDevice(t, seed, wire.NodeRecord{NodeID: "xz-000000000001", Tenant: "acme", Kind: wire.NodeKindXiaoZhi, Connected: true})
	startStoredWorker(t, connectNATS(t, srv, "w"), &fakeInvoker{})
	putEntry(t, seed, wire.UpstreamEntry{Tenant: "acme", Name: "pw", URL: "ws" + strings.TrimPrefix(gw.URL, "http"),
		Auth: wire.UpstreamAuthPassword, Secret: "gateway-password", Publish: wire.PublishAll, CallerToken: "xcu_t"})
	select {
	case a := <-auths:
		if string(a) != `{"password":"gateway-password"}` {
			t.Fatalf("connect auth %s", a)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("no connect")
	}
}
