package adminapi_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/activation"
	"github.com/xiaoclaw/xiaoclaw/pkg/authguard"
	"github.com/xiaoclaw/xiaoclaw/pkg/policy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy/tenancytest"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/adminapi"
)

// clientFrom sends requests from localIP (any 127.0.0.0/8 address
// reaches a loopback server on Linux).
func clientFrom(localIP string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(localIP)}}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
}

func send(t *testing.T, c *http.Client, method, url, token, body string) (int, http.Header, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, url, rd)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, string(raw)
}

type throttledEnv struct {
	url      string
	mgr      *tenancy.Manager
	acts     activation.Store
	tenantOp string // a tenant admin token of "acme"
}

func newThrottledEnv(t *testing.T, cfg adminapi.Config) throttledEnv {
	t.Helper()
	store := tenancytest.SQLite(t)
	ops := tenancy.NewOperatorAuth(store, tenancy.CacheConfig{}, quiet)
	engine, err := policy.New(policy.Config{Store: store, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	mgr, err := tenancy.NewManager(tenancy.ManagerConfig{Store: store, CheckRule: policy.CheckRule, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := mgr.CreateTenant(ctx, tenancy.TenantSpec{ID: "acme"}); err != nil {
		t.Fatal(err)
	}
	_, secret, err := mgr.IssueToken(ctx, "acme", tenancy.TokenSpec{Name: "admin", Role: access.RoleAdmin})
	if err != nil {
		t.Fatal(err)
	}
	acts := activation.NewMemory(activation.Config{})
	cfg.Manager, cfg.Operators, cfg.Policy, cfg.Log = mgr, ops, engine, quiet
	cfg.AdminTokens, cfg.Activator = []string{globalToken}, adminapi.ActivationBinder(acts)
	h, err := adminapi.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return throttledEnv{url: srv.URL, mgr: mgr, acts: acts, tenantOp: secret}
}

// Wrong tokens from one address get 429 with Retry-After once the budget
// is spent, even a right one then; another address is not slowed down.
func TestAdminAPIThrottlesFailedAuthenticationPerSource(t *testing.T) {
	e := newThrottledEnv(t, adminapi.Config{AuthFailures: authguard.Config{Burst: 5, Every: time.Minute}})
	attacker, other := clientFrom("127.0.0.1"), clientFrom("127.0.0.2")
	for i := range 5 {
		if st, _, body := send(t, attacker, "GET", e.url+"/api/tenants", "wrong-admin-token-000000", ""); st != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d %s, want 401", i, st, body)
		}
	}
	for _, tok := range []string{"wrong-admin-token-000000", "", globalToken} {
		st, h, body := send(t, attacker, "GET", e.url+"/api/tenants", tok, "")
		secs, _ := strconv.Atoi(h.Get("Retry-After"))
		if st != http.StatusTooManyRequests || secs < 1 || secs > 60 || !strings.Contains(body, `"rate_limited"`) {
			t.Fatalf("token %q after the budget: %d Retry-After %q %s, want 429 with Retry-After", tok, st, h.Get("Retry-After"), body)
		}
	}
	if st, _, body := send(t, other, "GET", e.url+"/api/tenants", globalToken, ""); st != http.StatusOK {
		t.Fatalf("another address: %d %s", st, body)
	}
}

// Wrong activation codes are limited per tenant: after the budget a
// tenant admin cannot go on guessing, from any address, and the right
// code is not checked either until the budget refills.
func TestActivationCodesCannotBeGuessed(t *testing.T) {
	e := newThrottledEnv(t, adminapi.Config{})
	ctx := context.Background()
	rec, err := e.acts.Request(ctx, "a0b1c2d3e4f5", "a0:b1:c2:d3:e4:f5", "client-1")
	if err != nil {
		t.Fatal(err)
	}
	wrong := func(i int) string {
		c := strconv.Itoa(100000 + i)
		if c == rec.Code {
			c = strconv.Itoa(200000 + i)
		}
		return `{"code":"` + c + `"}`
	}
	path := e.url + "/api/tenants/acme/activations"
	c1, c2 := clientFrom("127.0.0.1"), clientFrom("127.0.0.3")
	for i := range adminapi.DefaultActivationFailures.Burst {
		if st, _, body := send(t, c1, "POST", path, e.tenantOp, wrong(i)); st != http.StatusNotFound {
			t.Fatalf("wrong code %d: %d %s, want 404", i, st, body)
		}
	}
	for _, c := range []*http.Client{c1, c2} {
		st, _, body := send(t, c, "POST", path, e.tenantOp, `{"code":"`+rec.Code+`"}`)
		if st != http.StatusTooManyRequests {
			t.Fatalf("after %d wrong codes: %d %s, want 429", adminapi.DefaultActivationFailures.Burst, st, body)
		}
	}
	if got, _ := e.acts.TenantOf(ctx, "a0b1c2d3e4f5"); got != "" {
		t.Fatalf("device bound to %q while the tenant was throttled", got)
	}
	// Another tenant's operator binds its own device meanwhile.
	if _, err := e.mgr.CreateTenant(ctx, tenancy.TenantSpec{ID: "globex"}); err != nil {
		t.Fatal(err)
	}
	rec2, err := e.acts.Request(ctx, "a0b1c2d3e4f6", "a0:b1:c2:d3:e4:f6", "client-2")
	if err != nil {
		t.Fatal(err)
	}
	st, _, body := send(t, c2, "POST", e.url+"/api/tenants/globex/activations", globalToken, `{"code":"`+rec2.Code+`"}`)
	var out adminapi.ActivateResponse
	if st != http.StatusOK || json.Unmarshal([]byte(body), &out) != nil || out.Tenant != "globex" {
		t.Fatalf("another tenant's activation: %d %s", st, body)
	}
}
