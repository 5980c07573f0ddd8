package adminapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"net/http"
	"strings"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
)

// WhoAmI is the answer of GET /api/whoami: whom a bearer token stands for,
// so a client (the console) can offer what the token may do.
type WhoAmI struct {
	// Global is true for a global admin token (no tenant of its own).
	Global bool `json:"global"`
	// Tenant, Principal, Name and Role describe an operator token; Role is
	// admin, operator or viewer ("admin" for a global admin token).
	Tenant    string `json:"tenant,omitempty"`
	Principal string `json:"principal,omitempty"`
	Name      string `json:"name,omitempty"`
	Role      string `json:"role"`
}

// whoami answers for any valid token, whatever its role: unlike the other
// endpoints it does not require the admin role.
func (a *api) whoami(w http.ResponseWriter, r *http.Request) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || token == "" {
		w.Header().Set("WWW-Authenticate", `Bearer realm="xiaoclaw"`)
		writeError(w, &apiError{http.StatusUnauthorized, codeUnauthenticated, "a bearer token is required"})
		return
	}
	sum := sha256.Sum256([]byte(token))
	for _, h := range a.adminHashes {
		if subtle.ConstantTimeCompare(sum[:], h[:]) == 1 {
			writeJSON(w, http.StatusOK, WhoAmI{Global: true, Role: access.RoleAdmin})
			return
		}
	}
	p, err := a.cfg.Operators.AuthenticateOperator(r.Context(), token)
	switch {
	case errors.Is(err, access.ErrUnauthenticated):
		w.Header().Set("WWW-Authenticate", `Bearer realm="xiaoclaw", error="invalid_token"`)
		writeError(w, &apiError{http.StatusUnauthorized, codeUnauthenticated, "invalid, expired or revoked token"})
		return
	case err != nil:
		a.cfg.Log.Error("admin API authentication failed", "err", err)
		writeError(w, &apiError{http.StatusServiceUnavailable, codeUnavailable, "credentials cannot be checked right now"})
		return
	}
	writeJSON(w, http.StatusOK, WhoAmI{Tenant: p.Tenant, Principal: p.ID, Name: p.Name, Role: p.Role})
}
