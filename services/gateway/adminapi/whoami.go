package adminapi

import (
	"net/http"

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
	c, ok := a.identify(w, r)
	switch {
	case !ok:
	case c.global:
		writeJSON(w, http.StatusOK, WhoAmI{Global: true, Role: access.RoleAdmin})
	default:
		p := c.principal
		writeJSON(w, http.StatusOK, WhoAmI{Tenant: p.Tenant, Principal: p.ID, Name: p.Name, Role: p.Role})
	}
}
