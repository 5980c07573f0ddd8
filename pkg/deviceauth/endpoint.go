package deviceauth

import (
	"errors"
	"strings"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// EndpointClientID is the Client-Id an MCP endpoint token's device token is
// minted for. An endpoint token is "<device id>.<device token>" with the
// device token minted for (EndpointClientID, device id): the token alone
// names the node and proves it, and a tool host needs nothing but the URL
// ws(s)://<hub>/mcp/?token=<endpoint token>.
const EndpointClientID = "mcp-endpoint"

// EndpointToken builds the endpoint token of a canonical device id from the
// device token minted for it.
func EndpointToken(device, deviceToken string) string { return device + "." + deviceToken }

// ParseEndpointToken splits an endpoint token into the canonical device id
// and the device token to verify.
func ParseEndpointToken(token string) (device, deviceToken string, err error) {
	id, tok, ok := strings.Cut(token, ".")
	if !ok || id == "" || tok == "" {
		return "", "", errors.New("endpoint token is not <device id>.<device token>")
	}
	device, err = wire.CanonicalDevice(id)
	if err != nil {
		return "", "", err
	}
	return device, tok, nil
}
