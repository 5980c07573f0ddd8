package adminapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/activation"
	"github.com/xiaoclaw/xiaoclaw/pkg/authguard"
	"github.com/xiaoclaw/xiaoclaw/pkg/policy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"

	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/httpapi"
)

// Request and response bodies (api/admin-openapi.yaml names them).

// TenantList is the answer of GET /api/tenants.
type TenantList struct {
	Tenants []tenancy.Tenant `json:"tenants"`
}

// TenantPatch is the body of PATCH /api/tenants/{tenant}.
type TenantPatch struct {
	DisplayName   *string `json:"displayName,omitempty"`
	DefaultEffect *string `json:"defaultEffect,omitempty"`
	// RequireToolApproval: the tools a known node gains stay hidden and
	// refused until an admin approves them (POST .../nodes/{node}/approve-tools).
	RequireToolApproval *bool `json:"requireToolApproval,omitempty"`
}

// LimitsPatch is the body of PATCH /api/tenants/{tenant}/limits: the
// limits to change, 0 restoring the shim's default.
type LimitsPatch struct {
	MaxInflight          *int `json:"maxInflight,omitempty"`
	MaxInflightPerDevice *int `json:"maxInflightPerDevice,omitempty"`
}

// TokenRequest is the body of POST /api/tenants/{tenant}/tokens.
type TokenRequest struct {
	Name string `json:"name,omitempty"`
	Role string `json:"role"`
	// ExpiresIn is a Go duration ("720h"); empty means 90 days.
	ExpiresIn string `json:"expiresIn,omitempty"`
}

// NewToken answers a token creation; Secret is shown this once.
type NewToken struct {
	Token  tenancy.Token `json:"token"`
	Secret string        `json:"secret"`
}

// TokenList is the answer of GET /api/tenants/{tenant}/tokens.
type TokenList struct {
	Tokens []tenancy.Token `json:"tokens"`
}

// RotateRequest is the body of POST .../device-keys/rotate.
type RotateRequest struct {
	// Overlap is how long the old keys keep verifying, a Go duration;
	// empty means 24h.
	Overlap string `json:"overlap,omitempty"`
}

// NewDeviceKey answers a key creation or rotation; Secret is shown this
// once. Keys lists all the tenant's keys after a rotation.
type NewDeviceKey struct {
	Key    tenancy.DeviceKey   `json:"key"`
	Secret string              `json:"secret"`
	Keys   []tenancy.DeviceKey `json:"keys,omitempty"`
}

// DeviceKeyList is the answer of GET .../device-keys.
type DeviceKeyList struct {
	Keys []tenancy.DeviceKey `json:"keys"`
}

// Allowlist is the body and answer of .../device-allowlist.
type Allowlist struct {
	Enabled bool     `json:"enabled"`
	Devices []string `json:"devices"`
}

// Group is the body of PUT .../groups/{group} and an item of GroupList.
type Group struct {
	Name  string   `json:"name,omitempty"`
	Nodes []string `json:"nodes"`
}

// GroupList is the answer of GET .../groups.
type GroupList struct {
	Groups []Group `json:"groups"`
}

// RuleRequest is the body of POST .../policy/rules.
type RuleRequest struct {
	Effect      string `json:"effect"`
	Subject     string `json:"subject"`
	Object      string `json:"object"`
	Action      string `json:"action"`
	When        string `json:"when,omitempty"`
	Description string `json:"description,omitempty"`
}

// RuleList is the answer of GET .../policy/rules.
type RuleList struct {
	Rules []tenancy.Rule `json:"rules"`
}

// ExplainRequest is the body of POST .../policy/explain.
type ExplainRequest struct {
	// Subject is a token id (its role is looked up), a role
	// ("role:operator" or "operator"), another principal id, or "*".
	Subject string          `json:"subject"`
	Object  string          `json:"object"` // a node id
	Action  string          `json:"action"` // a command, or mcp.tools.call:<tool>
	Args    json.RawMessage `json:"args,omitempty"`
}

// ExplainResponse says which rule decides and why.
type ExplainResponse struct {
	Allowed bool   `json:"allowed"`
	RuleID  string `json:"ruleId,omitempty"`
	Reason  string `json:"reason"`
	// Default is true when no rule applied and the tenant's default decided.
	Default bool `json:"default"`
	// Matched lists every rule whose subject, object and action match, in
	// rule order; applies is false when its predicate does not hold.
	Matched []policy.MatchedRule `json:"matched"`
}

const defaultOverlap = 24 * time.Hour

func tenantParam(r *http.Request) string { return chi.URLParam(r, "tenant") }

func (a *api) listTenants(r *http.Request) (int, any, error) {
	c := callerOf(r)
	if !c.Global {
		t, err := a.store.Tenant(r.Context(), c.Principal.Tenant)
		if err != nil {
			return 0, nil, err
		}
		return http.StatusOK, TenantList{Tenants: []tenancy.Tenant{t}}, nil
	}
	ts, err := a.store.Tenants(r.Context())
	return http.StatusOK, TenantList{Tenants: ts}, err
}

func (a *api) createTenant(r *http.Request) (int, any, error) {
	var spec tenancy.TenantSpec
	if err := a.decode(r, &spec); err != nil {
		return 0, nil, err
	}
	t, err := a.cfg.Manager.CreateTenant(r.Context(), spec)
	return http.StatusCreated, t, err
}

func (a *api) getTenant(r *http.Request) (int, any, error) {
	t, err := a.store.Tenant(r.Context(), tenantParam(r))
	return http.StatusOK, t, err
}

func (a *api) updateTenant(r *http.Request) (int, any, error) {
	var p TenantPatch
	if err := a.decode(r, &p); err != nil {
		return 0, nil, err
	}
	t, err := a.cfg.Manager.UpdateTenant(r.Context(), tenantParam(r),
		tenancy.TenantUpdate{DisplayName: p.DisplayName, DefaultEffect: p.DefaultEffect, RequireToolApproval: p.RequireToolApproval})
	return http.StatusOK, t, err
}

func (a *api) getLimits(r *http.Request) (int, any, error) {
	t, err := a.store.Tenant(r.Context(), tenantParam(r))
	return http.StatusOK, t.Limits, err
}

// updateLimits changes a tenant's shares of the shims. Only a global admin
// may: a tenant admin raising its own share would take it from the others.
func (a *api) updateLimits(r *http.Request) (int, any, error) {
	var p LimitsPatch
	if err := a.decode(r, &p); err != nil {
		return 0, nil, err
	}
	if p.MaxInflight == nil && p.MaxInflightPerDevice == nil {
		return 0, nil, invalid("name maxInflight, maxInflightPerDevice or both")
	}
	t, err := a.cfg.Manager.UpdateTenant(r.Context(), tenantParam(r),
		tenancy.TenantUpdate{MaxInflight: p.MaxInflight, MaxInflightPerDevice: p.MaxInflightPerDevice})
	return http.StatusOK, t.Limits, err
}

func (a *api) setStatus(status string) handlerFunc {
	return func(r *http.Request) (int, any, error) {
		t, err := a.cfg.Manager.UpdateTenant(r.Context(), tenantParam(r), tenancy.TenantUpdate{Status: &status})
		return http.StatusOK, t, err
	}
}

func (a *api) listTokens(r *http.Request) (int, any, error) {
	ts, err := a.store.Tokens(r.Context(), tenantParam(r))
	return http.StatusOK, TokenList{Tokens: ts}, err
}

func (a *api) createToken(r *http.Request) (int, any, error) {
	var req TokenRequest
	if err := a.decode(r, &req); err != nil {
		return 0, nil, err
	}
	ttl, err := duration("expiresIn", req.ExpiresIn)
	if err != nil {
		return 0, nil, err
	}
	if req.ExpiresIn != "" && ttl <= 0 {
		return 0, nil, invalid("expiresIn must be positive")
	}
	t, secret, err := a.cfg.Manager.IssueToken(r.Context(), tenantParam(r), tenancy.TokenSpec{Name: req.Name, Role: req.Role, TTL: ttl})
	return http.StatusCreated, NewToken{Token: t, Secret: secret}, err
}

// revokeToken revokes by id alone; a tenant admin only reaches its own
// tenant's tokens (others are "not found").
func (a *api) revokeToken(r *http.Request) (int, any, error) {
	id := chi.URLParam(r, "token")
	notFound := fmt.Errorf("token %q: %w", id, tenancy.ErrNotFound)
	if !tenancy.ValidTokenID(id) {
		return 0, nil, notFound
	}
	t, err := a.store.Token(r.Context(), id)
	if err != nil {
		return 0, nil, err
	}
	if c := callerOf(r); !c.Global && c.Principal.Tenant != t.Tenant {
		return 0, nil, notFound
	}
	t, err = a.cfg.Manager.RevokeToken(r.Context(), t.Tenant, id)
	return http.StatusOK, t, err
}

func (a *api) listDeviceKeys(r *http.Request) (int, any, error) {
	ks, err := a.store.DeviceKeys(r.Context(), tenantParam(r))
	return http.StatusOK, DeviceKeyList{Keys: ks}, err
}

func (a *api) createDeviceKey(r *http.Request) (int, any, error) {
	k, err := a.cfg.Manager.CreateDeviceKey(r.Context(), tenantParam(r))
	return http.StatusCreated, NewDeviceKey{Key: k, Secret: k.Secret}, err
}

func (a *api) rotateDeviceKey(r *http.Request) (int, any, error) {
	var req RotateRequest
	if r.ContentLength != 0 {
		if err := a.decode(r, &req); err != nil {
			return 0, nil, err
		}
	}
	overlap, err := duration("overlap", req.Overlap)
	if err != nil {
		return 0, nil, err
	}
	if req.Overlap == "" {
		overlap = defaultOverlap
	}
	k, all, err := a.cfg.Manager.RotateDeviceKey(r.Context(), tenantParam(r), overlap)
	return http.StatusCreated, NewDeviceKey{Key: k, Secret: k.Secret, Keys: all}, err
}

func (a *api) getAllowlist(r *http.Request) (int, any, error) {
	on, devices, err := a.store.Allowlist(r.Context(), tenantParam(r))
	return http.StatusOK, Allowlist{Enabled: on, Devices: devices}, err
}

func (a *api) putAllowlist(r *http.Request) (int, any, error) {
	var req Allowlist
	if err := a.decode(r, &req); err != nil {
		return 0, nil, err
	}
	devices, err := a.cfg.Manager.SetAllowlist(r.Context(), tenantParam(r), req.Enabled, req.Devices)
	return http.StatusOK, Allowlist{Enabled: req.Enabled, Devices: devices}, err
}

func (a *api) listGroups(r *http.Request) (int, any, error) {
	gs, err := a.store.Groups(r.Context(), tenantParam(r))
	if err != nil {
		return 0, nil, err
	}
	out := GroupList{Groups: []Group{}}
	for name, nodes := range gs {
		out.Groups = append(out.Groups, Group{Name: name, Nodes: nodes})
	}
	slices.SortFunc(out.Groups, func(x, y Group) int { return strings.Compare(x.Name, y.Name) })
	return http.StatusOK, out, nil
}

func (a *api) putGroup(r *http.Request) (int, any, error) {
	var req Group
	if err := a.decode(r, &req); err != nil {
		return 0, nil, err
	}
	name := chi.URLParam(r, "group")
	if req.Name != "" && req.Name != name {
		return 0, nil, invalid("the body names group %q, the path %q", req.Name, name)
	}
	if len(req.Nodes) == 0 {
		return 0, nil, invalid("a group needs at least one node; DELETE removes a group")
	}
	if err := a.cfg.Manager.SetGroup(r.Context(), tenantParam(r), name, req.Nodes); err != nil {
		return 0, nil, err
	}
	gs, err := a.store.Groups(r.Context(), tenantParam(r))
	return http.StatusOK, Group{Name: name, Nodes: gs[name]}, err
}

func (a *api) deleteGroup(r *http.Request) (int, any, error) {
	name := chi.URLParam(r, "group")
	gs, err := a.store.Groups(r.Context(), tenantParam(r))
	if err != nil {
		return 0, nil, err
	}
	if _, ok := gs[name]; !ok {
		return 0, nil, fmt.Errorf("group %q: %w", name, tenancy.ErrNotFound)
	}
	return http.StatusNoContent, nil, a.cfg.Manager.SetGroup(r.Context(), tenantParam(r), name, nil)
}

func (a *api) listRules(r *http.Request) (int, any, error) {
	rs, err := a.store.Rules(r.Context(), tenantParam(r))
	return http.StatusOK, RuleList{Rules: rs}, err
}

func (a *api) addRule(r *http.Request) (int, any, error) {
	var req RuleRequest
	if err := a.decode(r, &req); err != nil {
		return 0, nil, err
	}
	tenant := tenantParam(r)
	rule, err := a.cfg.Manager.AddRule(r.Context(), tenancy.Rule{Tenant: tenant, Effect: req.Effect, Subject: req.Subject,
		Object: req.Object, Action: req.Action, When: req.When, Description: req.Description})
	return http.StatusCreated, rule, err
}

func (a *api) removeRule(r *http.Request) (int, any, error) {
	return http.StatusNoContent, nil, a.cfg.Manager.RemoveRule(r.Context(), tenantParam(r), chi.URLParam(r, "rule"))
}

func (a *api) explain(r *http.Request) (int, any, error) {
	var req ExplainRequest
	if err := a.decode(r, &req); err != nil {
		return 0, nil, err
	}
	tenant := tenantParam(r)
	if err := wire.ValidNodeID(req.Object); err != nil {
		return 0, nil, invalid("object must be a node id: %v", err)
	}
	if req.Action == "" || strings.ContainsAny(req.Action, " \t\n") {
		return 0, nil, invalid("action must be a command or %s<tool>", policy.ToolActionPrefix)
	}
	if len(req.Args) > 0 {
		var obj map[string]any
		if json.Unmarshal(req.Args, &obj) != nil || obj == nil {
			return 0, nil, invalid("args must be a JSON object")
		}
	}
	var p access.Principal
	sub := req.Subject
	switch role, isRole := strings.CutPrefix(sub, policy.RolePrefix); {
	case sub == policy.SubjectAny:
	case isRole:
		p.Role = role
	case sub == access.RoleAdmin || sub == access.RoleOperator || sub == access.RoleViewer:
		p.Role = sub
	case tenancy.ValidTokenID(sub):
		t, err := a.store.Token(r.Context(), sub)
		if err != nil || t.Tenant != tenant {
			return 0, nil, invalid("subject: token %q is not a token of tenant %s", sub, tenant)
		}
		p.ID, p.Role = t.ID, t.Role
	default:
		if wire.ValidNodeID(sub) != nil {
			return 0, nil, invalid("subject must be *, a role, a token id or a principal id")
		}
		p.ID = sub
	}
	if p.Role != "" && p.Role != access.RoleAdmin && p.Role != access.RoleOperator && p.Role != access.RoleViewer {
		return 0, nil, invalid("roles are admin, operator and viewer")
	}
	ex, err := a.cfg.Policy.Explain(r.Context(), tenant, p, req.Object, req.Action, req.Args)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, ExplainResponse{Allowed: ex.Allowed, RuleID: ex.RuleID, Reason: ex.Reason,
		Default: ex.Default, Matched: ex.Matched}, nil
}

// Activator binds activation codes; the devicehub's shared activation store
// implements it through a small adapter.
type Activator interface {
	// Activate binds code to tenant and returns the device id it belongs
	// to; an unknown or expired code is tenancy.ErrNotFound.
	Activate(ctx context.Context, code, tenant string) (device string, err error)
}

// ActivationBinder adapts the shared activation store to the Activator.
func ActivationBinder(store activation.Store) Activator { return binder{store} }

type binder struct{ store activation.Store }

func (b binder) Activate(ctx context.Context, code, tenant string) (string, error) {
	rec, err := b.store.Bind(ctx, code, tenant)
	if errors.Is(err, activation.ErrNotFound) {
		return "", fmt.Errorf("activation code %s: %w", code, tenancy.ErrNotFound)
	}
	return rec.Device, err
}

// ActivateRequest binds an activation code.
type ActivateRequest struct {
	Code string `json:"code"`
}

// ActivateResponse names the device the code belonged to.
type ActivateResponse struct {
	Tenant string `json:"tenant"`
	Device string `json:"device"`
}

func (a *api) activate(r *http.Request) (int, any, error) {
	if a.cfg.Activator == nil {
		return 0, nil, httpapi.Fail(httpapi.CodeNotFound, "device activation is not available on this server")
	}
	var req ActivateRequest
	if err := a.decode(r, &req); err != nil {
		return 0, nil, err
	}
	if len(req.Code) != 6 || strings.Trim(req.Code, "0123456789") != "" {
		return 0, nil, invalid("code must be the 6 digits the device shows")
	}
	// Wrong codes are limited per tenant and per source, so nobody can
	// search the code space for other people's devices.
	keys := []string{"tenant " + tenantParam(r), "source " + authguard.Source(authguard.ClientAddr(r, a.cfg.TrustedProxies))}
	for _, k := range keys {
		if wait := a.codeFails.RetryAfter(k); wait > 0 {
			a.codeFails.Throttled(k, k)
			return 0, nil, httpapi.Fail(httpapi.CodeRateLimited, fmt.Sprintf("too many wrong activation codes; retry in %d s", authguard.RetryAfterSeconds(wait)))
		}
	}
	dev, err := a.cfg.Activator.Activate(r.Context(), req.Code, tenantParam(r))
	if errors.Is(err, tenancy.ErrNotFound) {
		for _, k := range keys {
			a.codeFails.Failed(k, k)
		}
	}
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, ActivateResponse{Tenant: tenantParam(r), Device: dev}, nil
}
