package auditapi_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/audit"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed/natsembedtest"
	"github.com/xiaoclaw/xiaoclaw/services/gateway"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/auditapi"
)

const adminToken = "global-admin-token-0123456789"

func store(t *testing.T) *audit.SQLiteStore {
	ctx := context.Background()
	s, err := audit.OpenSQLite(ctx, filepath.Join(t.TempDir(), "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return s
}

func log() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestInvokeAuditorToStore: a denied node.invoke, as the gateway reports
// it, lands in the store with its rule, decision and masked arguments.
func TestInvokeAuditorToStore(t *testing.T) {
	ctx := context.Background()
	srv := natsembedtest.Start(t)
	nc := natsembedtest.Connect(t, srv, "test")
	s := store(t)
	pub, err := audit.NewPublisher(ctx, nc, audit.PublisherConfig{}, log())
	if err != nil {
		t.Fatal(err)
	}
	w, _ := audit.NewWriter(nc, s, audit.WriterConfig{}, log())
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	t.Cleanup(func() { cancel(); <-done })

	var auditor gateway.Auditor = auditapi.InvokeAuditor(pub)
	err = auditor.AuditInvoke(ctx, gateway.InvokeAudit{
		Time: time.Now(), Instance: "gw-1", RequestID: "r1",
		Principal: access.Principal{Tenant: "acme", ID: "tok_op", Name: "ci", Role: access.RoleOperator},
		NodeID:    "xz-a1b2c3d4e5f6", NodeKind: "xiaozhi", Command: "mcp.tools.call", Tool: "self.reboot",
		Args:     json.RawMessage(`{"delay":1,"password":"hunter2"}`),
		Decision: access.Decision{Allowed: false, RuleID: "rule-no-reboot", Reason: "off limits"},
		Outcome:  gateway.OutcomeDenied, ErrorCode: "POLICY_DENIED", IdempotencyKey: "k1", Latency: 300 * time.Microsecond,
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7",
	})
	if err != nil {
		t.Fatal(err)
	}
	var got audit.Event
	deadline := time.Now().Add(10 * time.Second)
	for {
		p, err := s.Query(ctx, audit.Query{Tenant: "acme"})
		if err == nil && len(p.Events) == 1 {
			got = p.Events[0]
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("event not stored: %+v %v", p, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got.Decision != audit.DecisionDeny || got.RuleID != "rule-no-reboot" || got.Outcome != "denied" ||
		got.ErrorCode != "POLICY_DENIED" || got.LatencyUs != 300 || got.Principal != "tok_op" || got.Instance != "gw-1" ||
		string(got.Args) != `{"delay":1,"password":"[REDACTED]"}` || got.Detail != "off limits" ||
		got.TraceID != "4bf92f3577b34da6a3ce929d0e0e4736" || got.SpanID != "00f067aa0ba902b7" {
		t.Fatalf("stored %+v (args %s)", got, got.Args)
	}
}

func TestEventsAPI(t *testing.T) {
	ctx := context.Background()
	s := store(t)
	base := time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)
	var batch []audit.Event
	for i := range 30 {
		batch = append(batch, audit.Event{ID: "a" + string(rune('A'+i)), Time: base.Add(time.Duration(i) * time.Second),
			Kind: audit.KindInvoke, Tenant: "acme", Node: "xz-000000000001", Tool: "t", Outcome: "ok"})
	}
	batch = append(batch, audit.Event{ID: "o1", Time: base, Kind: audit.KindInvoke, Tenant: "other", Outcome: "ok"})
	if _, err := s.Write(ctx, batch); err != nil {
		t.Fatal(err)
	}
	h, err := auditapi.New(auditapi.Config{Store: s, Log: log(), AdminTokens: []string{adminToken},
		Operators: access.StaticTokens{
			"viewer-acme": {Tenant: "acme", ID: "tok_v", Role: access.RoleViewer},
			"op-other":    {Tenant: "other", ID: "tok_o", Role: access.RoleOperator},
		}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	get := func(token string, q url.Values) (int, audit.Page, string) {
		req, _ := http.NewRequest("GET", srv.URL+"/api/audit/events?"+q.Encode(), nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		var p audit.Page
		_ = json.Unmarshal(b, &p)
		return res.StatusCode, p, string(b)
	}
	// A viewer reads its own tenant, page by page.
	var ids []string
	q := url.Values{"limit": {"12"}}
	for {
		code, p, body := get("viewer-acme", q)
		if code != 200 {
			t.Fatalf("%d %s", code, body)
		}
		for _, e := range p.Events {
			ids = append(ids, e.ID)
		}
		if p.NextCursor == "" {
			break
		}
		q.Set("cursor", p.NextCursor)
	}
	if len(ids) != 30 || ids[0] != "a^" {
		t.Fatalf("ids %v", ids)
	}
	if code, p, _ := get(adminToken, url.Values{"tenant": {"other"}}); code != 200 || len(p.Events) != 1 {
		t.Fatalf("global admin: %d %+v", code, p)
	}
	if code, p, _ := get("viewer-acme", url.Values{"since": {base.Add(25 * time.Second).Format(time.RFC3339)}}); code != 200 || len(p.Events) != 5 {
		t.Fatalf("since: %d %d", code, len(p.Events))
	}
	for _, c := range []struct {
		token string
		q     url.Values
		code  int
		err   string
	}{
		{"", nil, 401, "unauthenticated"},
		{"nope", nil, 401, "unauthenticated"},
		{"op-other", url.Values{"tenant": {"acme"}}, 404, "not_found"},
		{adminToken, nil, 400, "invalid_argument"},
		{"viewer-acme", url.Values{"limit": {"0"}}, 400, "invalid_argument"},
		{"viewer-acme", url.Values{"since": {"yesterday"}}, 400, "invalid_argument"},
		{"viewer-acme", url.Values{"cursor": {"!!"}}, 400, "invalid_argument"},
	} {
		code, _, body := get(c.token, c.q)
		var e struct {
			Error struct{ Code string } `json:"error"`
		}
		_ = json.Unmarshal([]byte(body), &e)
		if code != c.code || e.Error.Code != c.err {
			t.Errorf("%q %v: %d %s, want %d %s", c.token, c.q, code, body, c.code, c.err)
		}
	}
}

// TestEventsAPIRefusesUnparseableFilters: a filter the API cannot read is
// a 400 naming the problem, never dropped (which would widen the answer
// to every event of the tenant).
func TestEventsAPIRefusesUnparseableFilters(t *testing.T) {
	s := store(t)
	if _, err := s.Write(context.Background(), []audit.Event{
		{ID: "a1", Time: time.Now(), Kind: audit.KindInvoke, Tenant: "acme", Tool: "t;x", Outcome: "ok"},
		{ID: "a2", Time: time.Now(), Kind: audit.KindInvoke, Tenant: "acme", Tool: "other", Outcome: "ok"},
	}); err != nil {
		t.Fatal(err)
	}
	h, err := auditapi.New(auditapi.Config{Store: s, Log: log(), Operators: access.StaticTokens{
		"viewer-acme": {Tenant: "acme", ID: "tok_v", Role: access.RoleViewer}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	get := func(rawQuery string) (int, string) {
		req, _ := http.NewRequest("GET", srv.URL+"/api/audit/events?"+rawQuery, nil)
		req.Header.Set("Authorization", "Bearer viewer-acme")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	for q, want := range map[string]string{
		"tool=t;x":              `holds ';'`,
		"outcome=ok;tool=t":     `holds ';'`,
		"tool=%zz":              "cannot be parsed",
		"tol=other":             `unknown parameter \"tol\"`,
		"tool=other&tool=t%3Bx": `parameter \"tool\" appears more than once`,
	} {
		code, body := get(q)
		if code != 400 || !strings.Contains(body, `"invalid_argument"`) || !strings.Contains(body, want) {
			t.Errorf("?%s: %d %s, want 400 invalid_argument with %s", q, code, body, want)
		}
	}
	// The ';' percent-encoded is a value like any other.
	code, body := get("tool=t%3Bx")
	var p audit.Page
	if code != 200 || json.Unmarshal([]byte(body), &p) != nil || len(p.Events) != 1 || p.Events[0].ID != "a1" {
		t.Fatalf("?tool=t%%3Bx: %d %s", code, body)
	}
	// Every filter the API documents is accepted, the console's included.
	code, body = get("since=2000-01-01T00:00:00Z&until=2099-01-01T00:00:00Z&kind=node.invoke&node=n&principal=p&tool=t&decision=deny&outcome=ok&limit=10")
	if code != 200 {
		t.Fatalf("every filter at once: %d %s", code, body)
	}
}

// TestConnectEvent: a connect refused after its token was accepted (here
// a node host's bad device signature) belongs to the token's tenant; one
// refused before has none and goes to the pseudo-tenant.
func TestConnectEvent(t *testing.T) {
	p := access.Principal{Tenant: "acme", ID: "tok_op", Name: "ci", Role: access.RoleOperator}
	e := auditapi.ConnectEvent(gateway.ConnectAudit{Time: time.Now(), Instance: "gw-1", ConnID: "c1", RemoteIP: "10.1.2.3",
		Role: "node", ClientID: "node-host", ClientMode: "node", Principal: p,
		ErrorCode: "DEVICE_AUTH_SIGNATURE_INVALID", Reason: "device signature invalid"})
	if e.Kind != audit.KindOperatorAuthFail || e.Tenant != "acme" || e.Principal != "tok_op" || e.Outcome != gateway.OutcomeRejected ||
		e.ErrorCode != "DEVICE_AUTH_SIGNATURE_INVALID" || e.Instance != "gw-1" ||
		e.Detail != `role=node client="node-host" mode="node" remote=10.1.2.3 conn=c1 reason="device signature invalid"` {
		t.Fatalf("refused after the token: %+v", e)
	}
	e = auditapi.ConnectEvent(gateway.ConnectAudit{Role: "operator", ErrorCode: "PROTOCOL_MISMATCH"})
	if e.Tenant != audit.TenantUnknown || e.Principal != "" || e.Kind != audit.KindOperatorAuthFail {
		t.Fatalf("refused before the token: %+v", e)
	}
	e = auditapi.ConnectEvent(gateway.ConnectAudit{Accepted: true, Principal: p, Role: "operator"})
	if e.Kind != audit.KindOperatorConnect || e.Tenant != "acme" || e.Outcome != gateway.OutcomeOK || e.ErrorCode != "" {
		t.Fatalf("accepted: %+v", e)
	}
}
