package upstream

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

func startNATS(t *testing.T) *natsembed.Server {
	t.Helper()
	srv, err := natsembed.Start(natsembed.Config{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	return srv
}

func connectNATS(t *testing.T, srv *natsembed.Server, name string) *nats.Conn {
	t.Helper()
	nc, err := srv.Connect(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// putDevice writes a XiaoZhi node record as the shim does.
func putDevice(t *testing.T, nc *nats.Conn, rec wire.NodeRecord) {
	t.Helper()
	ctx := context.Background()
	js, _ := jetstream.New(nc)
	kv, err := js.CreateOrUpdateKeyValue(ctx, wire.NodesBucketConfig())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(rec)
	if _, err := kv.Put(ctx, wire.NodeKey(rec.Tenant, rec.NodeID), b); err != nil {
		t.Fatal(err)
	}
}

func startWorker(t *testing.T, nc *nats.Conn, name string, gw *fakeGateway, ttl time.Duration) (*Service, context.CancelFunc, chan error) {
	t.Helper()
	svc, err := New(Config{Instance: name, LeaseTTL: ttl, Invoker: &fakeInvoker{}, Timing: fastTiming,
		Upstreams: []Upstream{{Name: "home", Tenant: "acme", URL: gw.url(), Token: linkToken}}},
		nc, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return svc, cancel, done
}

func heldOnline(svc *Service, node string) bool {
	for _, st := range svc.Status() {
		if st.NodeID == node && st.State == StateOnline {
			return true
		}
	}
	return false
}

func waitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventually.Within(t, 15*time.Second, what, cond)
}

func TestOneHolderAndHandoverWhenWorkerDies(t *testing.T) {
	srv := startNATS(t)
	gw := newFakeGateway(t)
	seed := connectNATS(t, srv, "seed")
	const node = "xz-aabbccddeeff"
	putDevice(t, seed, wire.NodeRecord{NodeID: node, Tenant: "acme", Kind: wire.NodeKindXiaoZhi, Connected: true,
		DisplayName: "Kitchen speaker", Version: "1.6.0"})

	const ttl = 1500 * time.Millisecond
	ncA := connectNATS(t, srv, "worker-a")
	a, _, _ := startWorker(t, ncA, "worker-a", gw, ttl)
	first := gw.next(t)
	waitCond(t, "worker-a online", func() bool { return heldOnline(a, node) })

	b, _, _ := startWorker(t, connectNATS(t, srv, "worker-b"), "worker-b", gw, ttl)
	// B sees the lease taken: across several refresh periods it holds
	// nothing and the gateway gets no second connection.
	time.Sleep(ttl) // three refresh periods of ttl/3: an observation window, there is no event to await
	if len(b.Status()) != 0 || gw.connectCount() != 1 {
		t.Fatalf("second holder: b holds %v, %d connects", b.Status(), gw.connectCount())
	}
	sts, err := ReadStatus(context.Background(), seed)
	if err != nil || len(sts) != 1 || sts[0].Holder != "worker-a" || sts[0].State != StateOnline {
		t.Fatalf("status %+v %v", sts, err)
	}

	// Worker A loses NATS (as when its process hangs or its network goes):
	// it stops the link when it cannot refresh the lease, and B takes over
	// once the lease expired, with the same identity.
	died := time.Now()
	ncA.Close()
	second := gw.next(t)
	first.closeStatus(t)
	if !first.closedTime().Before(second.opened) {
		t.Fatalf("two holders at once: worker-a's link closed at %s, worker-b's opened at %s",
			first.closedTime().Format(time.StampMilli), second.opened.Format(time.StampMilli))
	}
	moved := time.Since(died)
	if second.params.Device.ID != first.params.Device.ID {
		t.Fatalf("identity changed on handover: %s -> %s", first.params.Device.ID, second.params.Device.ID)
	}
	if moved > 15*time.Second {
		t.Fatalf("handover took %s", moved)
	}
	t.Logf("handover after %s (lease TTL %s)", moved.Round(time.Millisecond), ttl)
	waitCond(t, "worker-b online", func() bool { return heldOnline(b, node) })

	// The device goes offline: B closes the link and frees the lease.
	putDevice(t, seed, wire.NodeRecord{NodeID: node, Tenant: "acme", Kind: wire.NodeKindXiaoZhi, Connected: false})
	second.closeStatus(t)
	waitCond(t, "lease released", func() bool {
		sts, err := ReadStatus(context.Background(), seed)
		return err == nil && len(sts) == 0
	})
}

func TestOnlyTheTenantsDevicesArePublished(t *testing.T) {
	srv := startNATS(t)
	gw := newFakeGateway(t)
	seed := connectNATS(t, srv, "seed")
	putDevice(t, seed, wire.NodeRecord{NodeID: "xz-000000000001", Tenant: "other", Kind: wire.NodeKindXiaoZhi, Connected: true})
	putDevice(t, seed, wire.NodeRecord{NodeID: "oc-host", Tenant: "acme", Kind: wire.NodeKindOpenClaw, Connected: true})
	putDevice(t, seed, wire.NodeRecord{NodeID: "xz-000000000002", Tenant: "acme", Kind: wire.NodeKindXiaoZhi, Connected: true})
	w, _, _ := startWorker(t, connectNATS(t, srv, "w"), "w", gw, 3*time.Second)
	c := gw.next(t)
	waitCond(t, "online", func() bool { return heldOnline(w, "xz-000000000002") })
	if c.params.Client.DisplayName != "xz-000000000002" {
		t.Fatalf("display name %q", c.params.Client.DisplayName)
	}
	if st := w.Status(); len(st) != 1 {
		t.Fatalf("links %+v, want only acme's XiaoZhi device", st)
	}
}

func TestNodeEventsReachTheUpstream(t *testing.T) {
	srv := startNATS(t)
	gw := newFakeGateway(t)
	seed := connectNATS(t, srv, "seed")
	const node = "xz-aabbccddeeff"
	putDevice(t, seed, wire.NodeRecord{NodeID: node, Tenant: "acme", Kind: wire.NodeKindXiaoZhi, Connected: true})
	w, _, _ := startWorker(t, connectNATS(t, srv, "w"), "w", gw, 3*time.Second)
	c := gw.next(t)
	waitCond(t, "online", func() bool { return heldOnline(w, node) })
	b, _ := json.Marshal(wire.NodeEventMsg{NodeID: node, Event: wire.EventToolsChanged, Payload: json.RawMessage(`{"tools":3}`)})
	if err := seed.Publish(wire.NodeEvent("acme"), b); err != nil {
		t.Fatal(err)
	}
	var ev struct {
		Event       string `json:"event"`
		PayloadJSON string `json:"payloadJSON"`
	}
	for ev.Event == "" || ev.Event == eventPresenceAlive { // the link says it is there first
		_ = json.Unmarshal(c.request(t, "node.event"), &ev)
	}
	if ev.Event != wire.EventToolsChanged || ev.PayloadJSON != `{"tools":3}` {
		t.Fatalf("node.event %+v", ev)
	}
}

func TestUpstreamNeverPrintsItsToken(t *testing.T) {
	u := Upstream{Name: "home", Tenant: "acme", URL: "ws://gw", Token: "s3cret-token"}
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("x", "upstream", u)
	for _, s := range []string{fmt.Sprint(u), fmt.Sprintf("%+v", u), fmt.Sprintf("%#v", u), logged.String(),
		fmt.Sprintf("%+v", Config{Upstreams: []Upstream{u}})} {
		if strings.Contains(s, "s3cret") {
			t.Fatalf("token printed: %s", s)
		}
		if !strings.Contains(s, "home") {
			t.Fatalf("name missing: %s", s)
		}
	}
}
