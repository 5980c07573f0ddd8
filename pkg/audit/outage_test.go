package audit_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/xiaoclaw/xiaoclaw/pkg/audit"
	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// TestNoLossNoDuplicates: 10,000 events give exactly 10,000 rows while the
// database is stopped and restarted in the middle and a writer is killed
// (its NATS connection cut mid-batch, no goodbye) and another started.
// It runs a PostgreSQL cluster of its own, the only one it stops.
func TestNoLossNoDuplicates(t *testing.T) {
	if testing.Short() {
		t.Log("-short: running anyway; this is the audit trail's main guarantee")
	}
	ctx := context.Background()
	pg := startThrowawayPostgres(t)
	store := openPostgres(t, pg.url())
	connect := embeddedNATS(t)
	pub, err := audit.NewPublisher(ctx, connect(), audit.PublisherConfig{}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg := audit.WriterConfig{BatchSize: 250, AckWait: 2 * time.Second, MaxRetryDelay: 300 * time.Millisecond}
	var committed atomic.Int64
	cfg.OnCommit = func(ev []audit.Event, _ time.Time) { committed.Add(int64(len(ev))) }

	const total = 10000
	next := atomic.Int64{}
	publish := func(n int) {
		t.Helper()
		var g errgroup.Group
		for range 8 {
			g.Go(func() error {
				for {
					i := next.Load() + 1
					if i > int64(n) {
						return nil
					}
					if !next.CompareAndSwap(i-1, i) {
						continue
					}
					e := audit.Event{ID: fmt.Sprintf("ev%06d", i), Kind: audit.KindInvoke, Tenant: []string{"acme", "globex"}[i%2],
						Principal: "tok_op", Node: "xz-a1b2c3d4e5f6", Command: "mcp.tools.call", Tool: "set_volume", Outcome: "ok"}
					if err := pub.Publish(ctx, e); err != nil {
						return err
					}
				}
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
	}

	ncA := connect()
	crash := &crashAfterCommit{Store: store, crash: func() { ncA.Close() }}
	wA, _ := audit.NewWriter(ncA, crash, cfg, testLog(t))
	stopA := runWriter(t, wA)

	publish(3000)
	eventually.Within(t, 20*time.Second, "the first commits", func() bool { return committed.Load() > 0 })
	pg.stop() // in the middle of writing
	publish(6000)
	js, _ := jetstream.New(connect())
	cons, err := js.Consumer(ctx, wire.StreamAudit, wire.ConsumerAuditWriter)
	if err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, 10*time.Second, "the writer to hold a batch it cannot write", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumAckPending > 0
	})
	stalled := committed.Load()
	pg.start()
	eventually.Within(t, 30*time.Second, "writes after the restart", func() bool { return committed.Load() > stalled+500 })

	// Kill writer A right after a commit, before it acknowledges: its
	// connection is cut inside the store call, so nothing it holds is
	// acked or handed back.
	publish(total)
	crash.arm()
	eventually.Within(t, 10*time.Second, "writer A to crash", crash.crashed.Load)
	stopA()
	wB, _ := audit.NewWriter(connect(), store, cfg, testLog(t))
	runWriter(t, wB)

	eventually.Within(t, 60*time.Second, "the stream to drain", func() bool {
		info, err := cons.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	})
	if got := countRows(t, store, ""); got != total {
		t.Fatalf("%d rows for %d events", got, total)
	}
	var distinct int
	if err := store.Pool().QueryRow(ctx, `SELECT count(DISTINCT id) FROM audit_events`).Scan(&distinct); err != nil || distinct != total {
		t.Fatalf("%d distinct ids, %v", distinct, err)
	}
	if committed.Load() <= total {
		t.Fatalf("the killed writer's last batch was not redelivered (%d events committed)", committed.Load())
	}
	t.Logf("committed batches held %d events for %d rows (the rest were redeliveries the store ignored)", committed.Load(), total)
}

// crashAfterCommit cuts the writer's NATS connection right after the next
// successful write once armed: a crash between commit and ack.
type crashAfterCommit struct {
	audit.Store
	armed, crashed atomic.Bool
	crash          func()
}

func (c *crashAfterCommit) arm() { c.armed.Store(true) }

func (c *crashAfterCommit) Write(ctx context.Context, ev []audit.Event) (int, error) {
	n, err := c.Store.Write(ctx, ev)
	if err == nil && c.armed.Load() && !c.crashed.Swap(true) {
		c.crash()
	}
	return n, err
}
