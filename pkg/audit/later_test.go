package audit_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/audit"
	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// TestLaterRidesWithPublish: events given to Later travel in the next
// Publish of their tenant (one stream message for two calls' records), or on
// their own after LaterDelay when none comes; the writer stores every event
// of a batch, and an attempt whose outcome is in the same batch leaves no
// row of its own.
func TestLaterRidesWithPublish(t *testing.T) {
	ctx := context.Background()
	connect := embeddedNATS(t)
	nc := connect()
	store := openSQLite(t)
	p, err := audit.NewPublisher(ctx, nc, audit.PublisherConfig{LaterDelay: time.Hour}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	messages := func() uint64 {
		s, err := js.Stream(ctx, wire.StreamAudit)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	call := func(id string) (attempt, outcome audit.Event) {
		outcome = audit.Event{ID: id, Kind: audit.KindInvoke, Tenant: "acme", Tool: "t", Decision: audit.DecisionAllow, Outcome: "ok"}
		attempt = outcome
		attempt.ID, attempt.Kind, attempt.Outcome = audit.AttemptID(id), audit.KindInvokeAttempt, ""
		return attempt, outcome
	}
	a1, o1 := call("call-1")
	a2, o2 := call("call-2")
	// Here the outcome waits before its own attempt, so both share the
	// attempt's message: the writer sees them in one batch for sure.
	p.Later(o1)
	p.Later(audit.Event{ID: "other-tenant", Kind: audit.KindInvoke, Tenant: "globex", Outcome: "ok"})
	if n := messages(); n != 0 {
		t.Fatalf("%d messages before any Publish", n)
	}
	if err := p.Publish(ctx, a1); err != nil { // carries o1, not globex's event
		t.Fatal(err)
	}
	if n := messages(); n != 1 {
		t.Fatalf("%d messages, want 1", n)
	}
	if err := p.Publish(ctx, a2); err != nil {
		t.Fatal(err)
	}
	p.Later(o2)
	if n := messages(); n != 2 {
		t.Fatalf("%d messages, want 2", n)
	}

	w, _ := audit.NewWriter(connect(), store, audit.WriterConfig{}, testLog(t))
	runWriter(t, w)
	ids := func(tenant string) map[string]bool {
		pg, err := store.Query(ctx, audit.Query{Tenant: tenant, Limit: audit.MaxLimit})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for _, e := range pg.Events {
			got[e.ID] = true
		}
		return got
	}
	eventually.Within(t, 10*time.Second, "call-1's outcome and call-2's attempt", func() bool {
		got := ids("acme")
		return got["call-1"] && got[audit.AttemptID("call-2")]
	})
	if got := ids("acme"); got[audit.AttemptID("call-1")] || len(got) != 2 {
		t.Fatalf("stored %v: the attempt of a call whose outcome came in the same batch is kept", got)
	}

	// Nothing else comes for these tenants: a short delay sends the rest.
	p2, err := audit.NewPublisher(ctx, nc, audit.PublisherConfig{LaterDelay: 10 * time.Millisecond}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	p2.Later(audit.Event{ID: "call-3", Kind: audit.KindInvoke, Tenant: "acme", Outcome: "ok"})
	eventually.Within(t, 10*time.Second, "a Later event alone", func() bool { return ids("acme")["call-3"] })
	if ids("globex")["other-tenant"] || ids("acme")["call-2"] {
		t.Fatal("events waiting on the first publisher were sent early")
	}
}
