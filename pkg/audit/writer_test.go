package audit_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/xiaoclaw/xiaoclaw/pkg/audit"
	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// runWriter starts a writer and returns a stop function that waits for Run.
func runWriter(t testing.TB, w *audit.Writer) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	select {
	case <-w.Ready():
	case err := <-done:
		t.Fatalf("writer stopped: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("writer not ready")
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("writer: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

func countRows(t testing.TB, s *audit.PostgresStore, where string) int {
	t.Helper()
	var n int
	if err := s.Pool().QueryRow(context.Background(), `SELECT count(*) FROM audit_events `+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPublishToPostgres: events published by two gateways reach the store
// through two writers exactly once, denied calls carry their rule, secrets
// are masked, and the documented views answer.
func TestPublishToPostgres(t *testing.T) {
	ctx := context.Background()
	connect := embeddedNATS(t)
	store := openPostgres(t, postgresURL())
	var pubs []*audit.Publisher
	for range 2 {
		p, err := audit.NewPublisher(ctx, connect(), audit.PublisherConfig{}, testLog(t))
		if err != nil {
			t.Fatal(err)
		}
		pubs = append(pubs, p)
	}
	for range 2 {
		w, err := audit.NewWriter(connect(), store, audit.WriterConfig{BatchSize: 100}, testLog(t))
		if err != nil {
			t.Fatal(err)
		}
		runWriter(t, w)
	}
	const n = 500
	var g errgroup.Group
	for i := range n {
		g.Go(func() error {
			e := audit.Event{
				ID: fmt.Sprintf("e%04d", i), Kind: audit.KindInvoke, Tenant: "acme", Principal: "tok_op", Node: "xz-a1b2c3d4e5f6",
				Command: "mcp.tools.call", Tool: "self.audio_speaker.set_volume", Decision: audit.DecisionAllow,
				Args: json.RawMessage(`{"volume":30,"opts":{"token":"s3cr3t"}}`), Outcome: "ok", LatencyUs: 1500,
				TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", Instance: "gw-1",
			}
			if i%10 == 0 {
				e.Tool, e.Decision, e.RuleID, e.Outcome, e.ErrorCode = "self.reboot", audit.DecisionDeny, "rule-no-reboot", "denied", "POLICY_DENIED"
			}
			if err := pubs[i%2].Publish(ctx, e); err != nil {
				return err
			}
			// A gateway retrying after a lost ack publishes the same id again.
			if i%7 == 0 {
				return pubs[(i+1)%2].Publish(ctx, e)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	eventually.Within(t, 20*time.Second, "500 rows", func() bool { return countRows(t, store, "") >= n })

	var rule, args string
	var denials int
	if err := store.Pool().QueryRow(ctx, `SELECT count(*), min(rule), min(args::text) FROM audit_denials WHERE tenant = 'acme'`).
		Scan(&denials, &rule, &args); err != nil {
		t.Fatal(err)
	}
	if denials != n/10 || rule != "rule-no-reboot" || args != `{"opts": {"token": "[REDACTED]"}, "volume": 30}` {
		t.Fatalf("audit_denials: %d rows, rule %q, args %s", denials, rule, args)
	}
	for _, q := range documentedQueries {
		rows, err := store.Pool().Query(ctx, q)
		if err != nil {
			t.Fatalf("%s: %v", q, err)
		}
		got := 0
		for rows.Next() {
			got++
		}
		if rows.Err() != nil || got == 0 {
			t.Fatalf("%s: %d rows, %v", q, got, rows.Err())
		}
		rows.Close()
	}
	if got := countRows(t, store, ""); got != n {
		t.Fatalf("%d rows, want exactly %d", got, n)
	}
}

// documentedQueries are the example queries of docs/audit.md.
var documentedQueries = []string{
	`SELECT ts, principal, node, tool, outcome, latency_ms FROM audit_invocations
  WHERE tenant = 'acme' AND ts > now() - interval '1 day' ORDER BY ts DESC LIMIT 50`,
	`SELECT ts, principal, node, tool, rule FROM audit_denials
  WHERE tenant = 'acme' AND ts > now() - interval '7 days' ORDER BY ts DESC`,
	`SELECT rule, count(*) AS denials FROM audit_denials
  WHERE tenant = 'acme' GROUP BY rule ORDER BY denials DESC`,
	`SELECT tool, count(*) AS calls,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms) AS p50_ms,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY latency_ms) AS p99_ms
  FROM audit_invocations WHERE tenant = 'acme' AND ts > now() - interval '1 hour' GROUP BY tool`,
	`SELECT principal, count(*) FILTER (WHERE outcome <> 'ok') AS failed, count(*) AS calls
  FROM audit_invocations WHERE tenant = 'acme' GROUP BY principal`,
	`SELECT * FROM audit_invocations WHERE trace_id = '4bf92f3577b34da6a3ce929d0e0e4736'`,
}

// TestPublishFailsClosed: when the stream cannot take an event the
// publisher says so, quickly, instead of pretending.
func TestPublishFailsClosed(t *testing.T) {
	ctx := context.Background()
	connect := embeddedNATS(t)
	nc := connect()
	p, err := audit.NewPublisher(ctx, nc, audit.PublisherConfig{AckTimeout: 500 * time.Millisecond, Stream: audit.StreamConfig{MaxBytes: 64 << 10}}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	e := audit.Event{Kind: audit.KindInvoke, Tenant: "acme", Args: json.RawMessage(`{"pad":"` + string(make([]byte, 0)) + `"}`)}
	if err := p.Publish(ctx, e); err != nil {
		t.Fatal(err)
	}
	// No writer drains the stream: once it is full, publishes fail.
	var full error
	for i := 0; i < 1000 && full == nil; i++ {
		full = p.Publish(ctx, audit.Event{Kind: audit.KindInvoke, Tenant: "acme", Detail: string(make([]byte, 1000))})
	}
	if !errors.Is(full, audit.ErrUnavailable) {
		t.Fatalf("full stream: %v", full)
	}
	if err := p.Publish(ctx, audit.Event{Kind: audit.KindInvoke, Tenant: "Not Valid"}); !errors.Is(err, audit.ErrUnavailable) {
		t.Fatalf("invalid event: %v", err)
	}
	js, _ := jetstream.New(nc)
	if err := js.DeleteStream(ctx, wire.StreamAudit); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := p.Publish(ctx, audit.Event{Kind: audit.KindInvoke, Tenant: "acme"}); !errors.Is(err, audit.ErrUnavailable) {
		t.Fatalf("no stream: %v", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("took %v to fail", d)
	}
}

// TestWriterSQLite: the embedded default runs the same path.
func TestWriterSQLite(t *testing.T) {
	ctx := context.Background()
	connect := embeddedNATS(t)
	store := openSQLite(t)
	p, err := audit.NewPublisher(ctx, connect(), audit.PublisherConfig{}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	w, _ := audit.NewWriter(connect(), store, audit.WriterConfig{}, testLog(t))
	runWriter(t, w)
	for i := range 50 {
		e := audit.Event{Kind: audit.KindInvoke, Tenant: "acme", Tool: "t", Outcome: "ok", Args: json.RawMessage(`{"password":"x"}`)}
		if i == 0 {
			e.Decision, e.RuleID, e.Outcome = audit.DecisionDeny, "r1", "denied"
		}
		if err := p.Publish(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	eventually.Within(t, 10*time.Second, "50 rows", func() bool {
		pg, err := store.Query(ctx, audit.Query{Tenant: "acme", Limit: audit.MaxLimit})
		return err == nil && len(pg.Events) == 50
	})
	var rule, args string
	if err := store.DB().QueryRowContext(ctx, `SELECT rule, args FROM audit_denials WHERE tenant = 'acme'`).Scan(&rule, &args); err != nil {
		t.Fatal(err)
	}
	if rule != "r1" || args != `{"password":"[REDACTED]"}` {
		t.Fatalf("sqlite audit_denials: %q %s", rule, args)
	}
	var calls int
	if err := store.DB().QueryRowContext(ctx, `SELECT count(*) FROM audit_invocations WHERE tenant = 'acme' AND latency_ms >= 0`).Scan(&calls); err != nil || calls != 50 {
		t.Fatalf("sqlite audit_invocations: %d %v", calls, err)
	}
}

// TestCollector: device sessions and tenancy changes on the bus become
// audit events; a re-announced session is stored once.
func TestCollector(t *testing.T) {
	ctx := context.Background()
	connect := embeddedNATS(t)
	nc := connect()
	store := openSQLite(t)
	pub, err := audit.NewPublisher(ctx, nc, audit.PublisherConfig{}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	w, _ := audit.NewWriter(nc, store, audit.WriterConfig{}, testLog(t))
	runWriter(t, w)
	c, _ := audit.NewCollector(connect(), pub, testLog(t))
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(cctx) }()
	t.Cleanup(func() { cancel(); <-done })
	<-c.Ready()

	send := func(subject string, v any) {
		b, _ := json.Marshal(v)
		if err := nc.Publish(subject, b); err != nil {
			t.Fatal(err)
		}
	}
	online := wire.DeviceEvent{Kind: wire.DeviceOnline, Tenant: "acme", Device: "a1b2c3d4e5f6", SessionID: "s1", Hub: "hub-1",
		Transport: wire.TransportWebSocket, RemoteIP: "10.0.0.7", AtMs: time.Now().UnixMilli()}
	connecting := online
	connecting.Kind = wire.DeviceConnecting
	send(wire.DeviceState("acme", "a1b2c3d4e5f6"), connecting) // the same session's connect, once
	send(wire.DeviceState("acme", "a1b2c3d4e5f6"), online)
	send(wire.DeviceState("acme", "a1b2c3d4e5f6"), online) // resync re-announces it
	send(wire.DeviceState("acme", "a1b2c3d4e5f6"), wire.DeviceEvent{Kind: wire.DeviceTools, SessionID: "s1"})
	send(wire.DeviceState("acme", "a1b2c3d4e5f6"), wire.DeviceEvent{Kind: wire.DeviceOffline, SessionID: "s1", Reason: "closed", Hub: "hub-1"})
	send(wire.SubjectTenancyChanged, wire.TenancyChange{Tenant: "acme", Kind: wire.ChangeRule, ID: "rule-1"})
	send(wire.SubjectTenancyChanged, wire.TenancyChange{Tenant: "Bad.Tenant", Kind: wire.ChangeRule})

	var kinds []string
	eventually.Within(t, 10*time.Second, "3 events", func() bool {
		p, err := store.Query(ctx, audit.Query{Tenant: "acme"})
		if err != nil || len(p.Events) < 3 {
			return false
		}
		kinds = kinds[:0]
		for _, e := range p.Events {
			kinds = append(kinds, e.Kind+":"+e.Node+":"+e.Detail)
		}
		return true
	})
	slices.Sort(kinds)
	want := []string{"device.connect:xz-a1b2c3d4e5f6:websocket 10.0.0.7", "device.disconnect:xz-a1b2c3d4e5f6:closed", "tenancy.change::rule-1"}
	if !slices.Equal(kinds, want) {
		t.Fatalf("events %v, want %v", kinds, want)
	}

	// A devicehub's refusal has no tenant: it is recorded under the
	// pseudo-tenant, readable by naming it, and carries no credential.
	send(wire.SubjectDeviceAuthFailure, wire.DeviceAuthFailure{Hub: "hub-1", Transport: wire.TransportMQTT,
		Device: "a1b2c3d4e5f6", ClientID: "GID_test@@@a1_b2", RemoteIP: "10.0.0.9", Reason: "unauthenticated", AtMs: time.Now().UnixMilli()})
	send(wire.SubjectDeviceAuthFailure, []byte("not json"))
	var fail audit.Event
	eventually.Within(t, 10*time.Second, "the auth failure", func() bool {
		p, err := store.Query(ctx, audit.Query{Tenant: audit.TenantUnknown, Kind: audit.KindDeviceAuthFail})
		if err != nil || len(p.Events) == 0 {
			return false
		}
		fail = p.Events[0]
		return true
	})
	if fail.Device != "a1b2c3d4e5f6" || fail.Instance != "hub-1" || fail.Outcome != "rejected" ||
		fail.Detail != `transport=mqtt remote=10.0.0.9 client="GID_test@@@a1_b2" reason="unauthenticated"` {
		t.Fatalf("auth failure event %+v", fail)
	}
	if p, _ := store.Query(ctx, audit.Query{Tenant: "acme", Kind: audit.KindDeviceAuthFail}); len(p.Events) != 0 {
		t.Fatalf("auth failure under a real tenant: %+v", p.Events)
	}
}
