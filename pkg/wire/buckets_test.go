package wire_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed/natsembedtest"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// The first service creates the node registry bucket with its one
// configuration; a later service binds the bucket it finds, settings and
// entries as they are.
func TestOpenBucketCreatesOnceAndBindsAfter(t *testing.T) {
	ns := natsembedtest.Start(t)
	nc := natsembedtest.Connect(t, ns, "buckets")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	kv, err := wire.OpenBucket(ctx, js, wire.NodesBucketConfig())
	if err != nil {
		t.Fatal(err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Bucket() != wire.BucketNodes || st.History() != 1 || st.BackingStore() != "JetStream" {
		t.Fatalf("created bucket %s history %d", st.Bucket(), st.History())
	}
	if _, err := kv.Put(ctx, "acme.xz-1", []byte("{}")); err != nil {
		t.Fatal(err)
	}

	other := wire.NodesBucketConfig()
	other.History = 5
	kv2, err := wire.OpenBucket(ctx, js, other)
	if err != nil {
		t.Fatal(err)
	}
	st2, err := kv2.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st2.History() != 1 || st2.Values() != 1 {
		t.Fatalf("bound bucket history %d values %d, want the first service's bucket (1, 1)", st2.History(), st2.Values())
	}
}
