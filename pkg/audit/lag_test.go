package audit_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/xiaoclaw/xiaoclaw/pkg/audit"
	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry/telemetrytest"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// TestLagMonitorFollowsTheBacklog: the backlog and lag gauges count events
// published while no writer runs, still count them while a writer holds
// them and the store fails, keep their values while the consumer cannot be
// read, and fall to 0 once the writer has committed everything.
func TestLagMonitorFollowsTheBacklog(t *testing.T) {
	ctx := context.Background()
	connect := embeddedNATS(t)
	store := &switchableStore{Store: openSQLite(t)}
	pub, err := audit.NewPublisher(ctx, connect(), audit.PublisherConfig{}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	// The writers' consumer exists (a writer has run) but no writer runs.
	w, err := audit.NewWriter(connect(), store, audit.WriterConfig{}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	runWriter(t, w)()

	reg := prometheus.NewRegistry()
	var logs telemetrytest.LogBuffer
	mon, err := audit.NewLagMonitor(connect(), audit.LagMonitorConfig{Interval: 20 * time.Millisecond, Registerer: reg},
		slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	runMonitor(t, mon)
	gauges := func() (backlog, lag float64) {
		return telemetrytest.MetricValue(t, reg, telemetry.MetricAuditBacklog), telemetrytest.MetricValue(t, reg, telemetry.MetricAuditLag)
	}
	waitGauges := func(what string, cond func(backlog, lag float64) bool) {
		t.Helper()
		eventually.Within(t, 20*time.Second, what, func() bool { return cond(gauges()) })
	}

	const n = 25
	for i := range n {
		if err := pub.Publish(ctx, audit.Event{ID: fmt.Sprintf("lag%02d", i), Kind: audit.KindInvoke, Tenant: "acme",
			Tool: "t", Outcome: "ok"}); err != nil {
			t.Fatal(err)
		}
	}
	waitGauges("a backlog of 25 with a lag", func(b, l float64) bool { return b == n && l > 0 })

	// The consumer goes away: the gauges keep what they last knew.
	js, err := jetstream.New(connect())
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteConsumer(ctx, wire.StreamAudit, wire.ConsumerAuditWriter); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, 20*time.Second, "the monitor to say it cannot read the backlog", func() bool {
		return strings.Contains(logs.String(), "cannot read the backlog")
	})
	if b, l := gauges(); b != n || l <= 0 {
		t.Fatalf("while the consumer is gone: backlog %v, lag %v; want the last values kept", b, l)
	}

	// A writer comes (and creates the consumer again) but the store fails:
	// the writer holds the events unacknowledged and they still wait.
	store.down.Store(true)
	w2, err := audit.NewWriter(connect(), store, audit.WriterConfig{MaxRetryDelay: 50 * time.Millisecond}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	runWriter(t, w2)
	eventually.Within(t, 20*time.Second, "a failed write", func() bool { return store.failures.Load() > 0 })
	// The lag grows with every sample: a larger one was sampled after the
	// writer had fetched the events.
	_, lagThen := gauges()
	waitGauges("a later sample", func(_, l float64) bool { return l > lagThen })
	if b, _ := gauges(); b != n {
		t.Fatalf("backlog %v while the writer holds the events and cannot store them, want %d", b, n)
	}
	if !strings.Contains(logs.String(), "backlog readable again") {
		t.Errorf("the monitor did not say it reads the backlog again:\n%s", logs.String())
	}

	store.down.Store(false)
	waitGauges("the backlog and lag back to 0", func(b, l float64) bool { return b == 0 && l == 0 })
	pg, err := store.Query(ctx, audit.Query{Tenant: "acme", Limit: audit.MaxLimit})
	if err != nil || len(pg.Events) != n {
		t.Fatalf("%d events stored (%v), want %d", len(pg.Events), err, n)
	}
	if c := strings.Count(logs.String(), "cannot read the backlog"); c != 1 {
		t.Errorf("the consumer's absence was logged %d times, want once:\n%s", c, logs.String())
	}
}

// switchableStore fails every write while down.
type switchableStore struct {
	audit.Store
	down     atomic.Bool
	failures atomic.Int64
}

func (s *switchableStore) Write(ctx context.Context, ev []audit.Event) (int, error) {
	if s.down.Load() {
		s.failures.Add(1)
		return 0, errors.New("store down")
	}
	return s.Store.Write(ctx, ev)
}

// runMonitor runs m until the test ends.
func runMonitor(t *testing.T, m *audit.LagMonitor) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("lag monitor: %v", err)
		}
	})
}
