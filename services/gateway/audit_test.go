package gateway_test

import (
	"context"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/audit"
	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/auditapi"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/gwtest"
)

// auditedEnv is a gateway on the real audit path: publisher → XC_AUDIT →
// writer → SQLite, with a policy that denies self.reboot and a shim that
// echoes.
type auditedEnv struct {
	*env
	store  *audit.SQLiteStore
	shim   *shim
	invoke func(reqID, tool string) gwtest.Frame
}

const auditedNode = "xz-a1b2c3d4e5f6"

func newAuditedEnv(t *testing.T) *auditedEnv {
	ctx := context.Background()
	e := newEnv(t)
	pub, err := audit.NewPublisher(ctx, e.nc, audit.PublisherConfig{AckTimeout: time.Second}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	store, err := audit.OpenSQLite(ctx, filepath.Join(t.TempDir(), "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	w, err := audit.NewWriter(e.nc, store, audit.WriterConfig{}, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	wctx, stopWriter := context.WithCancel(ctx)
	writerDone := make(chan error, 1)
	go func() { writerDone <- w.Run(wctx) }()
	t.Cleanup(func() { stopWriter(); <-writerDone })

	authz := &denyTools{tools: map[string]string{"self.reboot": "rule-no-reboot"}}
	gw := e.gateway(func(c *gateway.Config) { c.Authorizer = authz; c.Auditor = auditapi.InvokeAuditor(pub) })
	e.putNode(device(tenantAcme, auditedNode, "kitchen", true))
	sh := e.shim(tenantAcme, echoShim)
	c := operator(t, gw, tokOperator, "operator.write")
	waitListed(t, c, auditedNode, true)
	invoke := func(reqID, tool string) gwtest.Frame {
		f, err := c.CallID(ctxT(t), reqID, "node.invoke", map[string]any{"nodeId": auditedNode, "command": "mcp.tools.call",
			"params": map[string]any{"name": tool, "arguments": map[string]any{"volume": 30, "password": "hunter2"}}, "idempotencyKey": newKey()})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	return &auditedEnv{env: e, store: store, shim: sh, invoke: invoke}
}

// TestAuditUnavailableRefusesBeforeTheNodeActs: with the audit stream gone,
// a call is refused and the device is never called.
func TestAuditUnavailableRefusesBeforeTheNodeActs(t *testing.T) {
	e := newAuditedEnv(t)
	if err := e.js.DeleteStream(context.Background(), wire.StreamAudit); err != nil {
		t.Fatal(err)
	}
	fe := failure(t, e.invoke("r-unaudited", "self.audio_speaker.set_volume"))
	if fe.Code != "UNAVAILABLE" || !strings.HasPrefix(fe.Message, "audit unavailable: ") {
		t.Fatalf("got %s %q", fe.Code, fe.Message)
	}
	if n := e.shim.count(); n != 0 {
		t.Fatalf("the device was called %d times although the call could not be recorded", n)
	}
}

// TestAuditTrailAttemptAndOutcome: a call's attempt is on record while the
// device acts; once answered, audit_invocations has one row per call with
// its outcome, and a denial one row in audit_invocations and audit_denials
// and no attempt.
func TestAuditTrailAttemptAndOutcome(t *testing.T) {
	ctx := context.Background()
	e := newAuditedEnv(t)
	db := e.store.DB()
	count := func(q string) int {
		var n int
		if err := db.QueryRowContext(ctx, q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	// The device holds the call: its attempt is stored, its outcome is not.
	release := make(chan struct{})
	e.shim.sub.Unsubscribe()
	e.shim = e.env.shim(tenantAcme, func(req wire.InvokeRequest, m *nats.Msg) {
		<-release
		echoShim(req, m)
	})
	answered := make(chan gwtest.Frame, 1)
	go func() { answered <- e.invoke("r-ok", "self.audio_speaker.set_volume") }()
	eventually.True(t, "the attempt stored while the device acts", func() bool {
		return count(`SELECT count(*) FROM audit_events WHERE kind = 'node.invoke.attempt' AND request_id = 'r-ok'`) == 1
	})
	if e.shim.count() != 1 || count(`SELECT count(*) FROM audit_invocations`) != 0 {
		t.Fatalf("shim calls %d; invocations %d", e.shim.count(), count(`SELECT count(*) FROM audit_invocations`))
	}
	close(release)
	payload[map[string]any](t, <-answered)

	if fe := failure(t, e.invoke("r-deny", "self.reboot")); fe.DetailCode() != "POLICY_DENIED" {
		t.Fatalf("got %+v", fe)
	}
	eventually.True(t, "both calls' outcomes stored", func() bool {
		return count(`SELECT count(*) FROM audit_invocations WHERE tenant = 'acme'`) == 2
	})
	if n := count(`SELECT count(*) FROM audit_denials WHERE tenant = 'acme' AND tool = 'self.reboot' AND rule = 'rule-no-reboot'`); n != 1 {
		t.Fatalf("audit_denials has %d rows for the denial", n)
	}
	if n := count(`SELECT count(*) FROM audit_events WHERE kind = 'node.invoke.attempt' AND request_id = 'r-deny'`); n != 0 {
		t.Fatalf("a denied call has %d attempt rows", n)
	}
	var outcome, decision, args, attemptID, outcomeID, attemptArgs, attemptDecision, attemptOutcome, attemptTrace, outcomeTrace string
	if err := db.QueryRowContext(ctx, `SELECT id, outcome, decision, args, trace_id FROM audit_invocations WHERE request_id = 'r-ok'`).
		Scan(&outcomeID, &outcome, &decision, &args, &outcomeTrace); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRowContext(ctx, `SELECT id, decision, outcome, args, trace_id FROM audit_events WHERE kind = 'node.invoke.attempt' AND request_id = 'r-ok'`).
		Scan(&attemptID, &attemptDecision, &attemptOutcome, &attemptArgs, &attemptTrace); err != nil {
		t.Fatal(err)
	}
	if outcome != "ok" || decision != "allow" || args != `{"password":"[REDACTED]","volume":30}` {
		t.Fatalf("outcome row: %s %s %s", outcome, decision, args)
	}
	if attemptID != audit.AttemptID(outcomeID) || attemptDecision != "allow" || attemptOutcome != "" || attemptArgs != args || attemptTrace != outcomeTrace {
		t.Fatalf("attempt row %s %s %q %s %s for outcome %s %s", attemptID, attemptDecision, attemptOutcome, attemptArgs, attemptTrace, outcomeID, outcomeTrace)
	}
}

// hold blocks the calls to one tool until released.
type hold struct {
	tool    string
	held    chan struct{} // closed when a call is being held
	release chan struct{}
	once    sync.Once
}

func newHold(tool string) *hold {
	return &hold{tool: tool, held: make(chan struct{}), release: make(chan struct{})}
}

// wait holds a call to the tool; it reports whether the call was held.
func (h *hold) wait(ctx context.Context, tool string) bool {
	if tool != h.tool {
		return false
	}
	h.once.Do(func() { close(h.held) })
	select {
	case <-h.release:
	case <-ctx.Done():
	}
	return true
}

// holdingAuditor holds the records of calls to one tool (a slow stream
// acknowledgement).
type holdingAuditor struct{ *hold }

func (h holdingAuditor) AuditInvoke(ctx context.Context, a gateway.InvokeAudit) error {
	h.wait(ctx, a.Tool)
	return nil
}

// holdingAuthorizer holds the decisions on calls of one tool (a policy
// being loaded from the database) and denies them; listings pass.
type holdingAuthorizer struct{ *hold }

func (h holdingAuthorizer) Authorize(ctx context.Context, r access.Request) access.Decision {
	if r.Args != nil && h.wait(ctx, r.Tool) {
		return access.Decision{Allowed: false, RuleID: "rule-held", Reason: "held"}
	}
	return access.Decision{Allowed: true}
}

// TestSlowAuditOrPolicyDoesNotHoldTheConnection: while one call waits for
// its audit acknowledgement or its policy decision, the next requests on the
// same connection are answered.
func TestSlowAuditOrPolicyDoesNotHoldTheConnection(t *testing.T) {
	for _, slow := range []string{"audit", "policy"} {
		t.Run(slow, func(t *testing.T) {
			e := newEnv(t)
			h := newHold("self.reboot")
			gw := e.gateway(func(c *gateway.Config) {
				if slow == "audit" {
					c.Auditor = holdingAuditor{h}
					c.Authorizer = &denyTools{tools: map[string]string{"self.reboot": "rule-held"}}
				} else {
					c.Authorizer = holdingAuthorizer{h}
				}
			})
			const node = "xz-a1b2c3d4e5f6"
			e.putNode(device(tenantAcme, node, "kitchen", true))
			e.shim(tenantAcme, echoShim)
			c := operator(t, gw, tokOperator, "operator.write")
			waitListed(t, c, node, true)

			first := make(chan gwtest.Frame, 1)
			go func() {
				f, _ := c.CallID(ctxT(t), "held", "node.invoke", map[string]any{"nodeId": node, "command": "mcp.tools.call",
					"params": map[string]any{"name": "self.reboot", "arguments": map[string]any{}}, "idempotencyKey": newKey()})
				first <- f
			}()
			select {
			case <-h.held:
			case <-time.After(waitFor):
				t.Fatal("the first call never reached the " + slow)
			}
			// Both answered while the first call is held.
			payload[nodeList](t, call(t, c, "node.list", map[string]any{}))
			payload[map[string]any](t, call(t, c, "node.invoke", map[string]any{"nodeId": node, "command": "mcp.tools.call",
				"params": map[string]any{"name": "self.audio_speaker.set_volume"}, "idempotencyKey": newKey()}))
			select {
			case f := <-first:
				t.Fatalf("the held call was answered early: %s", f.Raw)
			default:
			}
			close(h.release)
			if fe := failure(t, <-first); fe.DetailCode() != "POLICY_DENIED" {
				t.Fatalf("held call answered %+v", fe)
			}
		})
	}
}
