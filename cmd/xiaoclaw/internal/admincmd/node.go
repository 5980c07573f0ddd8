package admincmd

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/xiaoclaw/xiaoclaw/services/gateway/adminapi"
)

// nodeCommand manages nodes of a tenant: approving the tools a node gained
// when the tenant requires approval (tenant update --require-tool-approval).
func nodeCommand(env func(string) string) *cobra.Command {
	cmd, c := parent(env, "node", "Nodes of a tenant: approve the tools a node gained")
	var tenant string
	var tools []string
	approve := leaf("approve-tools NODE", "Approve the tools NODE (xz-<device id>) gained after its first catalog: all, or those named by --tool",
		cobra.ExactArgs(1), func(cmd *cobra.Command, args []string) error {
			node := args[0]
			if !strings.HasPrefix(node, "xz-") {
				node = "xz-" + node
			}
			var res adminapi.ApproveToolsResponse
			return c.run(cmd, "POST", "/api/tenants/"+seg(tenant)+"/nodes/"+seg(node)+"/approve-tools",
				adminapi.ApproveToolsRequest{Tools: tools}, &res, func(w io.Writer) error {
					if len(res.Approved) == 0 {
						_, err := fmt.Fprintf(w, "node %s: no tool awaits approval\n", res.NodeID)
						return err
					}
					_, err := fmt.Fprintf(w, "node %s: approved %s; still pending: %s\n", res.NodeID,
						strings.Join(res.Approved, ", "), orDash(strings.Join(res.Pending, ", ")))
					return err
				})
		})
	approve.Flags().StringSliceVar(&tools, "tool", nil, "a tool to approve (repeatable); default: every pending tool")
	requireTenant(approve, &tenant)
	cmd.AddCommand(approve)
	return cmd
}
