package gateway_test

import (
	"context"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/xiaoclaw/xiaoclaw/pkg/authguard"
	"github.com/xiaoclaw/xiaoclaw/services/gateway"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/gwtest"
)

// connectRecorder keeps the ConnectAudits a gateway hands out.
type connectRecorder struct {
	mu   sync.Mutex
	recs []gateway.ConnectAudit
}

func (r *connectRecorder) AuditConnect(a gateway.ConnectAudit) {
	r.mu.Lock()
	r.recs = append(r.recs, a)
	r.mu.Unlock()
}

func (r *connectRecorder) snapshot() []gateway.ConnectAudit {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]gateway.ConnectAudit(nil), r.recs...)
}

// connectFrom dials from localIP and connects with token.
func connectFrom(t *testing.T, url, localIP, token string) (gwtest.Frame, *gwtest.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	c, err := gwtest.DialFrom(ctx, url, localIP)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseNow)
	f, err := c.Connect(ctx, gwtest.OperatorParams(token))
	if err != nil {
		t.Fatal(err)
	}
	return f, c
}

// A source that keeps failing authentication is refused with
// AUTH_RATE_LIMITED and a retry hint, even with a good token; another
// source is not slowed down; the failures make one audit record at once
// and one summary with their count, not one record each.
func TestRepeatedAuthFailuresThrottledPerSource(t *testing.T) {
	e := newEnv(t)
	rec := &connectRecorder{}
	gw := e.gateway(func(c *gateway.Config) {
		c.ConnectAuditor = rec
		c.AuthFailures = authguard.Config{Burst: 5, Every: time.Minute}
	})
	url := gw.URL()
	const attacker, other = "127.0.0.1", "127.0.0.2"
	for i := range 5 {
		f, _ := connectFrom(t, url, attacker, "wrong-token")
		if f.OK || f.Error.DetailCode() != "AUTH_TOKEN_MISMATCH" {
			t.Fatalf("failure %d within the budget: %s", i, f.Raw)
		}
	}
	for i := range 15 {
		tok := "wrong-token"
		if i == 0 {
			tok = tokOperator // a good token does not pass a throttled source
		}
		f, c := connectFrom(t, url, attacker, tok)
		if f.OK || f.Error.DetailCode() != "AUTH_RATE_LIMITED" || !f.Error.Retryable ||
			f.Error.RetryAfterMs <= 0 || f.Error.RetryAfterMs > time.Minute.Milliseconds() {
			t.Fatalf("attempt %d after the budget: %s, want AUTH_RATE_LIMITED with retryAfterMs", i, f.Raw)
		}
		if code, _, _ := c.CloseStatus(waitFor); code != websocket.StatusPolicyViolation {
			t.Fatalf("throttled socket closed with %v, want 1008", code)
		}
	}
	if f, _ := connectFrom(t, url, other, tokOperator); !f.OK {
		t.Fatalf("a client from another address was throttled: %s", f.Raw)
	}
	recs := rec.snapshot()
	refused := 0
	for _, r := range recs {
		if !r.Accepted {
			refused++
		}
	}
	if refused != 1 {
		t.Fatalf("%d refusal records for 20 refusals before the interval ended, want 1: %+v", refused, recs)
	}
	// The rest arrives as one summary with the count (at the latest when
	// the gateway stops).
	gw.stop()
	deadline := time.Now().Add(waitFor)
	for {
		var summary *gateway.ConnectAudit
		for _, r := range rec.snapshot() {
			if r.Count > 1 {
				summary = &r
			}
		}
		if summary != nil {
			if summary.Count != 19 || summary.RemoteIP != attacker || summary.ErrorCode != "AUTH_RATE_LIMITED" {
				t.Fatalf("summary %+v, want 19 refusals of %s", summary, attacker)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no summary record: %+v", rec.snapshot())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Behind a trusted reverse proxy, the client named by X-Forwarded-For is
// throttled, not the proxy: another client through the same proxy is
// served. A peer that is no trusted proxy cannot pick its key with the
// header.
func TestThrottledClientBehindATrustedProxy(t *testing.T) {
	e := newEnv(t)
	gw := e.gateway(func(c *gateway.Config) {
		c.AuthFailures = authguard.Config{Burst: 3, Every: time.Minute}
		c.TrustedProxies = []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}
	})
	via := func(localIP, client, token string) gwtest.Frame {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		c, err := gwtest.DialWith(ctx, gw.URL(), localIP, http.Header{"X-Forwarded-For": {client}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		f, err := c.Connect(ctx, gwtest.OperatorParams(token))
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	for range 3 {
		via("127.0.0.1", "203.0.113.7", "wrong-token")
	}
	if f := via("127.0.0.1", "203.0.113.7", tokOperator); f.OK || f.Error.DetailCode() != "AUTH_RATE_LIMITED" {
		t.Fatalf("throttled client through the proxy: %s", f.Raw)
	}
	if f := via("127.0.0.1", "198.51.100.9", tokOperator); !f.OK {
		t.Fatalf("another client through the same proxy: %s", f.Raw)
	}
	// 127.0.0.3 is no trusted proxy: its header is ignored, its own
	// address is throttled whatever it claims.
	for i := range 3 {
		via("127.0.0.3", "192.0.2."+strconv.Itoa(i+1), "wrong-token")
	}
	if f := via("127.0.0.3", "192.0.2.99", tokOperator); f.OK || f.Error.DetailCode() != "AUTH_RATE_LIMITED" {
		t.Fatalf("an untrusted peer escaped its budget with X-Forwarded-For: %s", f.Raw)
	}
}
