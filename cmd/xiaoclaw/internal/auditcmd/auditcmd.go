// Package auditcmd is `xiaoclaw audit`: it reads a tenant's audit trail from
// the gateway's audit API (GET /api/audit/events), newest first, following
// the cursor until --limit events are printed. The server and token come
// from --server and --token, or XIAOCLAW_SERVER and XIAOCLAW_TOKEN.
package auditcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/xiaoclaw/xiaoclaw/pkg/audit"
)

// DefaultServer is the gateway of `xiaoclaw dev`.
const DefaultServer = "http://127.0.0.1:18789"

// Command returns `xiaoclaw audit`, reading the process environment.
func Command() *cobra.Command { return CommandWithEnv(os.Getenv) }

type options struct {
	server, token, tenant                string
	since, until                         string
	node, principal, tool, outcome, kind string
	json                                 bool
	limit                                int
	timeout                              time.Duration
}

// CommandWithEnv returns `xiaoclaw audit` with env as the environment.
func CommandWithEnv(env func(string) string) *cobra.Command {
	o := &options{}
	cmd := &cobra.Command{
		Use:   "audit",
		Short: "Show a tenant's audit trail (node.invoke calls, connects, changes), newest first",
		Example: "  xiaoclaw audit --tenant acme --since 1h --outcome denied\n" +
			"  xiaoclaw audit --tenant acme --node xz-a1b2c3d4e5f6 --json --limit 500",
		Args:         cobra.NoArgs,
		SilenceUsage: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.server == "" {
				o.server = env("XIAOCLAW_SERVER")
			}
			if o.server == "" {
				o.server = DefaultServer
			}
			if o.token == "" {
				o.token = env("XIAOCLAW_TOKEN")
			}
			return o.run(cmd, time.Now())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.server, "server", "", "gateway URL (env XIAOCLAW_SERVER; default "+DefaultServer+")")
	f.StringVar(&o.token, "token", "", "operator token of the tenant (any role) or a global admin token (env XIAOCLAW_TOKEN)")
	f.StringVar(&o.tenant, "tenant", "", "tenant (default: the token's own; required with a global admin token)")
	f.StringVar(&o.since, "since", "", "oldest event: RFC 3339 time or an age such as 30m, 24h, 7d")
	f.StringVar(&o.until, "until", "", "events before: RFC 3339 time or an age")
	f.StringVar(&o.node, "node", "", "only this node id")
	f.StringVar(&o.principal, "principal", "", "only this principal (token id)")
	f.StringVar(&o.tool, "tool", "", "only this MCP tool")
	f.StringVar(&o.outcome, "outcome", "", "only this outcome: ok, error, timeout, denied, rejected")
	f.StringVar(&o.kind, "kind", "", "only this kind, e.g. node.invoke, operator.auth_failed, tenancy.change")
	f.BoolVar(&o.json, "json", false, "print the events as JSON lines")
	f.IntVar(&o.limit, "limit", 50, "most events to print")
	f.DurationVar(&o.timeout, "timeout", 30*time.Second, "how long to wait for the answers")
	return cmd
}

// parseWhen accepts an RFC 3339 time or an age (Go duration, or N d for days).
func parseWhen(flag, s string, now time.Time) (string, error) {
	if s == "" {
		return "", nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC().Format(time.RFC3339Nano), nil
	}
	if days, ok := strings.CutSuffix(s, "d"); ok {
		if n, err := strconv.Atoi(days); err == nil && n >= 0 {
			return now.AddDate(0, 0, -n).UTC().Format(time.RFC3339Nano), nil
		}
	}
	if d, err := time.ParseDuration(s); err == nil && d >= 0 {
		return now.Add(-d).UTC().Format(time.RFC3339Nano), nil
	}
	return "", fmt.Errorf("--%s %q: want an RFC 3339 time (2026-01-02T15:04:05Z) or an age (30m, 24h, 7d)", flag, s)
}

func (o *options) run(cmd *cobra.Command, now time.Time) error {
	if o.limit < 1 {
		return fmt.Errorf("--limit must be at least 1")
	}
	base, err := url.Parse(o.server)
	if err != nil || base.Host == "" {
		return fmt.Errorf("--server %q is not a URL such as %s", o.server, DefaultServer)
	}
	switch base.Scheme {
	case "http", "https":
	case "ws":
		base.Scheme = "http"
	case "wss":
		base.Scheme = "https"
	default:
		return fmt.Errorf("--server %q: scheme must be http, https, ws or wss", o.server)
	}
	if o.token == "" {
		return fmt.Errorf("no token: pass --token or set XIAOCLAW_TOKEN")
	}
	q := url.Values{}
	for k, v := range map[string]string{"tenant": o.tenant, "node": o.node, "principal": o.principal,
		"tool": o.tool, "outcome": o.outcome, "kind": o.kind} {
		if v != "" {
			q.Set(k, v)
		}
	}
	for _, f := range []struct{ name, v string }{{"since", o.since}, {"until", o.until}} {
		t, err := parseWhen(f.name, f.v, now)
		if err != nil {
			return err
		}
		if t != "" {
			q.Set(f.name, t)
		}
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
	defer cancel()
	client := &http.Client{Timeout: o.timeout}
	endpoint := base.Scheme + "://" + base.Host + strings.TrimSuffix(base.Path, "/") + "/api/audit/events"
	var events []audit.Event
	for len(events) < o.limit {
		q.Set("limit", strconv.Itoa(min(o.limit-len(events), audit.MaxLimit)))
		page, err := o.fetch(ctx, client, endpoint+"?"+q.Encode())
		if err != nil {
			return err
		}
		events = append(events, page.Events...)
		if page.NextCursor == "" {
			break
		}
		q.Set("cursor", page.NextCursor)
	}
	out := cmd.OutOrStdout()
	if o.json {
		enc := json.NewEncoder(out)
		for i := range events {
			if err := enc.Encode(&events[i]); err != nil {
				return err
			}
		}
		return nil
	}
	return table(out, events)
}

func (o *options) fetch(ctx context.Context, client *http.Client, u string) (audit.Page, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return audit.Page{}, err
	}
	req.Header.Set("Authorization", "Bearer "+o.token)
	req.Header.Set("Accept", "application/json")
	res, err := client.Do(req)
	if err != nil {
		return audit.Page{}, fmt.Errorf("cannot reach the audit API: %w", err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, 64<<20))
	if err != nil {
		return audit.Page{}, fmt.Errorf("reading the answer: %w", err)
	}
	if res.StatusCode != http.StatusOK {
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		if json.Unmarshal(raw, &e) != nil || e.Error.Code == "" {
			return audit.Page{}, fmt.Errorf("server answered %d: %s", res.StatusCode, bytes.TrimSpace(raw))
		}
		return audit.Page{}, fmt.Errorf("server answered %d %s: %s", res.StatusCode, e.Error.Code, e.Error.Message)
	}
	var p audit.Page
	if err := json.Unmarshal(raw, &p); err != nil {
		return audit.Page{}, fmt.Errorf("the answer is not the expected JSON: %w", err)
	}
	return p, nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func table(w io.Writer, events []audit.Event) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tKIND\tPRINCIPAL\tNODE\tCOMMAND\tTOOL\tDECISION\tRULE\tOUTCOME\tCODE\tLATENCY")
	for _, e := range events {
		lat := "-"
		if e.LatencyUs > 0 {
			lat = (time.Duration(e.LatencyUs) * time.Microsecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.Time.Local().Format("2006-01-02 15:04:05.000"),
			e.Kind, dash(e.Principal), dash(e.Node), dash(e.Command), dash(e.Tool), dash(e.Decision), dash(e.RuleID),
			dash(e.Outcome), dash(e.ErrorCode), lat)
	}
	return tw.Flush()
}
