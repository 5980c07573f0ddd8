package main

import (
	"errors"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw/internal/mcpstdio"
)

// mcpCommand is `xiaoclaw mcp`: the gateway's MCP server over stdio.
func mcpCommand(env func(string) string) *cobra.Command {
	var url, token, node, group string
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "serve the tenant's device tools as an MCP server on stdin/stdout (for stdio-only MCP clients)",
		Long: "Speaks MCP on stdin/stdout and forwards tools/list and tools/call to the gateway's /mcp endpoint " +
			"with the operator token, so a client that starts MCP servers as subprocesses (Claude Desktop, ...) " +
			"can use the fleet. docs/mcp.md shows a client configuration.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if token == "" {
				return &exitError{exitUsage, errors.New("no operator token: pass --token or set XIAOCLAW_TOKEN")}
			}
			if node != "" && group != "" {
				return &exitError{exitUsage, errors.New("--node and --group exclude each other")}
			}
			path := "/mcp"
			switch {
			case node != "":
				path = "/mcp/nodes/" + node
			case group != "":
				path = "/mcp/groups/" + group
			}
			endpoint, err := mcpstdio.EndpointURL(url, path)
			if err != nil {
				return &exitError{exitUsage, err}
			}
			in := io.NopCloser(cmd.InOrStdin())
			if cmd.InOrStdin() == os.Stdin {
				in = os.Stdin
			}
			return mcpstdio.Serve(cmd.Context(), mcpstdio.Config{Endpoint: endpoint, Token: token, Version: version},
				in, nopWriteCloser{cmd.OutOrStdout()})
		},
	}
	cmd.Flags().StringVar(&url, "url", envOr(env, "XIAOCLAW_URL", defaultURL), "gateway URL, ws:// or http:// (env XIAOCLAW_URL)")
	cmd.Flags().StringVar(&token, "token", env("XIAOCLAW_TOKEN"), "operator token (env XIAOCLAW_TOKEN)")
	cmd.Flags().StringVar(&node, "node", "", "serve one node's tools under the device's own names (/mcp/nodes/{node})")
	cmd.Flags().StringVar(&group, "group", "", "serve the tools of a policy group's nodes (/mcp/groups/{group})")
	return cmd
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
