package devicehub_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/deviceauth"
	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed/natsembedtest"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
	"github.com/xiaoclaw/xiaoclaw/services/devicehub"
)

const (
	testTenant = "dev"
	testToken  = "tok-dev"
	waitLimit  = eventually.Limit // upper bound for conditions that normally hold within milliseconds
)

// env is one test's NATS server plus helpers to start hubs and devices.
type env struct {
	t  *testing.T
	ns *natsembed.Server
	nc *nats.Conn // the test's own client (the "shim")
}

func newEnv(t testing.TB) *env {
	tt, _ := t.(*testing.T)
	ns := natsembedtest.Start(t)
	nc := natsembedtest.Connect(t, ns, "test")
	return &env{t: tt, ns: ns, nc: nc}
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("DEVICEHUB_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// startHub runs a hub on its own NATS connection until the test ends.
func startHub(t testing.TB, e *env, cfg devicehub.Config) *devicehub.Service {
	t.Helper()
	if cfg.Auth == nil {
		cfg.Auth = deviceAuth()
	}
	if cfg.DeviceAddr == "" {
		cfg.DeviceAddr = "127.0.0.1:0"
	}
	nc, err := e.ns.Connect("hub " + cfg.Instance)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := devicehub.New(cfg, nc, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run returned %v", err)
		}
		nc.Close()
	})
	select {
	case <-svc.Ready():
	case err := <-done:
		t.Fatalf("hub did not start: %v", err)
	}
	return svc
}

func deviceAuth() deviceauth.StaticTokens {
	return deviceauth.StaticTokens{testToken: testTenant, "tok-acme": "acme"}
}

func wsURL(svc *devicehub.Service) string { return "ws://" + svc.DeviceAddr() + "/xiaozhi/v1/" }

// newDevice returns a disconnected simulated device for svc.
func newDevice(t testing.TB, svc *devicehub.Service, mac string, mutate func(*xzsim.Config)) *xzsim.Device {
	t.Helper()
	cfg := xzsim.Config{URL: wsURL(svc), Token: testToken, MAC: mac}
	if mutate != nil {
		mutate(&cfg)
	}
	d, err := xzsim.NewDevice(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

// connect returns a connected simulated device.
func connect(t testing.TB, svc *devicehub.Service, mac string, mutate func(*xzsim.Config)) *xzsim.Device {
	t.Helper()
	d := newDevice(t, svc, mac, mutate)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := d.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	return d
}

// connectOnline connects a device and waits for its online event, after
// which its rpc subject is served.
func connectOnline(t testing.TB, e *env, svc *devicehub.Service, mac string, mutate func(*xzsim.Config)) *xzsim.Device {
	t.Helper()
	w := watch(t, e, testTenant, canonical(t, mac))
	d := connect(t, svc, mac, mutate)
	w.nextKind(wire.DeviceOnline)
	return d
}

func canonical(t testing.TB, mac string) string {
	c, err := wire.CanonicalDevice(mac)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// watcher collects the state events and notifications of one device.
type watcher struct {
	t  testing.TB
	ch chan *nats.Msg
}

func watch(t testing.TB, e *env, tenant, device string) *watcher {
	t.Helper()
	w := &watcher{t: t, ch: make(chan *nats.Msg, 256)}
	for _, subject := range []string{wire.DeviceState(tenant, device), wire.DeviceNotify(tenant, device)} {
		sub, err := e.nc.ChanSubscribe(subject, w.ch)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sub.Unsubscribe() })
	}
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return w
}

// next returns the next event, failing the test after waitLimit.
func (w *watcher) next() wire.DeviceEvent {
	w.t.Helper()
	select {
	case m := <-w.ch:
		var ev wire.DeviceEvent
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			w.t.Fatalf("event is not a DeviceEvent: %v: %s", err, m.Data)
		}
		if m.Header.Get(wire.HeaderTenant) != ev.Tenant {
			w.t.Fatalf("event tenant header %q, payload %q", m.Header.Get(wire.HeaderTenant), ev.Tenant)
		}
		return ev
	case <-time.After(waitLimit):
		w.t.Fatal("no device event within", waitLimit)
		return wire.DeviceEvent{}
	}
}

// nextKind skips events until one of kind arrives.
func (w *watcher) nextKind(kind string) wire.DeviceEvent {
	w.t.Helper()
	for {
		if ev := w.next(); ev.Kind == kind {
			return ev
		}
	}
}

// rpc sends a DeviceRPC request with a caller deadline and returns the reply.
func rpc(t testing.TB, nc *nats.Conn, tenant, device, body string, timeout time.Duration) *nats.Msg {
	t.Helper()
	m, err := rpcErr(nc, tenant, device, body, timeout)
	if err != nil {
		t.Fatalf("rpc %s: %v", body, err)
	}
	return m
}

func rpcErr(nc *nats.Conn, tenant, device, body string, timeout time.Duration) (*nats.Msg, error) {
	msg := &nats.Msg{Subject: wire.DeviceRPC(tenant, device), Header: nats.Header{}, Data: []byte(body)}
	wire.SetTimeout(msg.Header, time.Now().Add(timeout))
	// NATS waits a little longer than the caller's deadline, so that the
	// hub's own TIMEOUT fault is what arrives.
	return nc.RequestMsg(msg, timeout+5*time.Second)
}

// rpcResponse is a device JSON-RPC response as relayed by the hub.
type rpcResponse struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  *struct {
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		IsError bool `json:"isError"`
	} `json:"result"`
	Error *struct {
		Code    *int   `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func decodeResponse(t testing.TB, m *nats.Msg) rpcResponse {
	t.Helper()
	if f := m.Header.Get(wire.HeaderFault); f != "" {
		t.Fatalf("got fault %s: %s", f, m.Data)
	}
	var r rpcResponse
	if err := json.Unmarshal(m.Data, &r); err != nil {
		t.Fatalf("reply is not JSON-RPC: %v: %s", err, m.Data)
	}
	return r
}

func fault(t testing.TB, m *nats.Msg) wire.Fault {
	t.Helper()
	code := m.Header.Get(wire.HeaderFault)
	if code == "" {
		t.Fatalf("expected a fault, got %s", m.Data)
	}
	var f wire.Fault
	if err := json.Unmarshal(m.Data, &f); err != nil {
		t.Fatalf("fault body: %v: %s", err, m.Data)
	}
	if f.Code != code {
		t.Fatalf("fault header %s, body code %s", code, f.Code)
	}
	return f
}

func callBody(tool string, args string) string {
	return `{"jsonrpc":"2.0","method":"tools/call","params":{"name":"` + tool + `","arguments":` + args + `}}`
}

func isNoResponders(err error) bool { return errors.Is(err, nats.ErrNoResponders) }

func toolNames(t testing.TB, tools json.RawMessage) []string {
	t.Helper()
	var list []struct {
		Name        string `json:"name"`
		Annotations *struct {
			Audience []string `json:"audience"`
		} `json:"annotations"`
	}
	if err := json.Unmarshal(tools, &list); err != nil {
		t.Fatalf("tools: %v", err)
	}
	names := make([]string, len(list))
	for i, tl := range list {
		names[i] = tl.Name
	}
	return names
}

func containsName(names []string, prefix string) int {
	n := 0
	for _, s := range names {
		if strings.HasPrefix(s, prefix) {
			n++
		}
	}
	return n
}
