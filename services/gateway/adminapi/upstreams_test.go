package adminapi_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy/tenancytest"
)

func TestUpstreamsRoundTrip(t *testing.T) {
	tenancytest.Each(t, func(t *testing.T, store *tenancy.SQLStore) {
		e := newEnvOn(t, store)
		admin := e.tenantAdmin("acme")
		other := e.tenantAdmin("beta")
		const secret = "gateway-token-0123456789"

		r := e.do(admin, "POST", "/api/tenants/acme/upstreams",
			`{"name":"lab","url":"wss://gw.example:18789","token":"`+secret+`","insecureSkipVerify":true,`+
				`"publish":{"mode":"group","group":"kitchen"}}`)
		if r.status != http.StatusCreated {
			t.Fatalf("add: %d %s", r.status, r.raw)
		}
		if strings.Contains(r.raw, secret) {
			t.Fatalf("the answer to an add echoes the token: %s", r.raw)
		}
		if str(r.body, "upstream", "name") != "lab" || str(r.body, "upstream", "auth") != "token" ||
			str(r.body, "upstream", "publish", "mode") != "group" || str(r.body, "upstream", "publish", "group") != "kitchen" {
			t.Fatalf("add answered %s", r.raw)
		}
		// The caller token, shown this once, is the upstream's principal at the gateway.
		caller := str(r.body, "callerToken")
		ops := tenancy.NewOperatorAuth(store, tenancy.CacheConfig{}, quiet)
		if p, err := ops.AuthenticateOperator(t.Context(), caller); err != nil || p.ID != "upstream:lab" || p.Tenant != "acme" {
			t.Fatalf("caller token %q: %+v %v", caller, p, err)
		}

		bad := map[string]string{
			"http scheme":         `{"name":"x","url":"http://gw:18789","token":"t"}`,
			"no scheme":           `{"name":"x","url":"gw:18789","token":"t"}`,
			"user info in url":    `{"name":"x","url":"ws://u:p@gw:18789","token":"t"}`,
			"name with a dot":     `{"name":"a.b","url":"ws://gw:18789","token":"t"}`,
			"name with a colon":   `{"name":"a:b","url":"ws://gw:18789","token":"t"}`,
			"empty name":          `{"name":"","url":"ws://gw:18789","token":"t"}`,
			"unknown mode":        `{"name":"x","url":"ws://gw:18789","token":"t","publish":{"mode":"some"}}`,
			"group without name":  `{"name":"x","url":"ws://gw:18789","token":"t","publish":{"mode":"group"}}`,
			"nodes without ids":   `{"name":"x","url":"ws://gw:18789","token":"t","publish":{"mode":"nodes"}}`,
			"bad node id":         `{"name":"x","url":"ws://gw:18789","token":"t","publish":{"mode":"nodes","nodes":["a b"]}}`,
			"token and password":  `{"name":"x","url":"ws://gw:18789","token":"t","password":"p"}`,
			"no secret":           `{"name":"x","url":"ws://gw:18789"}`,
			"tls on ws":           `{"name":"x","url":"ws://gw:18789","token":"t","insecureSkipVerify":true}`,
			"ca that is not PEM":  `{"name":"x","url":"wss://gw:18789","token":"t","caCert":"hello"}`,
			"unknown field":       `{"name":"x","url":"ws://gw:18789","token":"t","tls":"off"}`,
			"control char secret": `{"name":"x","url":"ws://gw:18789","token":"a\nb"}`,
		}
		for what, body := range bad {
			r := e.do(admin, "POST", "/api/tenants/acme/upstreams", body)
			if r.status != http.StatusBadRequest || str(r.body, "error", "code") == "" || str(r.body, "error", "message") == "" {
				t.Errorf("%s: %d %s, want 400 with a message", what, r.status, r.raw)
			}
		}
		dup := e.do(admin, "POST", "/api/tenants/acme/upstreams", `{"name":"lab","url":"ws://other:1","password":"p"}`)
		if dup.status != http.StatusConflict {
			t.Fatalf("duplicate name: %d %s", dup.status, dup.raw)
		}

		list := e.do(admin, "GET", "/api/tenants/acme/upstreams", "")
		if list.status != http.StatusOK || strings.Contains(list.raw, secret) {
			t.Fatalf("list: %d %s", list.status, list.raw)
		}
		ups, _ := list.body["upstreams"].([]any)
		if len(ups) != 1 || str(ups[0], "url") != "wss://gw.example:18789" {
			t.Fatalf("after refused input the tenant has %s", list.raw)
		}
		one := e.do(admin, "GET", "/api/tenants/acme/upstreams/lab", "")
		if one.status != http.StatusOK || strings.Contains(one.raw, secret) || str(one.body, "name") != "lab" {
			t.Fatalf("get: %d %s", one.status, one.raw)
		}
		// The secret is kept for the shims, which connect with it.
		if u, err := store.Upstream(t.Context(), "acme", "lab"); err != nil || u.Secret != secret {
			t.Fatalf("stored secret: %v", err)
		}

		if r := e.do(other, "GET", "/api/tenants/acme/upstreams", ""); r.status != http.StatusNotFound {
			t.Fatalf("another tenant's admin listed them: %d %s", r.status, r.raw)
		}
		if r := e.do(other, "DELETE", "/api/tenants/beta/upstreams/lab", ""); r.status != http.StatusNotFound {
			t.Fatalf("deleting another tenant's upstream through one's own: %d %s", r.status, r.raw)
		}
		if strings.Contains(list.raw, caller) || strings.Contains(one.raw, caller) {
			t.Fatal("the caller token is shown again")
		}
		e.must(admin, "DELETE", "/api/tenants/acme/upstreams/lab", "", http.StatusNoContent)
		if _, err := ops.AuthenticateOperator(t.Context(), caller); err == nil {
			t.Fatal("the caller token of a removed upstream still authenticates")
		}
		e.must(admin, "GET", "/api/tenants/acme/upstreams/lab", "", http.StatusNotFound)
		e.must(admin, "DELETE", "/api/tenants/acme/upstreams/lab", "", http.StatusNotFound)
		e.must(globalToken, "POST", "/api/tenants/acme/upstreams", `{"name":"home","url":"ws://127.0.0.1:18789","password":"pw"}`, http.StatusCreated)
		b := e.must(globalToken, "GET", "/api/tenants/acme/upstreams/home", "", http.StatusOK)
		if str(b, "auth") != "password" || str(b, "publish", "mode") != "all" {
			t.Fatalf("password upstream: %v", b)
		}
	})
}
