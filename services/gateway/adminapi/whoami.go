package adminapi

import (
	"net/http"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"

	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/httpapi"
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
	c, ok := a.auth.Authenticate(w, r)
	switch {
	case !ok:
	case c.Global:
		httpapi.WriteJSON(w, http.StatusOK, WhoAmI{Global: true, Role: access.RoleAdmin})
	default:
		p := c.Principal
		httpapi.WriteJSON(w, http.StatusOK, WhoAmI{Tenant: p.Tenant, Principal: p.ID, Name: p.Name, Role: p.Role})
	}
}
