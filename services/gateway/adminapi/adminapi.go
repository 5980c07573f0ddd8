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
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/authguard"
	"github.com/xiaoclaw/xiaoclaw/pkg/policy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
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
	cfg         Config
	store       tenancy.Store
	adminHashes [][sha256.Size]byte
	authFails   *authguard.Guard[string]
	codeFails   *authguard.Guard[string]
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
	a.authFails = authguard.New(cfg.AuthFailures, func(remote string, n int) {
		cfg.Log.Warn("admin API: authentication failed", "remote", remote, "count", n)
	})
	a.codeFails = authguard.New(cfg.ActivationFailures, func(key string, n int) {
		cfg.Log.Warn("admin API: wrong activation codes", "key", key, "count", n)
	})
	for _, t := range cfg.AdminTokens {
		if len(t) < 16 {
			return nil, errors.New("adminapi: a global admin token must be at least 16 characters")
		}
		a.adminHashes = append(a.adminHashes, sha256.Sum256([]byte(t)))
	}
	r := chi.NewRouter()
	r.NotFound(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, &apiError{http.StatusNotFound, codeNotFound, "no such endpoint"})
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, &apiError{http.StatusMethodNotAllowed, codeMethodNotAllowed, "method not allowed"})
	})
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

// tooManyFailures answers a throttled request: 429 with Retry-After.
func tooManyFailures(w http.ResponseWriter, wait time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(authguard.RetryAfterSeconds(wait)))
	writeError(w, &apiError{http.StatusTooManyRequests, codeRateLimited, "too many failed attempts from this address; retry later"})
}

// Error codes of the error envelope.
const (
	codeRateLimited      = "rate_limited"
	codeInvalid          = "invalid_argument"
	codeUnauthenticated  = "unauthenticated"
	codePermission       = "permission_denied"
	codeNotFound         = "not_found"
	codeConflict         = "already_exists"
	codeMethodNotAllowed = "method_not_allowed"
	codeTooLarge         = "payload_too_large"
	codeMediaType        = "unsupported_media_type"
	codeUnavailable      = "unavailable"
	codeInternal         = "internal"
)

// apiError is an error with the answer it produces.
type apiError struct {
	status  int
	code    string
	message string
}

func (e *apiError) Error() string { return e.code + ": " + e.message }

func invalid(format string, args ...any) *apiError {
	return &apiError{http.StatusBadRequest, codeInvalid, fmt.Sprintf(format, args...)}
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store") // answers may carry secrets
	w.WriteHeader(status)
	if v != nil {
		_ = json.NewEncoder(w).Encode(v)
	}
}

func writeError(w http.ResponseWriter, e *apiError) {
	var b errorBody
	b.Error.Code, b.Error.Message = e.code, e.message
	writeJSON(w, e.status, b)
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
			writeJSON(w, status, body)
			return
		}
		var ae *apiError
		switch {
		case errors.As(err, &ae):
		case errors.Is(err, tenancy.ErrInvalid):
			ae = invalid("%s", strings.TrimPrefix(err.Error(), tenancy.ErrInvalid.Error()+": "))
		case errors.Is(err, tenancy.ErrNotFound):
			ae = &apiError{http.StatusNotFound, codeNotFound, err.Error()}
		case errors.Is(err, tenancy.ErrConflict):
			ae = &apiError{http.StatusConflict, codeConflict, err.Error()}
		default:
			a.cfg.Log.Error("admin API request failed", "method", r.Method, "path", r.URL.Path, "err", err)
			ae = &apiError{http.StatusInternalServerError, codeInternal, "internal error"}
		}
		writeError(w, ae)
	}
}

// caller is who made the request.
type caller struct {
	global    bool
	principal access.Principal
}

type callerKey struct{}

func callerOf(r *http.Request) caller { return r.Context().Value(callerKey{}).(caller) }

// authenticate resolves the bearer token to a global admin or a tenant
// admin; other callers are refused.
func (a *api) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, ok := a.identify(w, r)
		if !ok {
			return
		}
		if !c.global && c.principal.Role != access.RoleAdmin {
			writeError(w, &apiError{http.StatusForbidden, codePermission, "the admin role is required"})
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, c)))
	})
}

// identify resolves the bearer token to a global admin or a tenant's
// principal of any role, throttling failures per source; it answers the
// refusals itself and reports whether there is a caller.
func (a *api) identify(w http.ResponseWriter, r *http.Request) (caller, bool) {
	source := authguard.Source(authguard.ClientAddr(r, a.cfg.TrustedProxies))
	if wait := a.authFails.RetryAfter(source); wait > 0 {
		a.authFails.Throttled(source, source)
		tooManyFailures(w, wait)
		return caller{}, false
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		a.authFails.Failed(source, source)
		w.Header().Set("WWW-Authenticate", `Bearer realm="xiaoclaw"`)
		writeError(w, &apiError{http.StatusUnauthorized, codeUnauthenticated, "a bearer token is required"})
		return caller{}, false
	}
	sum := sha256.Sum256([]byte(token))
	for _, h := range a.adminHashes {
		if subtle.ConstantTimeCompare(sum[:], h[:]) == 1 {
			return caller{global: true}, true
		}
	}
	p, err := a.cfg.Operators.AuthenticateOperator(r.Context(), token)
	switch {
	case errors.Is(err, access.ErrUnauthenticated):
		a.authFails.Failed(source, source)
		w.Header().Set("WWW-Authenticate", `Bearer realm="xiaoclaw", error="invalid_token"`)
		writeError(w, &apiError{http.StatusUnauthorized, codeUnauthenticated, "invalid, expired or revoked token"})
		return caller{}, false
	case err != nil:
		a.cfg.Log.Error("admin API authentication failed", "err", err)
		writeError(w, &apiError{http.StatusServiceUnavailable, codeUnavailable, "credentials cannot be checked right now"})
		return caller{}, false
	}
	return caller{principal: p}, true
}

// tenantScope answers "not found" for a tenant that does not exist or that
// the caller may not see.
func (a *api) tenantScope(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := callerOf(r)
		t := chi.URLParam(r, "tenant")
		notFound := &apiError{http.StatusNotFound, codeNotFound, fmt.Sprintf("tenant %q: not found", t)}
		if !c.global && c.principal.Tenant != t {
			writeError(w, notFound)
			return
		}
		if _, err := a.store.Tenant(r.Context(), t); err != nil {
			if !errors.Is(err, tenancy.ErrNotFound) {
				a.cfg.Log.Error("admin API tenant lookup failed", "tenant", t, "err", err)
				writeError(w, &apiError{http.StatusServiceUnavailable, codeUnavailable, "the store cannot be reached"})
				return
			}
			writeError(w, notFound)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (a *api) globalOnly(h handlerFunc) handlerFunc {
	return func(r *http.Request) (int, any, error) {
		if !callerOf(r).global {
			return 0, nil, &apiError{http.StatusForbidden, codePermission, "a global admin token is required"}
		}
		return h(r)
	}
}

// decode reads a JSON body into v: JSON only, size-capped, no unknown
// fields, nothing after the value.
func (a *api) decode(r *http.Request, v any) error {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return &apiError{http.StatusUnsupportedMediaType, codeMediaType, "the body must be application/json"}
	}
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, a.cfg.MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return &apiError{http.StatusRequestEntityTooLarge, codeTooLarge, fmt.Sprintf("the body exceeds %d bytes", a.cfg.MaxBodyBytes)}
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
