// Package auditapi connects the gateway to the audit trail (pkg/audit): the
// Auditor that publishes each node.invoke to the XC_AUDIT stream before the
// gateway answers, and the read-only HTTP API over the audit store, served
// under /api/audit/.
//
//	GET /api/audit/events?tenant=T&since=RFC3339&until=RFC3339&kind=K&node=N
//	    &principal=P&tool=X&outcome=O&decision=D&limit=N&cursor=C
//	→ 200 {"events":[audit.Event…],"nextCursor":"…"}
//
// Callers present "Authorization: Bearer <token>". An operator token of any
// role (admin, operator, viewer) reads its own tenant's events (tenant may
// be omitted); any other tenant is "not found" to it. A global admin token
// reads every tenant and must name one. Errors are {"error":{"code","message"}}
// as in the admin API. A query that does not parse cleanly (a ';', a bad
// escape, an unknown or repeated parameter) is 400 invalid_argument: a
// filter silently dropped would widen the answer.
package auditapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/audit"
	"github.com/xiaoclaw/xiaoclaw/pkg/authguard"
	"github.com/xiaoclaw/xiaoclaw/services/gateway"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/httpapi"
)

// InvokeAuditor returns the gateway Auditor that publishes every
// node.invoke with p: gateway.Config{Auditor: auditapi.InvokeAuditor(p)}.
func InvokeAuditor(p *audit.Publisher) gateway.Auditor { return invokeAuditor{p} }

type invokeAuditor struct{ p *audit.Publisher }

// AuditInvoke publishes r and waits for the stream's acknowledgement, but
// for the outcome of a call sent to its node: its attempt is on record, so
// the outcome rides with the next message of its tenant (Publisher.Later).
func (a invokeAuditor) AuditInvoke(ctx context.Context, r gateway.InvokeAudit) error {
	if r.Sent && !r.Attempt {
		a.p.Later(InvokeEvent(r))
		return nil
	}
	return a.p.Publish(ctx, InvokeEvent(r))
}

// InvokeEvent converts the gateway's record of a node.invoke: an attempt
// becomes a node.invoke.attempt event, an outcome the call's node.invoke
// event. The outcome's id is the call's arrival time in ms (12 hex digits,
// so ids sort as audit.NewID's do) and its CallID; the attempt's is
// audit.AttemptID of it.
func InvokeEvent(r gateway.InvokeAudit) audit.Event {
	e := audit.Event{
		Time: r.Time, Kind: audit.KindInvoke, Tenant: r.Principal.Tenant, Principal: r.Principal.ID,
		PrincipalName: r.Principal.Name, Role: r.Principal.Role, Node: r.NodeID, Command: r.Command, Tool: r.Tool,
		Args: r.Args, RuleID: r.Decision.RuleID, Outcome: r.Outcome, ErrorCode: r.ErrorCode,
		LatencyUs: r.Latency.Microseconds(), IdempotencyKey: r.IdempotencyKey, Replayed: r.Replayed,
		RequestID: r.RequestID, Instance: r.Instance, Detail: r.Decision.Reason, TraceID: r.TraceID, SpanID: r.SpanID,
	}
	if r.Via != "" {
		// The channel and client ride in detail, ahead of the policy's reason.
		via := "via " + r.Via
		if r.Client != "" {
			via += " client " + r.Client
		}
		if e.Detail != "" {
			via += "; " + e.Detail
		}
		e.Detail = via
	}
	switch {
	case r.Decision.Allowed:
		e.Decision = audit.DecisionAllow
	case r.Outcome == gateway.OutcomeDenied:
		e.Decision = audit.DecisionDeny
	}
	if r.CallID != "" {
		e.ID = fmt.Sprintf("%012x%s", r.Time.UnixMilli(), r.CallID)
	}
	if r.Attempt {
		e.Kind = audit.KindInvokeAttempt
		if e.ID != "" {
			e.ID = audit.AttemptID(e.ID)
		}
	}
	return e
}

// maxConnectAuditsInFlight bounds the connect events being published at
// once; beyond it (a connect storm while the stream is slow) events are
// dropped rather than queued without bound or held on the handshake path.
const maxConnectAuditsInFlight = 256

// ConnectAuditor returns the gateway ConnectAuditor that publishes every
// accepted and refused connect with p, best-effort and never blocking the
// handshake: gateway.Config{ConnectAuditor: auditapi.ConnectAuditor(p, log)}.
// An event the stream does not take is logged and lost.
func ConnectAuditor(p *audit.Publisher, log *slog.Logger) gateway.ConnectAuditor {
	return &connectAuditor{p: p, log: log, slots: make(chan struct{}, maxConnectAuditsInFlight)}
}

type connectAuditor struct {
	p       *audit.Publisher
	log     *slog.Logger
	slots   chan struct{}
	dropped atomic.Int64
}

// AuditConnect publishes r in the background.
func (a *connectAuditor) AuditConnect(r gateway.ConnectAudit) {
	select {
	case a.slots <- struct{}{}:
	default:
		// Log the first drop and then every thousandth, not each one.
		if n := a.dropped.Add(1); n%1000 == 1 {
			a.log.Warn("audit: connect events dropped, too many in flight", "dropped", n)
		}
		return
	}
	go func() {
		defer func() { <-a.slots }()
		e := ConnectEvent(r)
		if err := a.p.Publish(context.Background(), e); err != nil {
			a.log.Warn("audit: connect event not recorded", "kind", e.Kind, "tenant", e.Tenant, "err", err)
		}
	}()
}

// ConnectEvent converts the gateway's record of a connect. A connect
// refused before its token was accepted has no tenant: it is recorded
// under audit.TenantUnknown.
func ConnectEvent(r gateway.ConnectAudit) audit.Event {
	e := audit.Event{
		Time: r.Time, Kind: audit.KindOperatorAuthFail, Tenant: r.Principal.Tenant, Principal: r.Principal.ID,
		PrincipalName: r.Principal.Name, Role: r.Principal.Role, Node: r.NodeID, Outcome: gateway.OutcomeRejected,
		ErrorCode: r.ErrorCode, Instance: r.Instance,
	}
	if r.Accepted {
		e.Kind, e.Outcome = audit.KindOperatorConnect, gateway.OutcomeOK
	}
	if e.Tenant == "" {
		e.Tenant = audit.TenantUnknown
	}
	e.Detail = "role=" + r.Role + " client=" + strconv.Quote(r.ClientID) + " mode=" + strconv.Quote(r.ClientMode) +
		" remote=" + r.RemoteIP + " conn=" + r.ConnID
	if r.Reason != "" {
		e.Detail += " reason=" + strconv.Quote(r.Reason)
	}
	if r.Count > 1 {
		e.Detail += " count=" + strconv.Itoa(r.Count)
	}
	return e
}

// Config configures the audit API.
type Config struct {
	Store audit.Store
	// Operators authenticates operator bearer tokens.
	Operators access.Authenticator
	// AdminTokens are global admin bearer tokens (may read any tenant).
	AdminTokens []string
	// AuthFailures throttles failed authentication per source address:
	// default 10 in a row, then one every 6 s; a throttled request gets
	// 429 with Retry-After, whatever its token.
	AuthFailures authguard.Config
	// TrustedProxies are the reverse proxies whose X-Forwarded-For names
	// the client whose failures count (gateway.Config.TrustedProxies).
	TrustedProxies []netip.Prefix
	Log            *slog.Logger
}

type api struct {
	cfg  Config
	auth *httpapi.Authenticator
}

// New returns the handler. Serve it for every path under /api/audit/
// without stripping the prefix: mux.Handle("/api/audit/", h).
func New(cfg Config) (http.Handler, error) {
	if cfg.Store == nil || cfg.Operators == nil || cfg.Log == nil {
		return nil, errors.New("auditapi: store, operator authenticator and logger are required")
	}
	a := &api{cfg: cfg}
	auth, err := httpapi.NewAuthenticator(httpapi.AuthConfig{
		Name: "audit API", AdminTokens: cfg.AdminTokens, Operators: cfg.Operators,
		Failures: cfg.AuthFailures, TrustedProxies: cfg.TrustedProxies, Log: cfg.Log,
	})
	if err != nil {
		return nil, err
	}
	a.auth = auth
	r := chi.NewRouter()
	r.NotFound(httpapi.NotFound)
	r.MethodNotAllowed(httpapi.MethodNotAllowed)
	r.Get("/api/audit/events", a.events)
	return r, nil
}

// caller returns the tenant the caller may read ("" for a global admin),
// or false after answering the request.
func (a *api) caller(w http.ResponseWriter, r *http.Request) (tenant string, global, ok bool) {
	c, ok := a.auth.Authenticate(w, r)
	switch {
	case !ok:
		return "", false, false
	case c.Global:
		return "", true, true
	}
	p := c.Principal
	switch p.Role {
	case access.RoleAdmin, access.RoleOperator, access.RoleViewer:
		return p.Tenant, false, true
	}
	httpapi.WriteError(w, httpapi.Fail(httpapi.CodePermission, "this token may not read the audit trail"))
	return "", false, false
}

func (a *api) events(w http.ResponseWriter, r *http.Request) {
	own, global, ok := a.caller(w, r)
	if !ok {
		return
	}
	v, msg := parseQuery(r.URL.RawQuery)
	if msg != "" {
		httpapi.WriteError(w, httpapi.Fail(httpapi.CodeInvalid, msg))
		return
	}
	q := audit.Query{
		Tenant: v.Get("tenant"), Kind: v.Get("kind"), Node: v.Get("node"), Principal: v.Get("principal"),
		Tool: v.Get("tool"), Outcome: v.Get("outcome"), Decision: v.Get("decision"), Cursor: v.Get("cursor"),
	}
	switch {
	case global && q.Tenant == "":
		httpapi.WriteError(w, httpapi.Fail(httpapi.CodeInvalid, "tenant is required"))
		return
	case !global && q.Tenant == "":
		q.Tenant = own
	case !global && q.Tenant != own:
		httpapi.WriteError(w, httpapi.Fail(httpapi.CodeNotFound, "no such tenant"))
		return
	}
	for _, f := range []struct {
		name string
		t    *time.Time
	}{{"since", &q.Since}, {"until", &q.Until}} {
		if s := v.Get(f.name); s != "" {
			t, err := time.Parse(time.RFC3339Nano, s)
			if err != nil {
				httpapi.WriteError(w, httpapi.Fail(httpapi.CodeInvalid, f.name+" must be an RFC 3339 time such as 2026-01-02T15:04:05Z"))
				return
			}
			*f.t = t
		}
	}
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > audit.MaxLimit {
			httpapi.WriteError(w, httpapi.Fail(httpapi.CodeInvalid, "limit must be 1-"+strconv.Itoa(audit.MaxLimit)))
			return
		}
		q.Limit = n
	}
	page, err := a.cfg.Store.Query(r.Context(), q)
	switch {
	case errors.Is(err, audit.ErrInvalidQuery):
		httpapi.WriteError(w, httpapi.Fail(httpapi.CodeInvalid, strings.TrimPrefix(err.Error(), "audit: invalid query: ")))
		return
	case err != nil:
		a.cfg.Log.Error("audit query failed", "tenant", q.Tenant, "err", err)
		httpapi.WriteError(w, httpapi.Fail(httpapi.CodeUnavailable, "the audit store cannot be read right now"))
		return
	}
	httpapi.WriteJSON(w, http.StatusOK, page)
}

// queryParams are the parameters of GET /api/audit/events.
var queryParams = []string{"tenant", "since", "until", "kind", "node", "principal", "tool", "decision", "outcome", "limit", "cursor"}

// parseQuery reads the query strictly. A filter dropped on the way (url's
// Query skips a pair holding ';', an unknown key would be ignored, a
// repeated one half-read) widens the answer without a word, so each of
// those is refused with a message instead.
func parseQuery(raw string) (url.Values, string) {
	v, err := url.ParseQuery(raw)
	switch {
	case err != nil && strings.Contains(raw, ";"):
		return nil, "the query holds ';', which does not separate parameters: join them with '&' and write a ';' inside a value as %3B"
	case err != nil:
		return nil, "the query cannot be parsed: " + err.Error()
	}
	for _, k := range slices.Sorted(maps.Keys(v)) {
		switch {
		case !slices.Contains(queryParams, k):
			return nil, "unknown parameter " + strconv.Quote(k) + "; the parameters are " + strings.Join(queryParams, ", ")
		case len(v[k]) > 1:
			return nil, "parameter " + strconv.Quote(k) + " appears more than once"
		}
	}
	return v, ""
}
