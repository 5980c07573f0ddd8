package registry

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// The gateway's copy of the upstream links finds the bucket once a shim
// creates it, serves each node only the links its key names, and stops
// serving a link that was released or whose holder stopped refreshing it.
func TestLinksFollowTheLeaseBucket(t *testing.T) {
	ns, err := natsembed.Start(natsembed.Config{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Shutdown()
	nc, err := ns.Connect("links")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	links := NewLinks(js, slog.New(slog.DiscardHandler), 20*time.Millisecond)
	done := make(chan error, 1)
	go func() { done <- links.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()

	// The shim creates the bucket after the gateway started.
	const ttl = 1500 * time.Millisecond
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.BucketUpstreamLeases, TTL: ttl,
		Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	put := func(tenant, upstream, node string, l wire.UpstreamLink) {
		b, _ := json.Marshal(l)
		if _, err := kv.Put(ctx, wire.UpstreamLinkKey(tenant, upstream, node), b); err != nil {
			t.Fatal(err)
		}
	}
	const node = "xz-aabbccddeeff"
	put("acme", "lab", node, wire.UpstreamLink{Upstream: "lab", Tenant: "acme", NodeID: node,
		State: wire.UpstreamDisabled, LastError: "AUTH_TOKEN_MISMATCH"})
	put("acme", "home", node, wire.UpstreamLink{Upstream: "home", Tenant: "acme", NodeID: node, State: wire.UpstreamOnline})
	// An entry that claims another tenant than its key is not served.
	put("acme", "evil", node, wire.UpstreamLink{Upstream: "evil", Tenant: "globex", NodeID: node, State: wire.UpstreamOnline})

	eventually.Within(t, 10*time.Second, "both links served", func() bool { return len(links.Of("acme", node)) == 2 })
	got := links.Of("acme", node)
	if got[0].Upstream != "home" || got[0].State != wire.UpstreamOnline ||
		got[1].Upstream != "lab" || got[1].State != wire.UpstreamDisabled || got[1].LastError != "AUTH_TOKEN_MISMATCH" {
		t.Fatalf("links %+v", got)
	}
	if l := links.Of("globex", node); len(l) != 0 {
		t.Fatalf("another tenant sees %+v", l)
	}

	// Released: the shim deletes the lease.
	if err := kv.Delete(ctx, wire.UpstreamLinkKey("acme", "home", node)); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, 10*time.Second, "released link gone", func() bool {
		l := links.Of("acme", node)
		return len(l) == 1 && l[0].Upstream == "lab"
	})
	// Its holder died: nobody refreshes the lease and it expires.
	eventually.Within(t, 10*time.Second, "expired link gone", func() bool { return len(links.Of("acme", node)) == 0 })
}
