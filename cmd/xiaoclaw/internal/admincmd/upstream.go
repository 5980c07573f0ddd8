package admincmd

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/adminapi"
)

// UpstreamCommands returns `upstream add|list|remove`, the admin API's
// upstream OpenClaw gateways of a tenant, for the `upstream` command group
// (which also holds `upstream status`, read from NATS).
func UpstreamCommands(env func(string) string) []*cobra.Command {
	return []*cobra.Command{upstreamAdd(env), upstreamList(env), upstreamRemove(env)}
}

// adminLeaf is a leaf with its own connection flags, for a group whose
// other commands do not speak to the admin API.
func adminLeaf(env func(string) string, use, short string, args cobra.PositionalArgs,
	run func(*common, *cobra.Command, []string) error) (*cobra.Command, *common) {
	c := &common{}
	cmd := leaf(use, short, args, func(cmd *cobra.Command, a []string) error {
		c.defaults(env)
		return run(c, cmd, a)
	})
	c.register(cmd.Flags())
	return cmd, c
}

const upstreamHeader = "UPSTREAM\tURL\tAUTH\tTLS\tPUBLISH\tCREATED"

func upstreamRows(us ...tenancy.Upstream) [][]string {
	rows := make([][]string, 0, len(us))
	for _, u := range us {
		tls := "-"
		switch {
		case u.InsecureSkipVerify:
			tls = "insecure-skip-verify"
		case u.CACert != "":
			tls = "ca"
		}
		rows = append(rows, []string{u.Name, u.URL, u.Auth, tls, publishString(u.Publish), when(u.CreatedAt)})
	}
	return rows
}

// publishString is the --publish spelling of p: all, group:NAME or
// nodes:ID,ID.
func publishString(p tenancy.Publish) string {
	switch p.Mode {
	case tenancy.PublishGroup:
		return p.Mode + ":" + p.Group
	case tenancy.PublishNodes:
		return p.Mode + ":" + strings.Join(p.Nodes, ",")
	}
	return p.Mode
}

// parsePublish reads --publish; the admin API judges the mode and names.
func parsePublish(s string) tenancy.Publish {
	mode, arg, _ := strings.Cut(s, ":")
	switch mode {
	case tenancy.PublishGroup:
		return tenancy.Publish{Mode: mode, Group: arg}
	case tenancy.PublishNodes:
		var nodes []string
		if arg != "" {
			nodes = strings.Split(arg, ",")
		}
		return tenancy.Publish{Mode: mode, Nodes: nodes}
	}
	return tenancy.Publish{Mode: s}
}

func upstreamAdd(env func(string) string) *cobra.Command {
	var tenant, gwURL, gwToken, gwPassword, caFile, publish string
	var insecure bool
	cmd, _ := adminLeaf(env, "add NAME", "Publish a tenant's nodes to an OpenClaw gateway; the gateway hands it with a caller token (principal upstream:NAME) to the shims",
		cobra.ExactArgs(1), func(c *common, cmd *cobra.Command, args []string) error {
			spec := tenancy.UpstreamSpec{Name: args[0], URL: gwURL, InsecureSkipVerify: insecure, Publish: parsePublish(publish)}
			spec.Token, spec.Password = gwToken, gwPassword
			if spec.Token == "" && spec.Password == "" {
				spec.Token, spec.Password = env("XIAOCLAW_UPSTREAM_TOKEN"), env("XIAOCLAW_UPSTREAM_PASSWORD")
			}
			if caFile != "" {
				pem, err := os.ReadFile(caFile)
				if err != nil {
					return err
				}
				spec.CACert = string(pem)
			}
			var nu adminapi.NewUpstream
			return c.run(cmd, "POST", "/api/tenants/"+seg(tenant)+"/upstreams", spec, &nu, func(w io.Writer) error {
				if err := table(w, upstreamHeader, upstreamRows(nu.Upstream)); err != nil {
					return err
				}
				if nu.CallerToken == "" { // delivered to the shims by the gateway
					return nil
				}
				_, err := fmt.Fprintln(w, nu.CallerToken)
				return err
			})
		})
	requireTenant(cmd, &tenant)
	f := cmd.Flags()
	f.StringVar(&gwURL, "url", "", "the OpenClaw gateway, ws://host:port or wss://… (required)")
	_ = cmd.MarkFlagRequired("url")
	f.StringVar(&gwToken, "gateway-token", "", "the OpenClaw gateway's token (prefer the env XIAOCLAW_UPSTREAM_TOKEN)")
	f.StringVar(&gwPassword, "gateway-password", "", "the OpenClaw gateway's password (prefer the env XIAOCLAW_UPSTREAM_PASSWORD)")
	f.StringVar(&caFile, "ca-file", "", "PEM file of the CA that signed a wss:// gateway's certificate")
	f.BoolVar(&insecure, "insecure-skip-verify", false, "accept any certificate of a wss:// gateway (self-signed test gateways only)")
	f.StringVar(&publish, "publish", tenancy.PublishAll, "nodes the gateway sees: all, group:NAME or nodes:ID,ID,…")
	return cmd
}

func upstreamList(env func(string) string) *cobra.Command {
	var tenant string
	cmd, _ := adminLeaf(env, "list", "List a tenant's upstream OpenClaw gateways (never their secrets)", cobra.NoArgs,
		func(c *common, cmd *cobra.Command, _ []string) error {
			var l adminapi.UpstreamList
			return c.run(cmd, "GET", "/api/tenants/"+seg(tenant)+"/upstreams", nil, &l, func(w io.Writer) error {
				return table(w, upstreamHeader, upstreamRows(l.Upstreams...))
			})
		})
	requireTenant(cmd, &tenant)
	return cmd
}

func upstreamRemove(env func(string) string) *cobra.Command {
	var tenant string
	cmd, _ := adminLeaf(env, "remove NAME", "Stop publishing to an upstream and forget it", cobra.ExactArgs(1),
		func(c *common, cmd *cobra.Command, args []string) error {
			return c.run(cmd, "DELETE", "/api/tenants/"+seg(tenant)+"/upstreams/"+seg(args[0]), nil, nil, func(w io.Writer) error {
				_, err := fmt.Fprintln(w, "removed upstream", args[0])
				return err
			})
		})
	requireTenant(cmd, &tenant)
	return cmd
}
