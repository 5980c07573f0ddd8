package audit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/audit"
)

// storeSuite is the conformance suite every Store passes.
func storeSuite(t *testing.T, open func(t *testing.T) audit.Store) {
	ctx := context.Background()
	base := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	ev := func(i int, tenant string) audit.Event {
		return audit.Event{
			ID: fmt.Sprintf("ev%04d-%s", i, tenant), Time: base.Add(time.Duration(i) * time.Minute), Kind: audit.KindInvoke,
			Tenant: tenant, Principal: fmt.Sprintf("tok_%d", i%3), Node: fmt.Sprintf("xz-%012d", i%2),
			Command: "mcp.tools.call", Tool: []string{"set_volume", "reboot"}[i%2],
			Outcome: []string{"ok", "denied", "error"}[i%3], LatencyUs: int64(1000 + i),
			Decision: []string{audit.DecisionAllow, audit.DecisionDeny, audit.DecisionAllow}[i%3],
		}
	}

	t.Run("write is idempotent by id and round-trips every field", func(t *testing.T) {
		s := open(t)
		full := audit.Event{
			ID: "full", Time: base.Add(123456789 * time.Nanosecond), Kind: audit.KindInvoke, Tenant: "acme",
			Principal: "tok_1", PrincipalName: "ci", Role: "operator", Node: "xz-a1b2c3d4e5f6", Device: "a1b2c3d4e5f6",
			Command: "mcp.tools.call", Tool: "self.reboot", Args: json.RawMessage(`{"delay":5}`), Decision: audit.DecisionDeny,
			RuleID: "rule-no-reboot", Outcome: "denied", ErrorCode: "POLICY_DENIED", LatencyUs: 250,
			TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7", IdempotencyKey: "k1", Replayed: true,
			RequestID: "r1", Instance: "gw-1", Detail: "nul\x00 and bad \xff utf-8",
		}
		n, err := s.Write(ctx, []audit.Event{full, ev(1, "acme")})
		if err != nil || n != 2 {
			t.Fatalf("write: %d %v", n, err)
		}
		n, err = s.Write(ctx, []audit.Event{full, ev(1, "acme"), ev(2, "acme")})
		if err != nil || n != 1 {
			t.Fatalf("rewrite: %d new, %v; want 1", n, err)
		}
		p, err := s.Query(ctx, audit.Query{Tenant: "acme", Tool: "self.reboot"})
		if err != nil || len(p.Events) != 1 {
			t.Fatalf("query: %+v %v", p, err)
		}
		got := p.Events[0]
		want := full
		want.Time = base.Add(123456 * time.Microsecond)
		want.Detail = "nul\uFFFD and bad \uFFFD utf-8"
		gb, _ := json.Marshal(got)
		wb, _ := json.Marshal(want)
		if string(gb) != string(wb) {
			t.Fatalf("round trip\n got %s\nwant %s", gb, wb)
		}
	})

	t.Run("an invalid event fails the batch and stores nothing", func(t *testing.T) {
		s := open(t)
		bad := ev(2, "acme")
		bad.Tenant = "No.Such"
		if _, err := s.Write(ctx, []audit.Event{ev(1, "acme"), bad}); !errors.Is(err, audit.ErrInvalidEvent) {
			t.Fatalf("err %v", err)
		}
		if p, _ := s.Query(ctx, audit.Query{Tenant: "acme"}); len(p.Events) != 0 {
			t.Fatalf("stored %d", len(p.Events))
		}
	})

	t.Run("filters, tenant isolation and cursor pagination", func(t *testing.T) {
		s := open(t)
		var batch []audit.Event
		for i := range 60 {
			batch = append(batch, ev(i, "acme"))
		}
		for i := range 5 {
			batch = append(batch, ev(i, "other"))
		}
		if _, err := s.Write(ctx, batch); err != nil {
			t.Fatal(err)
		}
		// Every page newest first; the pages together are every acme event once.
		var seen []string
		q := audit.Query{Tenant: "acme", Limit: 25}
		for pages := 0; ; pages++ {
			p, err := s.Query(ctx, q)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range p.Events {
				if e.Tenant != "acme" {
					t.Fatalf("other tenant's event %+v", e)
				}
				seen = append(seen, e.ID)
			}
			if p.NextCursor == "" {
				if pages != 2 {
					t.Fatalf("%d pages, want 3", pages+1)
				}
				break
			}
			q.Cursor = p.NextCursor
		}
		if len(seen) != 60 || seen[0] != "ev0059-acme" || seen[59] != "ev0000-acme" {
			t.Fatalf("seen %d: %v … %v", len(seen), seen[0], seen[len(seen)-1])
		}
		cases := []struct {
			q    audit.Query
			want int
		}{
			{audit.Query{Tenant: "acme", Node: "xz-000000000001"}, 30},
			{audit.Query{Tenant: "acme", Principal: "tok_0"}, 20},
			{audit.Query{Tenant: "acme", Tool: "reboot", Outcome: "denied"}, 10},
			{audit.Query{Tenant: "acme", Decision: audit.DecisionDeny}, 20},
			{audit.Query{Tenant: "acme", Node: "xz-000000000001", Decision: audit.DecisionAllow}, 20},
			{audit.Query{Tenant: "acme", Since: base.Add(10 * time.Minute), Until: base.Add(20 * time.Minute)}, 10},
			{audit.Query{Tenant: "acme", Kind: audit.KindTenancyChange}, 0},
			{audit.Query{Tenant: "other"}, 5},
			{audit.Query{Tenant: "nobody"}, 0},
		}
		for _, c := range cases {
			c.q.Limit = audit.MaxLimit
			p, err := s.Query(ctx, c.q)
			if err != nil || len(p.Events) != c.want || p.NextCursor != "" {
				t.Errorf("%+v: %d events, cursor %q, %v; want %d", c.q, len(p.Events), p.NextCursor, err, c.want)
			}
		}
	})

	t.Run("bad queries are refused", func(t *testing.T) {
		s := open(t)
		for _, q := range []audit.Query{
			{Tenant: ""}, {Tenant: "Bad*"}, {Tenant: "acme", Limit: audit.MaxLimit + 1}, {Tenant: "acme", Limit: -1},
			{Tenant: "acme", Cursor: "%%%"}, {Tenant: "acme", Cursor: "bm9jb2xvbg"},
			{Tenant: "acme", Since: base, Until: base},
		} {
			if _, err := s.Query(ctx, q); !errors.Is(err, audit.ErrInvalidQuery) {
				t.Errorf("%+v: %v", q, err)
			}
		}
	})

	t.Run("retention per tenant", func(t *testing.T) {
		s := open(t)
		now := time.Now().UTC()
		var batch []audit.Event
		for i, age := range []time.Duration{0, 2 * 24 * time.Hour, 10 * 24 * time.Hour, 40 * 24 * time.Hour} {
			for _, tenant := range []string{"acme", "short", "forever"} {
				e := ev(i, tenant)
				e.Time = now.Add(-age)
				batch = append(batch, e)
			}
		}
		if _, err := s.Write(ctx, batch); err != nil {
			t.Fatal(err)
		}
		r := audit.Retention{Default: 30 * 24 * time.Hour, Tenants: map[string]time.Duration{"short": 24 * time.Hour, "forever": 0}}
		if _, err := s.Prune(ctx, r, now); err != nil {
			t.Fatal(err)
		}
		for tenant, want := range map[string]int{"acme": 3, "short": 1, "forever": 4} {
			p, err := s.Query(ctx, audit.Query{Tenant: tenant})
			if err != nil || len(p.Events) != want {
				t.Errorf("%s keeps %d events (%v), want %d", tenant, len(p.Events), err, want)
			}
		}
	})
}

func TestSQLiteStore(t *testing.T) {
	storeSuite(t, func(t *testing.T) audit.Store { return openSQLite(t) })
}

func TestPostgresStore(t *testing.T) {
	storeSuite(t, func(t *testing.T) audit.Store { return openPostgres(t, postgresURL()) })
}

// TestPostgresPartitions: partitions are created ahead and on demand, and
// retention drops whole old partitions.
func TestPostgresPartitions(t *testing.T) {
	ctx := context.Background()
	s := openPostgres(t, postgresURL())
	now := time.Now().UTC()
	if err := s.Prepare(ctx, now); err != nil {
		t.Fatal(err)
	}
	partitions := func() map[string]bool {
		rows, err := s.Pool().Query(ctx, `SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
			WHERE i.inhparent = 'audit_events'::regclass`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]bool{}
		for rows.Next() {
			var n string
			_ = rows.Scan(&n)
			out[n] = true
		}
		return out
	}
	day := func(t time.Time) string { return "audit_events_p" + t.Format("20060102") }
	got := partitions()
	for i := -1; i <= audit.PartitionsAhead; i++ {
		if !got[day(now.AddDate(0, 0, i))] {
			t.Fatalf("partition %s missing: %v", day(now.AddDate(0, 0, i)), got)
		}
	}
	old := now.AddDate(0, 0, -100)
	if _, err := s.Write(ctx, []audit.Event{{ID: "old", Time: old, Kind: audit.KindInvoke, Tenant: "acme"}}); err != nil {
		t.Fatal(err)
	}
	if !partitions()[day(old)] {
		t.Fatal("no partition created for an old event")
	}
	if _, err := s.Prune(ctx, audit.Retention{Default: 90 * 24 * time.Hour}, now); err != nil {
		t.Fatal(err)
	}
	if partitions()[day(old)] {
		t.Fatal("retention kept a partition older than every tenant's retention")
	}
}
