// Package admincmd holds the `xiaoclaw` commands over the gateway's admin
// API: tenant, token, device-key, allowlist, group, policy and upstream
// add|list|remove. Each reads --server and --token, or XIAOCLAW_SERVER and
// XIAOCLAW_TOKEN, prints a table (or JSON with --json) and exits non-zero
// on any error. A command that creates a secret (token create, device-key
// create|rotate, upstream add) or a rule (policy add) prints it as the last
// line, for scripts.
package admincmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/adminapi"
)

// DefaultServer is the gateway of `xiaoclaw dev`.
const DefaultServer = "http://127.0.0.1:18789"

// Commands returns the admin commands, reading the environment of the
// process.
func Commands() []*cobra.Command { return CommandsWithEnv(os.Getenv) }

// CommandsWithEnv returns the admin commands with env as the environment.
func CommandsWithEnv(env func(string) string) []*cobra.Command {
	return []*cobra.Command{
		tenantCommand(env), tokenCommand(env), deviceKeyCommand(env),
		allowlistCommand(env), groupCommand(env), policyCommand(env), deviceCommand(env), endpointCommand(env),
		nodeCommand(env),
	}
}

// common is the connection and output state of one command invocation.
type common struct {
	server  string
	token   string
	json    bool
	timeout time.Duration
}

// parent makes a command group with the shared flags.
func parent(env func(string) string, use, short string) (*cobra.Command, *common) {
	c := &common{}
	cmd := &cobra.Command{Use: use, Short: short, SilenceUsage: true, Args: cobra.NoArgs}
	c.register(cmd.PersistentFlags())
	cmd.PersistentPreRunE = func(*cobra.Command, []string) error {
		c.defaults(env)
		return nil
	}
	return cmd, c
}

// register adds the connection and output flags to fs.
func (c *common) register(fs *pflag.FlagSet) {
	fs.StringVar(&c.server, "server", "", "gateway URL (env XIAOCLAW_SERVER; default "+DefaultServer+")")
	fs.StringVar(&c.token, "token", "", "global admin or tenant admin token (env XIAOCLAW_TOKEN)")
	fs.BoolVar(&c.json, "json", false, "print the API's JSON answer")
	fs.DurationVar(&c.timeout, "timeout", 15*time.Second, "how long to wait for the answer")
}

// defaults fills what the flags left empty from the environment.
func (c *common) defaults(env func(string) string) {
	if c.server == "" {
		c.server = env("XIAOCLAW_SERVER")
	}
	if c.server == "" {
		c.server = DefaultServer
	}
	if c.token == "" {
		c.token = env("XIAOCLAW_TOKEN")
	}
}

// run calls the API and prints the answer: JSON with --json, else human
// decodes it into v and prints it.
func (c *common) run(cmd *cobra.Command, method, path string, body any, v any, human func(io.Writer) error) error {
	cl, err := newClient(c.server, c.token, c.timeout)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), c.timeout)
	defer cancel()
	var raw json.RawMessage
	if err := cl.call(ctx, method, path, body, &raw); err != nil {
		return err
	}
	out := cmd.OutOrStdout()
	if c.json {
		if len(raw) == 0 {
			_, err := fmt.Fprintln(out, "{}")
			return err
		}
		var b bytes.Buffer
		if err := json.Indent(&b, raw, "", "  "); err != nil {
			return err
		}
		b.WriteByte('\n')
		_, err := out.Write(b.Bytes())
		return err
	}
	if v != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, v); err != nil {
			return fmt.Errorf("the answer is not the expected JSON: %w", err)
		}
	}
	return human(out)
}

func leaf(use, short string, args cobra.PositionalArgs, run func(*cobra.Command, []string) error) *cobra.Command {
	return &cobra.Command{Use: use, Short: short, Args: args, SilenceUsage: true, RunE: run}
}

func table(w io.Writer, header string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, header)
	for _, r := range rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}

func when(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format(time.RFC3339)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func tenantRows(ts ...tenancy.Tenant) [][]string {
	rows := make([][]string, 0, len(ts))
	for _, t := range ts {
		allow := "off"
		if t.DeviceAllowlist {
			allow = "on"
		}
		rows = append(rows, []string{t.ID, t.Status, t.DefaultEffect, allow, orDash(t.DisplayName), when(t.CreatedAt)})
	}
	return rows
}

const tenantHeader = "TENANT\tSTATUS\tDEFAULT\tALLOWLIST\tNAME\tCREATED"

func tenantCommand(env func(string) string) *cobra.Command {
	cmd, c := parent(env, "tenant", "Create, list, update, suspend and resume tenants")
	var display, def string
	create := leaf("create NAME", "Create a tenant (global admin token)", cobra.ExactArgs(1), func(cmd *cobra.Command, args []string) error {
		var t tenancy.Tenant
		spec := tenancy.TenantSpec{ID: args[0], DisplayName: display, DefaultEffect: def}
		return c.run(cmd, "POST", "/api/tenants", spec, &t, func(w io.Writer) error {
			return table(w, tenantHeader, tenantRows(t))
		})
	})
	create.Flags().StringVar(&display, "display-name", "", "human-readable name")
	create.Flags().StringVar(&def, "default", "", "effect when no policy rule matches: allow (default) or deny")

	list := leaf("list", "List tenants", cobra.NoArgs, func(cmd *cobra.Command, _ []string) error {
		var l adminapi.TenantList
		return c.run(cmd, "GET", "/api/tenants", nil, &l, func(w io.Writer) error {
			return table(w, tenantHeader, tenantRows(l.Tenants...))
		})
	})
	status := func(verb, short string) *cobra.Command {
		return leaf(verb+" NAME", short, cobra.ExactArgs(1), func(cmd *cobra.Command, args []string) error {
			var t tenancy.Tenant
			return c.run(cmd, "POST", "/api/tenants/"+seg(args[0])+"/"+verb, nil, &t, func(w io.Writer) error {
				return table(w, tenantHeader, tenantRows(t))
			})
		})
	}
	var upDisplay, upDefault string
	var upApproval bool
	update := leaf("update NAME", "Change a tenant's display name, default effect or tool approval", cobra.ExactArgs(1), func(cmd *cobra.Command, args []string) error {
		var patch adminapi.TenantPatch
		if cmd.Flags().Changed("display-name") {
			patch.DisplayName = &upDisplay
		}
		if cmd.Flags().Changed("default") {
			patch.DefaultEffect = &upDefault
		}
		if cmd.Flags().Changed("require-tool-approval") {
			patch.RequireToolApproval = &upApproval
		}
		if patch.DisplayName == nil && patch.DefaultEffect == nil && patch.RequireToolApproval == nil {
			return fmt.Errorf("nothing to change: pass --display-name, --default or --require-tool-approval")
		}
		var t tenancy.Tenant
		return c.run(cmd, "PATCH", "/api/tenants/"+seg(args[0]), patch, &t, func(w io.Writer) error {
			return table(w, tenantHeader, tenantRows(t))
		})
	})
	update.Flags().StringVar(&upDisplay, "display-name", "", "human-readable name")
	update.Flags().StringVar(&upDefault, "default", "", "effect when no policy rule matches: allow or deny")
	update.Flags().BoolVar(&upApproval, "require-tool-approval", false,
		"hide and refuse the tools a known node gains until `xiaoclaw node approve-tools NODE` (=false to stop)")
	cmd.AddCommand(create, list, update, limitsCommand(c), setLimitsCommand(c),
		status("suspend", "Suspend a tenant: its tokens and devices stop working (global admin token)"),
		status("resume", "Make a suspended tenant active again (global admin token)"))
	return cmd
}

const limitsHeader = "TENANT\tMAX-INFLIGHT\tMAX-INFLIGHT-PER-DEVICE"

func limitRows(tenant string, l tenancy.Limits) [][]string {
	show := func(v int) string {
		if v == 0 {
			return "default"
		}
		return strconv.Itoa(v)
	}
	return [][]string{{tenant, show(l.MaxInflight), show(l.MaxInflightPerDevice)}}
}

func limitsCommand(c *common) *cobra.Command {
	return leaf("limits NAME", "Show a tenant's in-flight limits on each shim replica (default: the shim's)", cobra.ExactArgs(1),
		func(cmd *cobra.Command, args []string) error {
			var l tenancy.Limits
			return c.run(cmd, "GET", "/api/tenants/"+seg(args[0])+"/limits", nil, &l, func(w io.Writer) error {
				return table(w, limitsHeader, limitRows(args[0], l))
			})
		})
}

func setLimitsCommand(c *common) *cobra.Command {
	var maxInflight, perDevice int
	cmd := leaf("set-limits NAME", "Change a tenant's in-flight limits on each shim replica; 0 restores the shim's default (global admin token)",
		cobra.ExactArgs(1), func(cmd *cobra.Command, args []string) error {
			var patch adminapi.LimitsPatch
			if cmd.Flags().Changed("max-inflight") {
				patch.MaxInflight = &maxInflight
			}
			if cmd.Flags().Changed("max-inflight-per-device") {
				patch.MaxInflightPerDevice = &perDevice
			}
			if patch.MaxInflight == nil && patch.MaxInflightPerDevice == nil {
				return fmt.Errorf("nothing to change: pass --max-inflight or --max-inflight-per-device")
			}
			var l tenancy.Limits
			return c.run(cmd, "PATCH", "/api/tenants/"+seg(args[0])+"/limits", patch, &l, func(w io.Writer) error {
				return table(w, limitsHeader, limitRows(args[0], l))
			})
		})
	cmd.Flags().IntVar(&maxInflight, "max-inflight", 0, "calls of the tenant in flight at once (more fail with RATE_LIMITED); 0: the shim's default")
	cmd.Flags().IntVar(&perDevice, "max-inflight-per-device", 0, "calls in flight to any one device (more fail with BUSY); 0: the shim's default")
	return cmd
}

func requireTenant(cmd *cobra.Command, tenant *string) {
	cmd.Flags().StringVar(tenant, "tenant", "", "tenant id (required)")
	_ = cmd.MarkFlagRequired("tenant")
}

const tokenHeader = "ID\tROLE\tNAME\tCREATED\tEXPIRES\tREVOKED"

func tokenRows(ts ...tenancy.Token) [][]string {
	rows := make([][]string, 0, len(ts))
	for _, t := range ts {
		rows = append(rows, []string{t.ID, t.Role, orDash(t.Name), when(t.CreatedAt), when(t.ExpiresAt), when(t.RevokedAt)})
	}
	return rows
}

func tokenCommand(env func(string) string) *cobra.Command {
	cmd, c := parent(env, "token", "Create, list and revoke operator API tokens")
	var tenant, role, name string
	var expires time.Duration
	create := leaf("create", "Create a token; prints it as the last line (it is not shown again)", cobra.NoArgs, func(cmd *cobra.Command, _ []string) error {
		req := adminapi.TokenRequest{Name: name, Role: role}
		if expires != 0 {
			req.ExpiresIn = expires.String()
		}
		var nt adminapi.NewToken
		return c.run(cmd, "POST", "/api/tenants/"+seg(tenant)+"/tokens", req, &nt, func(w io.Writer) error {
			if err := table(w, tokenHeader, tokenRows(nt.Token)); err != nil {
				return err
			}
			_, err := fmt.Fprintln(w, nt.Secret)
			return err
		})
	})
	requireTenant(create, &tenant)
	create.Flags().StringVar(&role, "role", "operator", "admin, operator or viewer")
	create.Flags().StringVar(&name, "name", "", "a name for the token, e.g. who holds it")
	create.Flags().DurationVar(&expires, "expires-in", 0, "lifetime (default 90 days)")

	var listTenant string
	list := leaf("list", "List a tenant's tokens", cobra.NoArgs, func(cmd *cobra.Command, _ []string) error {
		var l adminapi.TokenList
		return c.run(cmd, "GET", "/api/tenants/"+seg(listTenant)+"/tokens", nil, &l, func(w io.Writer) error {
			return table(w, tokenHeader, tokenRows(l.Tokens...))
		})
	})
	requireTenant(list, &listTenant)

	revoke := leaf("revoke ID", "Revoke a token; its live connections are closed", cobra.ExactArgs(1), func(cmd *cobra.Command, args []string) error {
		var t tenancy.Token
		return c.run(cmd, "POST", "/api/tokens/"+seg(args[0])+"/revoke", nil, &t, func(w io.Writer) error {
			return table(w, tokenHeader, tokenRows(t))
		})
	})
	cmd.AddCommand(create, list, revoke)
	return cmd
}

const keyHeader = "KEY\tCREATED\tRETIRES"

func keyRows(ks ...tenancy.DeviceKey) [][]string {
	rows := make([][]string, 0, len(ks))
	for _, k := range ks {
		rows = append(rows, []string{k.ID, when(k.CreatedAt), when(k.RetireAt)})
	}
	return rows
}

func deviceKeyCommand(env func(string) string) *cobra.Command {
	cmd, c := parent(env, "device-key", "Create, rotate and list device HMAC keys")
	printNew := func(nk *adminapi.NewDeviceKey) func(io.Writer) error {
		return func(w io.Writer) error {
			keys := nk.Keys
			if len(keys) == 0 {
				keys = []tenancy.DeviceKey{nk.Key}
			}
			if err := table(w, keyHeader, keyRows(keys...)); err != nil {
				return err
			}
			_, err := fmt.Fprintln(w, nk.Secret)
			return err
		}
	}
	var tenant string
	create := leaf("create", "Add a device key; prints its secret as the last line", cobra.NoArgs, func(cmd *cobra.Command, _ []string) error {
		var nk adminapi.NewDeviceKey
		return c.run(cmd, "POST", "/api/tenants/"+seg(tenant)+"/device-keys", nil, &nk, printNew(&nk))
	})
	requireTenant(create, &tenant)

	var rotTenant string
	var overlap time.Duration
	rotate := leaf("rotate", "Add a new signing key; the old ones verify until --overlap ends", cobra.NoArgs, func(cmd *cobra.Command, _ []string) error {
		var nk adminapi.NewDeviceKey
		return c.run(cmd, "POST", "/api/tenants/"+seg(rotTenant)+"/device-keys/rotate",
			adminapi.RotateRequest{Overlap: overlap.String()}, &nk, printNew(&nk))
	})
	requireTenant(rotate, &rotTenant)
	rotate.Flags().DurationVar(&overlap, "overlap", 24*time.Hour, "how long the old keys keep verifying")

	var listTenant string
	list := leaf("list", "List a tenant's device keys", cobra.NoArgs, func(cmd *cobra.Command, _ []string) error {
		var l adminapi.DeviceKeyList
		return c.run(cmd, "GET", "/api/tenants/"+seg(listTenant)+"/device-keys", nil, &l, func(w io.Writer) error {
			return table(w, keyHeader, keyRows(l.Keys...))
		})
	})
	requireTenant(list, &listTenant)
	cmd.AddCommand(create, rotate, list)
	return cmd
}

func allowlistCommand(env func(string) string) *cobra.Command {
	cmd, c := parent(env, "allowlist", "Show or replace a tenant's device allowlist")
	show := func(a *adminapi.Allowlist) func(io.Writer) error {
		return func(w io.Writer) error {
			state := "off: every device with valid credentials connects"
			if a.Enabled {
				state = "on: only these devices connect"
			}
			fmt.Fprintln(w, "allowlist", state)
			for _, d := range a.Devices {
				fmt.Fprintln(w, d)
			}
			return nil
		}
	}
	var tenant string
	get := leaf("get", "Show the allowlist", cobra.NoArgs, func(cmd *cobra.Command, _ []string) error {
		var a adminapi.Allowlist
		return c.run(cmd, "GET", "/api/tenants/"+seg(tenant)+"/device-allowlist", nil, &a, show(&a))
	})
	requireTenant(get, &tenant)
	var setTenant string
	var off bool
	set := leaf("set DEVICE...", "Replace the allowlist and turn it on (--off turns it off)", cobra.ArbitraryArgs, func(cmd *cobra.Command, args []string) error {
		var a adminapi.Allowlist
		req := adminapi.Allowlist{Enabled: !off, Devices: append([]string{}, args...)}
		return c.run(cmd, "PUT", "/api/tenants/"+seg(setTenant)+"/device-allowlist", req, &a, show(&a))
	})
	requireTenant(set, &setTenant)
	set.Flags().BoolVar(&off, "off", false, "store the list but admit every device")
	cmd.AddCommand(get, set)
	return cmd
}

func groupCommand(env func(string) string) *cobra.Command {
	cmd, c := parent(env, "group", "Manage node groups (policy objects group:<name>)")
	var tenant string
	set := leaf("set NAME NODE...", "Create a group or replace its members", cobra.MinimumNArgs(2), func(cmd *cobra.Command, args []string) error {
		var g adminapi.Group
		return c.run(cmd, "PUT", "/api/tenants/"+seg(tenant)+"/groups/"+seg(args[0]), adminapi.Group{Nodes: args[1:]}, &g,
			func(w io.Writer) error {
				return table(w, "GROUP\tNODES", [][]string{{g.Name, strings.Join(g.Nodes, " ")}})
			})
	})
	requireTenant(set, &tenant)
	var delTenant string
	del := leaf("delete NAME", "Delete a group", cobra.ExactArgs(1), func(cmd *cobra.Command, args []string) error {
		return c.run(cmd, "DELETE", "/api/tenants/"+seg(delTenant)+"/groups/"+seg(args[0]), nil, nil, func(w io.Writer) error {
			_, err := fmt.Fprintln(w, "deleted group", args[0])
			return err
		})
	})
	requireTenant(del, &delTenant)
	var listTenant string
	list := leaf("list", "List groups", cobra.NoArgs, func(cmd *cobra.Command, _ []string) error {
		var l adminapi.GroupList
		return c.run(cmd, "GET", "/api/tenants/"+seg(listTenant)+"/groups", nil, &l, func(w io.Writer) error {
			rows := make([][]string, 0, len(l.Groups))
			for _, g := range l.Groups {
				rows = append(rows, []string{g.Name, strings.Join(g.Nodes, " ")})
			}
			return table(w, "GROUP\tNODES", rows)
		})
	})
	requireTenant(list, &listTenant)
	cmd.AddCommand(set, del, list)
	return cmd
}

const ruleHeader = "RULE\tEFFECT\tSUBJECT\tOBJECT\tACTION\tWHEN"

func ruleRows(rs ...tenancy.Rule) [][]string {
	rows := make([][]string, 0, len(rs))
	for _, r := range rs {
		rows = append(rows, []string{r.ID, r.Effect, r.Subject, r.Object, r.Action, orDash(r.When)})
	}
	return rows
}

func policyCommand(env func(string) string) *cobra.Command {
	cmd, c := parent(env, "policy", "Add, list, remove and explain policy rules")
	var tenant string
	var req adminapi.RuleRequest
	add := leaf("add", "Add a rule; prints its id as the last line", cobra.NoArgs, func(cmd *cobra.Command, _ []string) error {
		var r tenancy.Rule
		return c.run(cmd, "POST", "/api/tenants/"+seg(tenant)+"/policy/rules", req, &r, func(w io.Writer) error {
			if err := table(w, ruleHeader, ruleRows(r)); err != nil {
				return err
			}
			_, err := fmt.Fprintln(w, r.ID)
			return err
		})
	})
	requireTenant(add, &tenant)
	f := add.Flags()
	f.StringVar(&req.Effect, "effect", "", "allow or deny (required)")
	f.StringVar(&req.Subject, "subject", "*", `"*", a role (operator, role:admin) a principal id such as a token id, or upstream:<name> (calls from an upstream OpenClaw gateway)`)
	f.StringVar(&req.Object, "object", "*", `"*", a node id glob (xz-*) or group:<name>`)
	f.StringVar(&req.Action, "action", "", "a command or command glob, or mcp.tools.call:<tool or glob> (required)")
	f.StringVar(&req.When, "when", "", `argument predicate on a tool call, e.g. 'volume > 60'`)
	f.StringVar(&req.Description, "description", "", "why the rule exists")
	_ = add.MarkFlagRequired("effect")
	_ = add.MarkFlagRequired("action")

	var listTenant string
	list := leaf("list", "List rules in evaluation order", cobra.NoArgs, func(cmd *cobra.Command, _ []string) error {
		var l adminapi.RuleList
		return c.run(cmd, "GET", "/api/tenants/"+seg(listTenant)+"/policy/rules", nil, &l, func(w io.Writer) error {
			return table(w, ruleHeader, ruleRows(l.Rules...))
		})
	})
	requireTenant(list, &listTenant)

	var rmTenant string
	remove := leaf("remove RULE_ID", "Remove a rule", cobra.ExactArgs(1), func(cmd *cobra.Command, args []string) error {
		return c.run(cmd, "DELETE", "/api/tenants/"+seg(rmTenant)+"/policy/rules/"+seg(args[0]), nil, nil, func(w io.Writer) error {
			_, err := fmt.Fprintln(w, "removed", args[0])
			return err
		})
	})
	requireTenant(remove, &rmTenant)

	var exTenant, exArgs string
	var ex adminapi.ExplainRequest
	explain := leaf("explain", "Show which rule decides a request, and why", cobra.NoArgs, func(cmd *cobra.Command, _ []string) error {
		body := ex
		if exArgs != "" {
			if !json.Valid([]byte(exArgs)) {
				return fmt.Errorf("--args is not valid JSON")
			}
			body.Args = json.RawMessage(exArgs)
		}
		var res adminapi.ExplainResponse
		return c.run(cmd, "POST", "/api/tenants/"+seg(exTenant)+"/policy/explain", body, &res, func(w io.Writer) error {
			verdict := "DENY"
			if res.Allowed {
				verdict = "ALLOW"
			}
			fmt.Fprintf(w, "%s: %s\n", verdict, res.Reason)
			if len(res.Matched) == 0 {
				_, err := fmt.Fprintln(w, "no rule matches subject, object and action")
				return err
			}
			rows := make([][]string, 0, len(res.Matched))
			for _, m := range res.Matched {
				applies := "yes"
				if !m.Applies {
					applies = "no (predicate false)"
				}
				row := append(ruleRows(m.Rule)[0], applies)
				rows = append(rows, row)
			}
			return table(w, ruleHeader+"\tAPPLIES", rows)
		})
	})
	requireTenant(explain, &exTenant)
	ef := explain.Flags()
	ef.StringVar(&ex.Subject, "subject", "", "a token id, a role (operator, role:admin), a principal id or * (required)")
	ef.StringVar(&ex.Object, "object", "", "a node id (required)")
	ef.StringVar(&ex.Action, "action", "", "a command or mcp.tools.call:<tool> (required)")
	ef.StringVar(&exArgs, "args", "", `tool arguments as a JSON object, e.g. '{"volume":80}'`)
	for _, n := range []string{"subject", "object", "action"} {
		_ = explain.MarkFlagRequired(n)
	}
	cmd.AddCommand(add, list, remove, explain)
	return cmd
}

func deviceCommand(env func(string) string) *cobra.Command {
	cmd, c := parent(env, "device", "Bind devices to tenants")
	var tenant string
	activate := leaf("activate CODE", "Bind the device showing the 6-digit activation CODE to --tenant", cobra.ExactArgs(1), func(cmd *cobra.Command, args []string) error {
		var res adminapi.ActivateResponse
		return c.run(cmd, "POST", "/api/tenants/"+seg(tenant)+"/activations", adminapi.ActivateRequest{Code: args[0]}, &res,
			func(w io.Writer) error {
				_, err := fmt.Fprintf(w, "device %s activated in tenant %s\n", res.Device, res.Tenant)
				return err
			})
	})
	requireTenant(activate, &tenant)
	cmd.AddCommand(activate)
	return cmd
}
