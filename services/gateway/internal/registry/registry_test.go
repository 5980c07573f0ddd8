package registry

import (
	"context"
	"encoding/json"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed/natsembedtest"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

func TestWatchedCopyServesOnlyWhatTheKeyAllows(t *testing.T) {
	ns := natsembedtest.Start(t)
	nc := natsembedtest.Connect(t, ns, "registry")
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := Open(ctx, js, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	changes := make(chan string, 16)
	r.OnChange(func(tenant, nodeID string, next *Node) { changes <- tenant + "/" + nodeID })
	go func() { _ = r.Run(ctx) }()
	<-r.Ready()

	kv, _ := js.KeyValue(ctx, wire.BucketNodes)
	put := func(key string, rec wire.NodeRecord) {
		b, _ := json.Marshal(rec)
		if _, err := kv.Put(ctx, key, b); err != nil {
			t.Fatal(err)
		}
	}
	// A record that claims another tenant than its key is not served.
	put(wire.NodeKey("acme", "n1"), wire.NodeRecord{NodeID: "n1", Tenant: "globex", Connected: true})
	put(wire.NodeKey("acme", "n2"), wire.NodeRecord{NodeID: "n2", Tenant: "acme", DisplayName: "B", Connected: true,
		Commands: []string{"b", "a", "b", " "}, Caps: []string{"mcp"}})
	put(wire.NodeKey("acme", "n3"), wire.NodeRecord{NodeID: "n3", Tenant: "acme", DisplayName: "a", Connected: true})
	for want := "acme/n3"; ; {
		if got := <-changes; got == want {
			break
		}
	}
	if r.Get("acme", "n1") != nil || r.Get("globex", "n1") != nil {
		t.Fatal("served a record that disagrees with its key")
	}
	n2 := r.Get("acme", "n2")
	if !slices.Equal(n2.Commands, []string{"a", "b"}) || !n2.HasCommand("a") || n2.HasCommand(" ") || !n2.HasCap("mcp") {
		t.Fatalf("n2 = %+v", n2)
	}
	var ids []string
	for _, n := range r.List("acme") {
		ids = append(ids, n.NodeID)
	}
	if !slices.Equal(ids, []string{"n3", "n2"}) {
		t.Fatalf("list order %v", ids)
	}
	// MarkDisconnected only touches the session it names.
	if changed, err := r.MarkDisconnected(ctx, "acme", "n2", "other-session", time.Now()); err != nil || changed {
		t.Fatalf("changed another session's record: %v %v", changed, err)
	}
	if err := kv.Delete(ctx, wire.NodeKey("acme", "n3")); err != nil {
		t.Fatal(err)
	}
	for want := "acme/n3"; ; {
		if got := <-changes; got == want {
			break
		}
	}
	if r.Get("acme", "n3") != nil || r.Count() != 1 {
		t.Fatal("deleted node still served")
	}
}
