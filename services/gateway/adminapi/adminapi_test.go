package adminapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/go-chi/chi/v5"

	"github.com/xiaoclaw/xiaoclaw/pkg/policy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy/tenancytest"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/adminapi"
)

const globalToken = "global-admin-token-for-tests"

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

type env struct {
	t     *testing.T
	store *tenancy.SQLStore
	mgr   *tenancy.Manager
	srv   *httptest.Server
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newEnvOn(t, tenancytest.SQLite(t))
}

// newEnvOn serves the admin API over store.
func newEnvOn(t *testing.T, store *tenancy.SQLStore) *env {
	t.Helper()
	e := &env{t: t, store: store}
	ops := tenancy.NewOperatorAuth(e.store, tenancy.CacheConfig{}, quiet)
	engine, err := policy.New(policy.Config{Store: e.store, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	e.mgr, err = tenancy.NewManager(tenancy.ManagerConfig{Store: e.store, CheckRule: policy.CheckRule, Log: quiet,
		Notify: func(_ context.Context, c wire.TenancyChange) error {
			ops.TenancyChanged(c)
			engine.TenancyChanged(c)
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := adminapi.New(adminapi.Config{Manager: e.mgr, Operators: ops, Policy: engine,
		AdminTokens: []string{globalToken}, MaxBodyBytes: 4096, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/api/", h)
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	return e
}

type resp struct {
	status int
	body   map[string]any
	raw    string
}

func (e *env) do(token, method, path, body string) resp {
	e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, _ := http.NewRequest(method, e.srv.URL+path, rd)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	r := resp{status: res.StatusCode, raw: string(raw)}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			e.t.Fatalf("%s %s: answer is not JSON: %q", method, path, raw)
		}
	}
	return r
}

func (e *env) must(token, method, path, body string, status int) map[string]any {
	e.t.Helper()
	r := e.do(token, method, path, body)
	if r.status != status {
		e.t.Fatalf("%s %s %s: status %d, want %d: %s", method, path, body, r.status, status, r.raw)
	}
	return r.body
}

func str(v any, path ...string) string {
	for _, p := range path {
		m, _ := v.(map[string]any)
		v = m[p]
	}
	s, _ := v.(string)
	return s
}

// tenantAdmin creates a tenant and returns an admin token for it.
func (e *env) tenantAdmin(id string) string {
	e.t.Helper()
	e.must(globalToken, "POST", "/api/tenants", fmt.Sprintf(`{"id":%q}`, id), http.StatusCreated)
	b := e.must(globalToken, "POST", "/api/tenants/"+id+"/tokens", `{"role":"admin","name":"root"}`, http.StatusCreated)
	return str(b, "secret")
}

func TestAdminWorkflow(t *testing.T) {
	e := newEnv(t)
	admin := e.tenantAdmin("acme")

	// Tokens: the secret is shown once, never listed.
	b := e.must(admin, "POST", "/api/tenants/acme/tokens", `{"role":"operator","name":"ci","expiresIn":"24h"}`, http.StatusCreated)
	opSecret, opID := str(b, "secret"), str(b, "token", "id")
	if !strings.HasPrefix(opSecret, "xco_") || !strings.HasPrefix(opID, "tok_") || str(b, "token", "expiresAt") == "" {
		t.Fatalf("new token: %v", b)
	}
	list := e.do(admin, "GET", "/api/tenants/acme/tokens", "")
	if list.status != 200 || strings.Contains(list.raw, opSecret) || strings.Contains(list.raw, "secretHash") || !strings.Contains(list.raw, opID) {
		t.Fatalf("token list: %s", list.raw)
	}
	// An operator token cannot use the admin API.
	if r := e.do(opSecret, "GET", "/api/tenants/acme/tokens", ""); r.status != http.StatusForbidden || str(r.body, "error", "code") != "permission_denied" {
		t.Fatalf("operator token: %d %s", r.status, r.raw)
	}
	b = e.must(admin, "POST", "/api/tokens/"+opID+"/revoke", "", http.StatusOK)
	if str(b, "revokedAt") == "" {
		t.Fatalf("revoke: %v", b)
	}
	if r := e.do(opSecret, "GET", "/api/tenants", ""); r.status != http.StatusUnauthorized {
		t.Fatalf("revoked token: %d", r.status)
	}

	// Device keys: secret once, rotation keeps the old key until its retire time.
	b = e.must(admin, "POST", "/api/tenants/acme/device-keys", "", http.StatusCreated)
	kid := str(b, "key", "id")
	if !strings.HasPrefix(kid, "dk_") || str(b, "secret") == "" {
		t.Fatalf("device key: %v", b)
	}
	b = e.must(admin, "POST", "/api/tenants/acme/device-keys/rotate", `{"overlap":"1h"}`, http.StatusCreated)
	keys, _ := b["keys"].([]any)
	if len(keys) != 2 || str(b, "key", "id") == kid {
		t.Fatalf("rotate: %v", b)
	}
	for _, k := range keys {
		if id := str(k, "id"); id == kid && str(k, "retireAt") == "" {
			t.Fatalf("old key has no retire time after rotation: %v", k)
		}
	}
	if r := e.do(admin, "GET", "/api/tenants/acme/device-keys", ""); strings.Contains(r.raw, "secret") {
		t.Fatalf("key list shows secrets: %s", r.raw)
	}

	// Allowlist and groups.
	b = e.must(admin, "PUT", "/api/tenants/acme/device-allowlist", `{"enabled":true,"devices":["AA:BB:CC:DD:EE:FF"]}`, http.StatusOK)
	if fmt.Sprint(b["devices"]) != "[aabbccddeeff]" {
		t.Fatalf("allowlist: %v", b)
	}
	e.must(admin, "PUT", "/api/tenants/acme/groups/kitchen", `{"nodes":["xz-aabbccddeeff"]}`, http.StatusOK)
	b = e.must(admin, "GET", "/api/tenants/acme/groups", "", http.StatusOK)
	if fmt.Sprint(b["groups"]) != "[map[name:kitchen nodes:[xz-aabbccddeeff]]]" {
		t.Fatalf("groups: %v", b)
	}

	// Policy: add, list, explain, remove.
	b = e.must(admin, "POST", "/api/tenants/acme/policy/rules",
		`{"effect":"deny","subject":"operator","object":"group:kitchen","action":"mcp.tools.call.v1:self.audio_speaker.set_volume","when":"volume>60"}`, http.StatusCreated)
	ruleID := str(b, "id")
	if !strings.HasPrefix(ruleID, "rul_") || str(b, "subject") != "role:operator" || str(b, "action") != "mcp.tools.call:self.audio_speaker.set_volume" || str(b, "when") != "volume > 60" {
		t.Fatalf("rule: %v", b)
	}
	b = e.must(admin, "POST", "/api/tenants/acme/policy/explain",
		`{"subject":"role:operator","object":"xz-aabbccddeeff","action":"mcp.tools.call:self.audio_speaker.set_volume","args":{"volume":80}}`, http.StatusOK)
	if b["allowed"] != false || str(b, "ruleId") != ruleID || b["default"] != false {
		t.Fatalf("explain: %v", b)
	}
	b = e.must(admin, "POST", "/api/tenants/acme/policy/explain",
		`{"subject":"`+opID+`","object":"xz-aabbccddeeff","action":"mcp.tools.call:self.audio_speaker.set_volume","args":{"volume":10}}`, http.StatusOK)
	if b["allowed"] != true || b["default"] != true {
		t.Fatalf("explain quiet: %v", b)
	}
	b = e.must(admin, "GET", "/api/tenants/acme/policy/rules", "", http.StatusOK)
	if rules, _ := b["rules"].([]any); len(rules) != 1 {
		t.Fatalf("rules: %v", b)
	}
	e.must(admin, "DELETE", "/api/tenants/acme/policy/rules/"+ruleID, "", http.StatusNoContent)
	e.must(admin, "DELETE", "/api/tenants/acme/policy/rules/"+ruleID, "", http.StatusNotFound)
	e.must(admin, "DELETE", "/api/tenants/acme/groups/kitchen", "", http.StatusNoContent)

	// Tenant settings and lifecycle.
	b = e.must(admin, "PATCH", "/api/tenants/acme", `{"defaultEffect":"deny","displayName":"ACME"}`, http.StatusOK)
	if str(b, "defaultEffect") != "deny" || str(b, "displayName") != "ACME" {
		t.Fatalf("patch: %v", b)
	}
	e.must(globalToken, "POST", "/api/tenants/acme/suspend", "", http.StatusOK)
	if r := e.do(admin, "GET", "/api/tenants", ""); r.status != http.StatusUnauthorized {
		t.Fatalf("admin of a suspended tenant: %d", r.status)
	}
	b = e.must(globalToken, "POST", "/api/tenants/acme/resume", "", http.StatusOK)
	if str(b, "status") != "active" {
		t.Fatalf("resume: %v", b)
	}
	e.must(admin, "GET", "/api/tenants/acme", "", http.StatusOK)
}

func TestTenantAdminsAreIsolated(t *testing.T) {
	e := newEnv(t)
	acme := e.tenantAdmin("acme")
	beta := e.tenantAdmin("beta")
	b := e.must(beta, "POST", "/api/tenants/beta/tokens", `{"role":"operator"}`, http.StatusCreated)
	betaTok := str(b, "token", "id")

	b = e.must(acme, "GET", "/api/tenants", "", http.StatusOK)
	if ts, _ := b["tenants"].([]any); len(ts) != 1 || str(ts[0], "id") != "acme" {
		t.Fatalf("acme's admin lists %v", b)
	}
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/api/tenants/beta", ""},
		{"GET", "/api/tenants/beta/tokens", ""},
		{"POST", "/api/tenants/beta/tokens", `{"role":"admin"}`},
		{"POST", "/api/tokens/" + betaTok + "/revoke", ""},
		{"GET", "/api/tenants/beta/policy/rules", ""},
		{"POST", "/api/tenants/beta/policy/rules", `{"effect":"deny","subject":"*","object":"*","action":"*"}`},
		{"POST", "/api/tenants/beta/device-keys", ""},
	} {
		r := e.do(acme, c.method, c.path, c.body)
		if r.status != http.StatusNotFound || str(r.body, "error", "code") != "not_found" {
			t.Errorf("acme's admin %s %s: %d %s, want 404 not_found", c.method, c.path, r.status, r.raw)
		}
	}
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/api/tenants", `{"id":"gamma"}`},
		{"POST", "/api/tenants/acme/suspend", ""},
	} {
		if r := e.do(acme, c.method, c.path, c.body); r.status != http.StatusForbidden {
			t.Errorf("tenant admin %s %s: %d, want 403", c.method, c.path, r.status)
		}
	}
	if tok, _ := e.store.Token(context.Background(), betaTok); !tok.RevokedAt.IsZero() {
		t.Fatal("acme's admin revoked beta's token")
	}
	for _, tok := range []string{"", "nonsense", "xco_aaaaaaaaaaaaaaaa_" + strings.Repeat("a", 52)} {
		if r := e.do(tok, "GET", "/api/tenants", ""); r.status != http.StatusUnauthorized || str(r.body, "error", "code") != "unauthenticated" {
			t.Errorf("token %q: %d %s", tok, r.status, r.raw)
		}
	}
}

// snapshot is everything the store holds, to prove a refused request
// changed nothing.
func snapshot(t *testing.T, s tenancy.Store) string {
	t.Helper()
	ctx := context.Background()
	ts, err := s.Tenants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for _, tn := range ts {
		toks, _ := s.Tokens(ctx, tn.ID)
		keys, _ := s.DeviceKeys(ctx, tn.ID)
		rules, _ := s.Rules(ctx, tn.ID)
		groups, _ := s.Groups(ctx, tn.ID)
		on, devs, _ := s.Allowlist(ctx, tn.ID)
		fmt.Fprintf(&b, "%+v\n%+v\n%+v\n%+v\n%v\n%v %v\n", tn, toks, keys, rules, groups, on, devs)
	}
	return b.String()
}

func TestBadInputIsRefusedWithoutChanges(t *testing.T) {
	e := newEnv(t)
	admin := e.tenantAdmin("acme")
	e.must(admin, "POST", "/api/tenants/acme/tokens", `{"role":"viewer"}`, http.StatusCreated)
	e.must(admin, "POST", "/api/tenants/acme/policy/rules", `{"effect":"allow","subject":"*","object":"*","action":"*"}`, http.StatusCreated)
	before := snapshot(t, e.store)

	type badCase struct {
		token, method, path, body string
		contentType               string
		status                    int
		code                      string
	}
	big := `{"id":"` + strings.Repeat("a", 5000) + `"}`
	cases := []badCase{
		{globalToken, "POST", "/api/tenants", `{"id":"Bad.Tenant"}`, "", 400, "invalid_argument"},
		{globalToken, "POST", "/api/tenants", `{"id":"acme"}`, "", 409, "already_exists"},
		{globalToken, "POST", "/api/tenants", `{"id":"x","defaultEffect":"maybe"}`, "", 400, "invalid_argument"},
		{globalToken, "POST", "/api/tenants", `{"id":"x","color":"red"}`, "", 400, "invalid_argument"},
		{globalToken, "POST", "/api/tenants", `{"id":"x"} {"id":"y"}`, "", 400, "invalid_argument"},
		{globalToken, "POST", "/api/tenants", `{"id":`, "", 400, "invalid_argument"},
		{globalToken, "POST", "/api/tenants", `{"id":"x"}`, "text/plain", 415, "unsupported_media_type"},
		{globalToken, "POST", "/api/tenants", big, "", 413, "payload_too_large"},
		{globalToken, "POST", "/api/tenants/ghost/suspend", "", "", 404, "not_found"},
		{admin, "PATCH", "/api/tenants/acme", `{"defaultEffect":"sometimes"}`, "", 400, "invalid_argument"},
		{admin, "PATCH", "/api/tenants/acme", `{"status":"suspended"}`, "", 400, "invalid_argument"},
		{admin, "POST", "/api/tenants/acme/tokens", `{"role":"root"}`, "", 400, "invalid_argument"},
		{admin, "POST", "/api/tenants/acme/tokens", `{"role":"admin","expiresIn":"soon"}`, "", 400, "invalid_argument"},
		{admin, "POST", "/api/tenants/acme/tokens", `{"role":"admin","expiresIn":"-1h"}`, "", 400, "invalid_argument"},
		{admin, "POST", "/api/tenants/acme/tokens", `{"role":"admin","name":"a\u0000b"}`, "", 400, "invalid_argument"},
		{admin, "POST", "/api/tokens/tok_nope/revoke", "", "", 404, "not_found"},
		{admin, "POST", "/api/tokens/tok_aaaaaaaaaaaaaaaa/revoke", "", "", 404, "not_found"},
		{admin, "POST", "/api/tenants/acme/device-keys/rotate", `{"overlap":"forever"}`, "", 400, "invalid_argument"},
		{admin, "POST", "/api/tenants/acme/device-keys/rotate", `{"overlap":"-5m"}`, "", 400, "invalid_argument"},
		{admin, "POST", "/api/tenants/acme/device-keys/rotate", `{"overlap":"100000h"}`, "", 400, "invalid_argument"},
		{admin, "PUT", "/api/tenants/acme/device-allowlist", `{"enabled":true,"devices":["no spaces allowed"]}`, "", 400, "invalid_argument"},
		{admin, "PUT", "/api/tenants/acme/device-allowlist", `{"enabled":"yes"}`, "", 400, "invalid_argument"},
		{admin, "PUT", "/api/tenants/acme/groups/bad%20name", `{"nodes":["xz-1"]}`, "", 400, "invalid_argument"},
		{admin, "PUT", "/api/tenants/acme/groups/g", `{"nodes":["bad.node"]}`, "", 400, "invalid_argument"},
		{admin, "PUT", "/api/tenants/acme/groups/g", `{"nodes":[]}`, "", 400, "invalid_argument"},
		{admin, "PUT", "/api/tenants/acme/groups/g", `{"name":"other","nodes":["xz-1"]}`, "", 400, "invalid_argument"},
		{admin, "DELETE", "/api/tenants/acme/groups/none", "", "", 404, "not_found"},
		{admin, "POST", "/api/tenants/acme/policy/rules", `{"effect":"permit","subject":"*","object":"*","action":"*"}`, "", 400, "invalid_argument"},
		{admin, "POST", "/api/tenants/acme/policy/rules", `{"effect":"deny","subject":"role:root","object":"*","action":"*"}`, "", 400, "invalid_argument"},
		{admin, "POST", "/api/tenants/acme/policy/rules", `{"effect":"deny","subject":"*","object":"a.b","action":"*"}`, "", 400, "invalid_argument"},
		{admin, "POST", "/api/tenants/acme/policy/rules", `{"effect":"deny","subject":"*","object":"*","action":"a b"}`, "", 400, "invalid_argument"},
		{admin, "POST", "/api/tenants/acme/policy/rules", `{"effect":"deny","subject":"*","object":"*","action":"mcp.tools.call:x","when":"volume >"}`, "", 400, "invalid_argument"},
		{admin, "POST", "/api/tenants/acme/policy/rules", `{"effect":"deny","subject":"*","object":"*","action":"system.run","when":"a == 1"}`, "", 400, "invalid_argument"},
		{admin, "DELETE", "/api/tenants/acme/policy/rules/rul_aaaaaaaaaaaaaaaa", "", "", 404, "not_found"},
		{admin, "POST", "/api/tenants/acme/policy/explain", `{"subject":"*","object":"xz-*","action":"x"}`, "", 400, "invalid_argument"},
		{admin, "POST", "/api/tenants/acme/policy/explain", `{"subject":"*","object":"xz-1","action":"x","args":[1]}`, "", 400, "invalid_argument"},
		{admin, "POST", "/api/tenants/acme/policy/explain", `{"subject":"role:root","object":"xz-1","action":"x"}`, "", 400, "invalid_argument"},
		{admin, "POST", "/api/tenants/acme/policy/explain", `{"subject":"tok_aaaaaaaaaaaaaaaa","object":"xz-1","action":"x"}`, "", 400, "invalid_argument"},
		{globalToken, "PATCH", "/api/tenants/acme/limits", `{"maxInflight":-1}`, "", 400, "invalid_argument"},
		{globalToken, "PATCH", "/api/tenants/acme/limits", `{"maxInflight":5,"maxInflightPerDevice":1000001}`, "", 400, "invalid_argument"},
		{globalToken, "PATCH", "/api/tenants/acme/limits", `{"maxInflight":"10"}`, "", 400, "invalid_argument"},
		{globalToken, "PATCH", "/api/tenants/acme/limits", `{"maxInflight":1.5}`, "", 400, "invalid_argument"},
		{globalToken, "PATCH", "/api/tenants/acme/limits", `{}`, "", 400, "invalid_argument"},
		{globalToken, "PATCH", "/api/tenants/acme/limits", `{"maxInflights":10}`, "", 400, "invalid_argument"},
		{globalToken, "PATCH", "/api/tenants/ghost/limits", `{"maxInflight":10}`, "", 404, "not_found"},
		{admin, "PATCH", "/api/tenants/acme/limits", `{"maxInflight":100000}`, "", 403, "permission_denied"},
		{admin, "PATCH", "/api/tenants/acme", `{"maxInflight":100000}`, "", 400, "invalid_argument"},
		{admin, "GET", "/api/nothing-here", "", "", 404, "not_found"},
		{admin, "DELETE", "/api/tenants/acme", "", "", 405, "method_not_allowed"},
	}
	for _, c := range cases {
		req, _ := http.NewRequest(c.method, e.srv.URL+c.path, strings.NewReader(c.body))
		req.Header.Set("Authorization", "Bearer "+c.token)
		ct := c.contentType
		if ct == "" {
			ct = "application/json"
		}
		if c.body != "" {
			req.Header.Set("Content-Type", ct)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(res.Body)
		res.Body.Close()
		var env struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if err := json.Unmarshal(raw, &env); err != nil || res.StatusCode != c.status || env.Error.Code != c.code || env.Error.Message == "" {
			t.Errorf("%s %s %.80s: %d %s; want %d %s with a message", c.method, c.path, c.body, res.StatusCode, raw, c.status, c.code)
		}
		if res.Header.Get("Content-Type") != "application/json" {
			t.Errorf("%s %s: content type %q", c.method, c.path, res.Header.Get("Content-Type"))
		}
		if after := snapshot(t, e.store); after != before {
			t.Fatalf("%s %s %s changed the store:\nbefore %s\nafter  %s", c.method, c.path, c.body, before, after)
		}
	}
}

func TestMountsUnderChi(t *testing.T) {
	e := newEnv(t)
	ops := tenancy.NewOperatorAuth(e.store, tenancy.CacheConfig{}, quiet)
	engine, _ := policy.New(policy.Config{Store: e.store, Log: quiet})
	h, err := adminapi.New(adminapi.Config{Manager: e.mgr, Operators: ops, Policy: engine, AdminTokens: []string{globalToken}, Log: quiet})
	if err != nil {
		t.Fatal(err)
	}
	r := chi.NewRouter()
	r.Get("/healthz", func(w http.ResponseWriter, _ *http.Request) {})
	r.Handle("/api/*", h)
	srv := httptest.NewServer(r)
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/api/tenants", strings.NewReader(`{"id":"acme"}`))
	req.Header.Set("Authorization", "Bearer "+globalToken)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusCreated {
		t.Fatalf("POST /api/tenants under chi: %d", res.StatusCode)
	}
	var got adminapi.TenantList
	req, _ = http.NewRequest("GET", srv.URL+"/api/tenants", nil)
	req.Header.Set("Authorization", "Bearer "+globalToken)
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if err := json.NewDecoder(res.Body).Decode(&got); err != nil || len(got.Tenants) != 1 || !reflect.DeepEqual(got.Tenants[0].ID, "acme") {
		t.Fatalf("tenants under chi: %+v %v", got, err)
	}
}

func TestConfigChecks(t *testing.T) {
	if _, err := adminapi.New(adminapi.Config{}); err == nil {
		t.Fatal("empty config accepted")
	}
	e := newEnv(t)
	engine, _ := policy.New(policy.Config{Store: e.store, Log: quiet})
	_, err := adminapi.New(adminapi.Config{Manager: e.mgr, Operators: tenancy.NewOperatorAuth(e.store, tenancy.CacheConfig{}, quiet),
		Policy: engine, AdminTokens: []string{"short"}, Log: quiet})
	if err == nil {
		t.Fatal("a short global admin token was accepted")
	}
}

// A global admin sets a tenant's limits; the tenant's admin reads them but
// cannot raise them. Both stores.
func TestTenantLimitsRoundTrip(t *testing.T) {
	tenancytest.Each(t, func(t *testing.T, store *tenancy.SQLStore) {
		e := newEnvOn(t, store)
		admin := e.tenantAdmin("acme")
		limits := func(b map[string]any) string { return fmt.Sprint(b["maxInflight"], "/", b["maxInflightPerDevice"]) }
		if got := limits(e.must(admin, "GET", "/api/tenants/acme/limits", "", http.StatusOK)); got != "0/0" {
			t.Fatalf("new tenant limits = %s, want 0/0 (the shim's defaults)", got)
		}
		got := e.must(globalToken, "PATCH", "/api/tenants/acme/limits", `{"maxInflight":200,"maxInflightPerDevice":4}`, http.StatusOK)
		if limits(got) != "200/4" {
			t.Fatalf("PATCH answered %v", got)
		}
		got = e.must(globalToken, "PATCH", "/api/tenants/acme/limits", `{"maxInflightPerDevice":0}`, http.StatusOK)
		if limits(got) != "200/0" {
			t.Fatalf("PATCH of one limit answered %v", got)
		}
		tn := e.must(admin, "GET", "/api/tenants/acme", "", http.StatusOK)
		if l, _ := tn["limits"].(map[string]any); limits(l) != "200/0" {
			t.Fatalf("tenant = %v", tn)
		}
		if r := e.do(admin, "PATCH", "/api/tenants/acme/limits", `{"maxInflight":5000}`); r.status != http.StatusForbidden {
			t.Fatalf("tenant admin raised its own limit: %d %s", r.status, r.raw)
		}
		if got := limits(e.must(admin, "GET", "/api/tenants/acme/limits", "", http.StatusOK)); got != "200/0" {
			t.Fatalf("limits after a refused change = %s", got)
		}
	})
}
