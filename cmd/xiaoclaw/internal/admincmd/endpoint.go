package admincmd

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/xiaoclaw/xiaoclaw/services/gateway/adminapi"
)

// endpointCommand mints MCP endpoint tokens: a tool host that is an MCP
// server (mcp_pipe, xiaozhi-client) connects to ws(s)://<hub>/mcp/?token=….
func endpointCommand(env func(string) string) *cobra.Command {
	cmd, c := parent(env, "endpoint", "MCP endpoint tokens for tool hosts (the XiaoZhi 接入点 protocol)")
	var tenant string
	token := leaf("token NODE", "Mint an endpoint token bound to NODE (a device id or xz-<device id>) of --tenant", cobra.ExactArgs(1), func(cmd *cobra.Command, args []string) error {
		req := adminapi.EndpointTokenRequest{Device: args[0]}
		if len(args[0]) > 3 && args[0][:3] == "xz-" {
			req = adminapi.EndpointTokenRequest{NodeID: args[0]}
		}
		var res adminapi.EndpointTokenResponse
		return c.run(cmd, "POST", "/api/tenants/"+seg(tenant)+"/endpoint-tokens", req, &res,
			func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "node %s of tenant %s; connect the tool host to ws(s)://<hub>/mcp/?token=<token below>\n%s\n", res.NodeID, res.Tenant, res.Token)
				return err
			})
	})
	requireTenant(token, &tenant)
	cmd.AddCommand(token)
	return cmd
}
