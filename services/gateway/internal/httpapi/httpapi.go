// Package httpapi owns what the gateway's HTTP APIs (adminapi, auditapi)
// answer alike: the JSON writer, the error envelope
// {"error":{"code","message"}} with its codes (api/admin-openapi.yaml,
// docs/audit.md), and the bearer authentication of a global admin token
// or an operator token with failed attempts throttled per source address.
package httpapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/authguard"
)

// Error codes of the envelope.
const (
	CodeRateLimited      = "rate_limited"
	CodeInvalid          = "invalid_argument"
	CodeUnauthenticated  = "unauthenticated"
	CodePermission       = "permission_denied"
	CodeNotFound         = "not_found"
	CodeConflict         = "already_exists"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeTooLarge         = "payload_too_large"
	CodeMediaType        = "unsupported_media_type"
	CodeUnavailable      = "unavailable"
	CodeInternal         = "internal"
)

// statuses are the HTTP status of each code: a code always comes with the
// same status.
var statuses = map[string]int{
	CodeRateLimited:      http.StatusTooManyRequests,
	CodeInvalid:          http.StatusBadRequest,
	CodeUnauthenticated:  http.StatusUnauthorized,
	CodePermission:       http.StatusForbidden,
	CodeNotFound:         http.StatusNotFound,
	CodeConflict:         http.StatusConflict,
	CodeMethodNotAllowed: http.StatusMethodNotAllowed,
	CodeTooLarge:         http.StatusRequestEntityTooLarge,
	CodeMediaType:        http.StatusUnsupportedMediaType,
	CodeUnavailable:      http.StatusServiceUnavailable,
	CodeInternal:         http.StatusInternalServerError,
}

// Error is an error with the answer it produces.
type Error struct {
	Code    string
	Message string
}

// Fail returns the error of code with message msg.
func Fail(code, msg string) *Error { return &Error{Code: code, Message: msg} }

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// Status is the HTTP status of e's code.
func (e *Error) Status() int {
	if st, ok := statuses[e.Code]; ok {
		return st
	}
	return http.StatusInternalServerError
}

type errorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// WriteJSON answers status with v as JSON (no body for a nil v).
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store") // answers may carry secrets
	w.WriteHeader(status)
	if v != nil {
		_ = json.NewEncoder(w).Encode(v)
	}
}

// WriteError answers e in the envelope.
func WriteError(w http.ResponseWriter, e *Error) {
	var b errorBody
	b.Error.Code, b.Error.Message = e.Code, e.Message
	WriteJSON(w, e.Status(), b)
}

// NotFound and MethodNotAllowed answer a router's misses in the envelope.
func NotFound(w http.ResponseWriter, _ *http.Request) {
	WriteError(w, Fail(CodeNotFound, "no such endpoint"))
}

// MethodNotAllowed: see NotFound.
func MethodNotAllowed(w http.ResponseWriter, _ *http.Request) {
	WriteError(w, Fail(CodeMethodNotAllowed, "method not allowed"))
}

// TooManyFailures answers a throttled request: 429 with Retry-After.
func TooManyFailures(w http.ResponseWriter, wait time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(authguard.RetryAfterSeconds(wait)))
	WriteError(w, Fail(CodeRateLimited, "too many failed attempts from this address; retry later"))
}

// AuthConfig configures an Authenticator.
type AuthConfig struct {
	// Name names the API in errors and logs, e.g. "admin API".
	Name string
	// AdminTokens are global admin bearer tokens, at least 16 characters.
	AdminTokens []string
	// Operators authenticates operator tokens.
	Operators access.Authenticator
	// Failures throttles failed authentication per source address.
	Failures authguard.Config
	// TrustedProxies are the reverse proxies whose X-Forwarded-For names
	// the client whose failures count.
	TrustedProxies []netip.Prefix
	Log            *slog.Logger
}

// Authenticator resolves "Authorization: Bearer <token>" to a caller.
type Authenticator struct {
	cfg         AuthConfig
	adminHashes [][sha256.Size]byte
	fails       *authguard.Guard[string]
}

// NewAuthenticator checks the admin tokens and returns an Authenticator.
func NewAuthenticator(cfg AuthConfig) (*Authenticator, error) {
	a := &Authenticator{cfg: cfg}
	for _, t := range cfg.AdminTokens {
		if len(t) < 16 {
			return nil, errors.New(cfg.Name + ": a global admin token must be at least 16 characters")
		}
		a.adminHashes = append(a.adminHashes, sha256.Sum256([]byte(t)))
	}
	// Failures are logged, folded per source and minute.
	a.fails = authguard.New(cfg.Failures, func(remote string, n int) {
		cfg.Log.Warn(cfg.Name+": authentication failed", "remote", remote, "count", n)
	})
	return a, nil
}

// Caller is who made a request: a global admin, or an operator principal.
type Caller struct {
	Global    bool
	Principal access.Principal
}

// Authenticate resolves the bearer token to a global admin (compared in
// constant time) or an operator principal of any role, throttling failures
// per source; it answers the refusals itself and reports whether there is
// a caller.
func (a *Authenticator) Authenticate(w http.ResponseWriter, r *http.Request) (Caller, bool) {
	source := authguard.Source(authguard.ClientAddr(r, a.cfg.TrustedProxies))
	if wait := a.fails.RetryAfter(source); wait > 0 {
		a.fails.Throttled(source, source)
		TooManyFailures(w, wait)
		return Caller{}, false
	}
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		a.fails.Failed(source, source)
		w.Header().Set("WWW-Authenticate", `Bearer realm="xiaoclaw"`)
		WriteError(w, Fail(CodeUnauthenticated, "a bearer token is required"))
		return Caller{}, false
	}
	sum := sha256.Sum256([]byte(token))
	global := false
	for _, h := range a.adminHashes {
		// Every hash is compared, so the time does not tell which matched.
		global = subtle.ConstantTimeCompare(sum[:], h[:]) == 1 || global
	}
	if global {
		return Caller{Global: true}, true
	}
	p, err := a.cfg.Operators.AuthenticateOperator(r.Context(), token)
	switch {
	case errors.Is(err, access.ErrUnauthenticated):
		a.fails.Failed(source, source)
		w.Header().Set("WWW-Authenticate", `Bearer realm="xiaoclaw", error="invalid_token"`)
		WriteError(w, Fail(CodeUnauthenticated, "invalid, expired or revoked token"))
		return Caller{}, false
	case err != nil:
		a.cfg.Log.Error(a.cfg.Name+" authentication failed", "err", err)
		WriteError(w, Fail(CodeUnavailable, "credentials cannot be checked right now"))
		return Caller{}, false
	}
	return Caller{Principal: p}, true
}
