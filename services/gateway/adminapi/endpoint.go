package adminapi

import (
	"context"
	"net/http"

	"github.com/xiaoclaw/xiaoclaw/pkg/deviceauth"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"

	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/httpapi"
)

// DeviceTokenMinter mints a tenant's device tokens (*tenancy.DeviceAuth).
type DeviceTokenMinter interface {
	MintDeviceToken(ctx context.Context, tenant, clientID, deviceID string) (string, error)
}

// EndpointTokenRequest names the node a tool host will be: a device id or
// its node id ("xz-<device id>").
type EndpointTokenRequest struct {
	Device string `json:"device,omitempty"`
	NodeID string `json:"nodeId,omitempty"`
}

// EndpointTokenResponse is a minted MCP endpoint token; the tool host
// connects to ws(s)://<hub>/mcp/?token=<Token>.
type EndpointTokenResponse struct {
	Tenant string `json:"tenant"`
	Device string `json:"device"`
	NodeID string `json:"nodeId"`
	Token  string `json:"token"`
}

// createEndpointToken mints an MCP endpoint token bound to one node of the
// tenant. Tokens are signed with the tenant's device key: rotating the key
// (after its overlap) revokes them.
func (a *api) createEndpointToken(r *http.Request) (int, any, error) {
	if a.cfg.DeviceTokens == nil {
		return 0, nil, httpapi.Fail(httpapi.CodeNotFound, "MCP endpoint tokens are not available on this server")
	}
	var req EndpointTokenRequest
	if err := a.decode(r, &req); err != nil {
		return 0, nil, err
	}
	id := req.Device
	if req.NodeID != "" {
		d, ok := wire.DeviceFromNodeID(req.NodeID)
		if !ok || (id != "" && id != d) {
			return 0, nil, invalid("nodeId must be xz-<device id> (and match device when both are given)")
		}
		id = d
	}
	device, err := wire.CanonicalDevice(id)
	if err != nil {
		return 0, nil, invalid("device: %v", err)
	}
	tenant := tenantParam(r)
	tok, err := a.cfg.DeviceTokens.MintDeviceToken(r.Context(), tenant, deviceauth.EndpointClientID, device)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, EndpointTokenResponse{Tenant: tenant, Device: device, NodeID: wire.DeviceNodeID(device),
		Token: deviceauth.EndpointToken(device, tok)}, nil
}
