// Package adminapi is the gateway's admin HTTP API: tenants, operator
// tokens, device keys, device allowlists, node groups, policy rules and
// upstream OpenClaw gateways,
// described in api/admin-openapi.yaml. It is a plain http.Handler for
// paths under /api/, served on the gateway's port.
//
// Callers present "Authorization: Bearer <token>". A global admin token
// (configured, compared in constant time) may do everything, including
// creating and suspending tenants. An operator token with the admin role
// manages its own tenant; any other tenant is "not found" to it. Bad input
// gets a 4xx answer {"error":{"code","message"}} and changes nothing.
package adminapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/authguard"
	"github.com/xiaoclaw/xiaoclaw/pkg/policy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"

	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/httpapi"
)

// Config configures the admin API.
type Config struct {
	// Manager is the write path (and, through its store, the read path).
	Manager *tenancy.Manager
	// Operators authenticates tenant admins' bearer tokens (a
	// tenancy.OperatorAuth, or a tenancy.OperatorChain).
	Operators access.Authenticator
	// Policy answers explain requests.
	Policy *policy.Engine
	// AdminTokens are global admin bearer tokens; empty means tenant
	// management (create, suspend, resume, list all) is not reachable.
	AdminTokens []string
	// Activator binds a device's activation code (shown on its screen) to
	// a tenant; nil answers 404 on the activation endpoint.
	Activator Activator
	// DeviceTokens mints MCP endpoint tokens (POST .../endpoint-tokens);
	// nil answers 404 there.
	DeviceTokens DeviceTokenMinter
	// Nodes approves the tools nodes gained (POST
	// .../nodes/{node}/approve-tools); nil answers 404 there.
	Nodes NodeApprover
	// MaxBodyBytes caps a request body; 0 means 1 MiB.
	MaxBodyBytes int64
	// AuthFailures throttles failed authentication per source address:
	// default 10 in a row, then one every 6 s; a throttled request gets
	// 429 with Retry-After, whatever its token.
	AuthFailures authguard.Config
	// TrustedProxies are the reverse proxies whose X-Forwarded-For names
	// the client whose failures count (gateway.Config.TrustedProxies).
	TrustedProxies []netip.Prefix
	// ActivationFailures throttles wrong activation codes per tenant and
	// per source address, so the 6-digit codes cannot be searched:
	// default 5 in a row, then one a minute (DefaultActivationFailures).
	ActivationFailures authguard.Config
	Log                *slog.Logger
}

// DefaultActivationFailures is the default budget of wrong activation
// codes: 5 in a row, then one a minute, per tenant and per source. At
// most 65 guesses an hour per tenant: with 100 devices waiting with valid
// codes, a 0.65% chance an hour of binding a stranger's device.
var DefaultActivationFailures = authguard.Config{Burst: 5, Every: time.Minute}

type api struct {
	cfg       Config
	store     tenancy.Store
	auth      *httpapi.Authenticator
	codeFails *authguard.Guard[string]
}

// New returns the admin API handler. Serve it for every path under /api/
// without stripping the prefix: http.ServeMux.Handle("/api/", h), or with
// chi, r.Handle("/api/*", h).
func New(cfg Config) (http.Handler, error) {
	if cfg.Manager == nil || cfg.Operators == nil || cfg.Policy == nil || cfg.Log == nil {
		return nil, errors.New("adminapi: manager, operator authenticator, policy engine and logger are required")
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.ActivationFailures.Burst == 0 && cfg.ActivationFailures.Every == 0 {
		cfg.ActivationFailures.Burst, cfg.ActivationFailures.Every = DefaultActivationFailures.Burst, DefaultActivationFailures.Every
	}
	a := &api{cfg: cfg, store: cfg.Manager.Store()}
	// Failures are logged, folded per key and minute; they write no audit.
	a.codeFails = authguard.New(cfg.ActivationFailures, func(key string, n int) {
		cfg.Log.Warn("admin API: wrong activation codes", "key", key, "count", n)
	})
	auth, err := httpapi.NewAuthenticator(httpapi.AuthConfig{
		Name: "admin API", AdminTokens: cfg.AdminTokens, Operators: cfg.Operators,
		Failures: cfg.AuthFailures, TrustedProxies: cfg.TrustedProxies, Log: cfg.Log,
	})
	if err != nil {
		return nil, err
	}
	a.auth = auth
	r := chi.NewRouter()
	r.NotFound(httpapi.NotFound)
	r.MethodNotAllowed(httpapi.MethodNotAllowed)
	r.Get("/api/whoami", a.whoami) // any role: not behind authenticate
	r.Route("/api", func(r chi.Router) {
		r.Use(a.authenticate)
		r.Get("/tenants", a.handle(a.listTenants))
		r.Post("/tenants", a.handle(a.globalOnly(a.createTenant)))
		r.Post("/tokens/{token}/revoke", a.handle(a.revokeToken))
		r.Route("/tenants/{tenant}", func(r chi.Router) {
			r.Use(a.tenantScope)
			r.Get("/", a.handle(a.getTenant))
			r.Patch("/", a.handle(a.updateTenant))
			r.Get("/limits", a.handle(a.getLimits))
			r.Patch("/limits", a.handle(a.globalOnly(a.updateLimits)))
			r.Post("/suspend", a.handle(a.globalOnly(a.setStatus(tenancy.StatusSuspended))))
			r.Post("/resume", a.handle(a.globalOnly(a.setStatus(tenancy.StatusActive))))
			r.Get("/tokens", a.handle(a.listTokens))
			r.Post("/tokens", a.handle(a.createToken))
			r.Get("/device-keys", a.handle(a.listDeviceKeys))
			r.Post("/device-keys", a.handle(a.createDeviceKey))
			r.Post("/device-keys/rotate", a.handle(a.rotateDeviceKey))
			r.Get("/device-allowlist", a.handle(a.getAllowlist))
			r.Put("/device-allowlist", a.handle(a.putAllowlist))
			r.Get("/groups", a.handle(a.listGroups))
			r.Put("/groups/{group}", a.handle(a.putGroup))
			r.Delete("/groups/{group}", a.handle(a.deleteGroup))
			r.Get("/policy/rules", a.handle(a.listRules))
			r.Post("/policy/rules", a.handle(a.addRule))
			r.Delete("/policy/rules/{rule}", a.handle(a.removeRule))
			r.Post("/policy/explain", a.handle(a.explain))
			r.Post("/activations", a.handle(a.activate))
			r.Post("/endpoint-tokens", a.handle(a.createEndpointToken))
			r.Post("/nodes/{node}/approve-tools", a.handle(a.approveTools))
			r.Get("/upstreams", a.handle(a.listUpstreams))
			r.Post("/upstreams", a.handle(a.addUpstream))
			r.Get("/upstreams/{upstream}", a.handle(a.getUpstream))
			r.Delete("/upstreams/{upstream}", a.handle(a.removeUpstream))
		})
	})
	return r, nil
}

func invalid(format string, args ...any) *httpapi.Error {
	return httpapi.Fail(httpapi.CodeInvalid, fmt.Sprintf(format, args...))
}

// handlerFunc returns the status and body of a success, or an error.
type handlerFunc func(r *http.Request) (int, any, error)

// handle adapts a handlerFunc, mapping errors to the envelope: the
// package's own errors and tenancy's errors keep their meaning; anything
// else is logged and answered "internal" without detail.
func (a *api) handle(h handlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		status, body, err := h(r)
		if err == nil {
			httpapi.WriteJSON(w, status, body)
			return
		}
		var ae *httpapi.Error
		switch {
		case errors.As(err, &ae):
		case errors.Is(err, tenancy.ErrInvalid):
			ae = invalid("%s", strings.TrimPrefix(err.Error(), tenancy.ErrInvalid.Error()+": "))
		case errors.Is(err, tenancy.ErrNotFound):
			ae = httpapi.Fail(httpapi.CodeNotFound, err.Error())
		case errors.Is(err, tenancy.ErrConflict):
			ae = httpapi.Fail(httpapi.CodeConflict, err.Error())
		default:
			a.cfg.Log.Error("admin API request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			ae = httpapi.Fail(httpapi.CodeInternal, "internal error")
		}
		httpapi.WriteError(w, ae)
	}
}

type callerKey struct{}

func callerOf(r *http.Request) httpapi.Caller { return r.Context().Value(callerKey{}).(httpapi.Caller) }

// authenticate resolves the bearer token to a global admin or a tenant
// admin; other callers are refused.
func (a *api) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := a.auth.Authenticate(w, r)
		if !ok {
			return
		}
		if !c.Global && c.Principal.Role != access.RoleAdmin {
			httpapi.WriteError(w, httpapi.Fail(httpapi.CodePermission, "the admin role is required"))
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, c)))
	})
}

// tenantScope answers "not found" for a tenant that does not exist or that
// the caller may not see.
func (a *api) tenantScope(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := callerOf(r)
		t := chi.URLParam(r, "tenant")
		notFound := httpapi.Fail(httpapi.CodeNotFound, fmt.Sprintf("tenant %q: not found", t))
		if !c.Global && c.Principal.Tenant != t {
			httpapi.WriteError(w, notFound)
			return
		}
		if _, err := a.store.Tenant(r.Context(), t); err != nil {
			if !errors.Is(err, tenancy.ErrNotFound) {
				a.cfg.Log.Error("admin API tenant lookup failed", "tenant", t, "err", err)
				httpapi.WriteError(w, httpapi.Fail(httpapi.CodeUnavailable, "the store cannot be reached"))
				return
			}
			httpapi.WriteError(w, notFound)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (a *api) globalOnly(h handlerFunc) handlerFunc {
	return func(r *http.Request) (int, any, error) {
		if !callerOf(r).Global {
			return 0, nil, httpapi.Fail(httpapi.CodePermission, "a global admin token is required")
		}
		return h(r)
	}
}

// decode reads a JSON body into v: JSON only, size-capped, no unknown
// fields, nothing after the value.
func (a *api) decode(r *http.Request, v any) error {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return httpapi.Fail(httpapi.CodeMediaType, "the body must be application/json")
	}
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, a.cfg.MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return httpapi.Fail(httpapi.CodeTooLarge, fmt.Sprintf("the body exceeds %d bytes", a.cfg.MaxBodyBytes))
		}
		return invalid("bad JSON body: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return invalid("bad JSON body: data after the object")
	}
	return nil
}

// duration parses a Go duration such as "720h"; "" gives 0.
func duration(field, s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, invalid("%s: %v", field, err)
	}
	return d, nil
}
