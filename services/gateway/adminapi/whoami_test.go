package adminapi_test

import (
	"net/http"
	"testing"
)

func TestWhoAmITellsEveryRoleWhoItIs(t *testing.T) {
	e := newEnv(t)
	admin := e.tenantAdmin("acme")
	viewer := str(e.must(admin, "POST", "/api/tenants/acme/tokens", `{"role":"viewer","name":"wall screen"}`, http.StatusCreated), "secret")

	if b := e.must(globalToken, "GET", "/api/whoami", "", http.StatusOK); b["global"] != true || b["role"] != "admin" || b["tenant"] != nil {
		t.Errorf("global admin: %v", b)
	}
	if b := e.must(admin, "GET", "/api/whoami", "", http.StatusOK); b["global"] != false || b["role"] != "admin" || b["tenant"] != "acme" {
		t.Errorf("tenant admin: %v", b)
	}
	// A viewer may not use the rest of the admin API, but may ask who it is.
	e.must(viewer, "GET", "/api/tenants", "", http.StatusForbidden)
	b := e.must(viewer, "GET", "/api/whoami", "", http.StatusOK)
	if b["role"] != "viewer" || b["tenant"] != "acme" || b["name"] != "wall screen" || str(b, "principal") == "" {
		t.Errorf("viewer: %v", b)
	}

	for _, tok := range []string{"", "xco_nope_nope", globalToken + "x"} {
		r := e.do(tok, "GET", "/api/whoami", "")
		if r.status != http.StatusUnauthorized || str(r.body, "error", "code") != "unauthenticated" {
			t.Errorf("token %q: %d %s", tok, r.status, r.raw)
		}
	}
	r := e.do(admin, "POST", "/api/whoami", "")
	if r.status != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d %s", r.status, r.raw)
	}
}
