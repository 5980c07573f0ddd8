package auditapi_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/authguard"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/auditapi"
)

func clientFrom(localIP string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(localIP)}}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
}

func get(t *testing.T, c *http.Client, url, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode, res.Header.Get("Retry-After")
}

// Wrong tokens from one address get 429 with Retry-After once the budget
// is spent, even a right one then; another address is not slowed down.
func TestAuditAPIThrottlesFailedAuthenticationPerSource(t *testing.T) {
	h, err := auditapi.New(auditapi.Config{Store: store(t), Log: log(), AdminTokens: []string{adminToken},
		Operators:    access.StaticTokens{"viewer-acme": {Tenant: "acme", ID: "tok_v", Role: access.RoleViewer}},
		AuthFailures: authguard.Config{Burst: 3, Every: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	url := srv.URL + "/api/audit/events?tenant=acme"
	attacker, other := clientFrom("127.0.0.1"), clientFrom("127.0.0.2")
	for i := range 3 {
		if st, _ := get(t, attacker, url, "wrong"); st != http.StatusUnauthorized {
			t.Fatalf("failure %d: %d, want 401", i, st)
		}
	}
	for _, tok := range []string{"wrong", "viewer-acme"} {
		st, after := get(t, attacker, url, tok)
		if secs, _ := strconv.Atoi(after); st != http.StatusTooManyRequests || secs < 1 || secs > 60 {
			t.Fatalf("token %q after the budget: %d Retry-After %q, want 429", tok, st, after)
		}
	}
	if st, _ := get(t, other, url, "viewer-acme"); st != http.StatusOK {
		t.Fatalf("another address: %d", st)
	}
}
