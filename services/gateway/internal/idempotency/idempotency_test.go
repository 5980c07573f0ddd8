package idempotency

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed/natsembedtest"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

func openStore(tb testing.TB) *Store {
	tb.Helper()
	ns := natsembedtest.Start(tb)
	nc := natsembedtest.Connect(tb, ns, "idem")
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := Open(ctx, nc, js, Options{TTL: time.Minute})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func ctx10(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestFirstCallClaimsLaterCallsReplay(t *testing.T) {
	s := openStore(t)
	key, fp := Key("acme", "k1"), Fingerprint("n", "c", []byte(`{"a": 1}`))
	claim, prior, err := s.Begin(ctx10(t), key, fp, "gw-1")
	if err != nil || claim == nil || prior != nil {
		t.Fatalf("first Begin: %v %v %v", claim, prior, err)
	}
	// While pending, a duplicate waits for the outcome.
	got := make(chan *Record, 1)
	go func() {
		_, rec, err := s.Begin(context.Background(), key, fp, "gw-2")
		if err != nil {
			t.Error(err)
		}
		got <- rec
	}()
	select {
	case rec := <-got:
		t.Fatalf("duplicate answered while pending: %+v", rec)
	case <-time.After(100 * time.Millisecond):
	}
	if err := s.Complete(claim, fp, true, []byte(`{"v":1}`)); err != nil {
		t.Fatal(err)
	}
	if rec := <-got; rec == nil || !rec.OK || string(rec.Result) != `{"v":1}` {
		t.Fatalf("waiter got %+v", rec)
	}
	// Later: replay at once; whitespace in params does not matter.
	_, rec, err := s.Begin(ctx10(t), key, Fingerprint("n", "c", []byte(`{"a":1}`)), "gw-3")
	if err != nil || rec == nil || string(rec.Result) != `{"v":1}` {
		t.Fatalf("replay: %+v %v", rec, err)
	}
	// Other params: conflict.
	if _, _, err := s.Begin(ctx10(t), key, Fingerprint("n", "c", []byte(`{"a":2}`)), "gw-3"); !errors.Is(err, ErrConflict) {
		t.Fatalf("got %v, want ErrConflict", err)
	}
}

func TestAbandonedClaimCanBeClaimedAgain(t *testing.T) {
	s := openStore(t)
	key, fp := Key("acme", "k2"), Fingerprint("n", "c", nil)
	claim, _, err := s.Begin(ctx10(t), key, fp, "gw-1")
	if err != nil {
		t.Fatal(err)
	}
	// A waiter is released by the abandon and claims the key itself.
	got := make(chan *Claim, 1)
	go func() {
		c, _, err := s.Begin(context.Background(), key, fp, "gw-2")
		if err != nil {
			t.Error(err)
		}
		got <- c
	}()
	select {
	case c := <-got:
		t.Fatalf("claimed a pending key: %+v", c)
	case <-time.After(100 * time.Millisecond): // it waits
	}
	if err := s.Abandon(claim); err != nil {
		t.Fatal(err)
	}
	if c := <-got; c == nil {
		t.Fatal("waiter did not claim the released key")
	}
}

func TestWaiterGivesUpAtItsDeadline(t *testing.T) {
	s := openStore(t)
	key, fp := Key("acme", "k3"), Fingerprint("n", "c", nil)
	if _, _, err := s.Begin(ctx10(t), key, fp, "gw-1"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, _, err := s.Begin(ctx, key, fp, "gw-2"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
}

func TestKeysArePerTenant(t *testing.T) {
	if Key("acme", "k") == Key("globex", "k") {
		t.Fatal("same key for two tenants")
	}
}

// BenchmarkClaimAndComplete is the KV cost of one node.invoke: one
// acknowledged write to claim the key, one unacknowledged write of the
// outcome.
func BenchmarkClaimAndComplete(b *testing.B) {
	s := openStore(b)
	ctx := context.Background()
	fp := Fingerprint("n", "c", []byte(`{"name":"self.x","arguments":{}}`))
	result := []byte(`{"ok":true,"nodeId":"n","command":"c","payload":{"content":[]},"payloadJSON":"{\"content\":[]}"}`)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		claim, _, err := s.Begin(ctx, Key("acme", "b"+strconv.Itoa(i)), fp, "gw-1")
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(claim, fp, true, result); err != nil {
			b.Fatal(err)
		}
	}
	_ = s.nc.Flush()
}

// A bucket an older release created in memory storage is replaced by a file
// bucket, and the TTL follows the options.
func TestOpenReplacesMemoryBucket(t *testing.T) {
	ns := natsembedtest.Start(t)
	nc := natsembedtest.Connect(t, ns, "idem")
	js, _ := jetstream.New(nc)
	ctx := ctx10(t)
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.BucketIdempotency, TTL: time.Minute, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, nc, js, Options{TTL: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cfg := st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config
	if cfg.Storage != jetstream.FileStorage || cfg.MaxAge != 2*time.Minute {
		t.Fatalf("bucket storage %v max age %v", cfg.Storage, cfg.MaxAge)
	}
	if _, err := Open(ctx, nc, js, Options{}); err == nil {
		t.Fatal("Open without a TTL succeeded")
	}
}
