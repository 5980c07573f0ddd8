package adminapi

import (
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
)

// UpstreamList is the answer of GET /api/tenants/{tenant}/upstreams. No
// answer carries an upstream's token or password.
type UpstreamList struct {
	Upstreams []tenancy.Upstream `json:"upstreams"`
}

func (a *api) listUpstreams(r *http.Request) (int, any, error) {
	us, err := a.store.Upstreams(r.Context(), tenantParam(r))
	return http.StatusOK, UpstreamList{Upstreams: us}, err
}

func (a *api) getUpstream(r *http.Request) (int, any, error) {
	u, err := a.store.Upstream(r.Context(), tenantParam(r), chi.URLParam(r, "upstream"))
	return http.StatusOK, u, err
}

// NewUpstream answers POST /api/tenants/{tenant}/upstreams: the stored
// upstream without the gateway's secret. CallerToken, the token of its
// calls through xiaoclaw's gateway (principal upstream:<name>), is shown
// once only where the gateway does not deliver it to the shims itself
// (tenancy.ManagerConfig.Upstreams); a production gateway never shows it.
type NewUpstream struct {
	Upstream    tenancy.Upstream `json:"upstream"`
	CallerToken string           `json:"callerToken,omitempty"`
}

func (a *api) addUpstream(r *http.Request) (int, any, error) {
	var req tenancy.UpstreamSpec
	if err := a.decode(r, &req); err != nil {
		return 0, nil, err
	}
	u, caller, err := a.cfg.Manager.AddUpstream(r.Context(), tenantParam(r), req)
	return http.StatusCreated, NewUpstream{Upstream: u, CallerToken: caller}, err
}

func (a *api) removeUpstream(r *http.Request) (int, any, error) {
	return http.StatusNoContent, nil, a.cfg.Manager.RemoveUpstream(r.Context(), tenantParam(r), chi.URLParam(r, "upstream"))
}
