package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
)

// Exit codes of the operator commands, for scripts.
const (
	exitOK          = 0
	exitUsage       = 1 // bad arguments or any other local error
	exitConnect     = 2 // the gateway could not be reached or refused the credentials
	exitGatewayErr  = 3 // the gateway answered with an error (unknown node, denied, node error)
	exitTimeout     = 4 // the call timed out
	defaultURL      = "ws://127.0.0.1:18789"
	defaultCallWait = 30 * time.Second
)

// exitError carries an exit code to main.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// operatorFlags are shared by every command that talks to the gateway.
type operatorFlags struct {
	url     string
	token   string
	json    bool
	timeout time.Duration
}

func (f *operatorFlags) register(cmd *cobra.Command, env func(string) string) {
	cmd.PersistentFlags().StringVar(&f.url, "url", envOr(env, "XIAOCLAW_URL", defaultURL), "gateway WebSocket URL (env XIAOCLAW_URL)")
	cmd.PersistentFlags().StringVar(&f.token, "token", env("XIAOCLAW_TOKEN"), "operator token (env XIAOCLAW_TOKEN)")
	cmd.PersistentFlags().BoolVar(&f.json, "json", false, "print JSON")
	cmd.PersistentFlags().DurationVar(&f.timeout, "timeout", defaultCallWait, "how long to wait for the answer")
}

func envOr(env func(string) string, key, def string) string {
	if v := env(key); v != "" {
		return v
	}
	return def
}

func (f *operatorFlags) dial(ctx context.Context, onEvent func(occlient.Event)) (*occlient.Client, error) {
	if f.token == "" {
		return nil, &exitError{exitUsage, errors.New("no operator token: pass --token or set XIAOCLAW_TOKEN (xiaoclaw dev prints one)")}
	}
	c, err := occlient.Dial(ctx, occlient.Options{URL: f.url, Token: f.token, OnEvent: onEvent})
	if err != nil {
		return nil, &exitError{exitConnect, err}
	}
	return c, nil
}

// callErr turns a gateway answer into an exit code.
func callErr(err error) error {
	if err == nil {
		return nil
	}
	var ge *occlient.Error
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return &exitError{exitTimeout, fmt.Errorf("no answer in time: %w", err)}
	case errors.As(err, &ge):
		if strings.HasPrefix(ge.Message, "TIMEOUT") {
			return &exitError{exitTimeout, err}
		}
		msg := err.Error()
		if len(ge.Details) > 0 {
			msg += " " + string(ge.Details)
		}
		return &exitError{exitGatewayErr, errors.New(msg)}
	default:
		return &exitError{exitConnect, err}
	}
}

func operatorCommands(env func(string) string, stdout io.Writer) []*cobra.Command {
	f := &operatorFlags{}

	nodes := &cobra.Command{
		Use:   "nodes",
		Short: "List nodes (devices and OpenClaw node hosts) of your tenant",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return listNodes(cmd.Context(), f, stdout)
		},
	}
	f.register(nodes, env)
	nodes.AddCommand(&cobra.Command{
		Use:   "describe NODE",
		Short: "Describe one node: commands and MCP tools",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return describeNode(cmd.Context(), f, args[0], stdout)
		},
	})
	nodes.AddCommand(&cobra.Command{
		Use:   "list",
		Short: "List nodes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return listNodes(cmd.Context(), f, stdout)
		},
	})

	var invokeTimeout time.Duration
	var idemKey string
	invoke := &cobra.Command{
		Use:   "invoke NODE COMMAND [JSON_PARAMS]",
		Short: "Run node.invoke: a command on a node (NODE is an id, a display name or an id prefix of 6+ characters)",
		Args:  cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			var params json.RawMessage
			if len(args) == 3 {
				params = json.RawMessage(args[2])
				if !json.Valid(params) {
					return &exitError{exitUsage, fmt.Errorf("params are not valid JSON: %s", args[2])}
				}
			}
			return invokeNode(cmd.Context(), f, args[0], args[1], params, invokeTimeout, idemKey, stdout)
		},
	}
	f.register(invoke, env)
	invoke.Flags().DurationVar(&invokeTimeout, "invoke-timeout", 15*time.Second, "how long the node may take")
	invoke.Flags().StringVar(&idemKey, "idempotency-key", "", "idempotency key (random when empty)")

	call := &cobra.Command{
		Use:   "call NODE TOOL [JSON_ARGUMENTS]",
		Short: "Call an MCP tool of a device (mcp.tools.call)",
		Args:  cobra.RangeArgs(2, 3),
		RunE: func(cmd *cobra.Command, args []string) error {
			arguments := json.RawMessage("{}")
			if len(args) == 3 {
				arguments = json.RawMessage(args[2])
				if !json.Valid(arguments) {
					return &exitError{exitUsage, fmt.Errorf("arguments are not valid JSON: %s", args[2])}
				}
			}
			params, _ := json.Marshal(struct {
				Name      string          `json:"name"`
				Arguments json.RawMessage `json:"arguments"`
			}{args[1], arguments})
			return invokeNode(cmd.Context(), f, args[0], "mcp.tools.call", params, invokeTimeout, idemKey, stdout)
		},
	}
	f.register(call, env)
	call.Flags().DurationVar(&invokeTimeout, "invoke-timeout", 15*time.Second, "how long the device may take")
	call.Flags().StringVar(&idemKey, "idempotency-key", "", "idempotency key (random when empty)")

	events := &cobra.Command{
		Use:   "events",
		Short: "Print node events (presence, tool changes, device notifications) until interrupted",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return tailEvents(cmd.Context(), f, stdout)
		},
	}
	f.register(events, env)
	return []*cobra.Command{nodes, invoke, call, events}
}

type nodeSummary struct {
	NodeID        string   `json:"nodeId"`
	DisplayName   string   `json:"displayName"`
	Platform      string   `json:"platform"`
	RemoteIP      string   `json:"remoteIp"`
	Commands      []string `json:"commands"`
	Connected     bool     `json:"connected"`
	ConnectedAtMs int64    `json:"connectedAtMs"`
	// Upstreams are the node's links to upstream OpenClaw gateways
	// (docs/openclaw.md).
	Upstreams []nodeUpstream `json:"upstreams"`
}

// nodeUpstream is one link of a node to an upstream OpenClaw gateway.
type nodeUpstream struct {
	Name      string `json:"name"`
	State     string `json:"state"`
	LastError string `json:"lastError"`
	RequestID string `json:"requestId"`
}

// upstreamColumn shows a node's links as name:state, or "-".
func upstreamColumn(ups []nodeUpstream) string {
	if len(ups) == 0 {
		return "-"
	}
	parts := make([]string, len(ups))
	for i, u := range ups {
		parts[i] = u.Name + ":" + u.State
	}
	return strings.Join(parts, ",")
}

func fetchNodes(ctx context.Context, c *occlient.Client) ([]nodeSummary, json.RawMessage, error) {
	raw, err := c.Call(ctx, "node.list", map[string]any{})
	if err != nil {
		return nil, nil, callErr(err)
	}
	var list struct {
		Nodes []nodeSummary `json:"nodes"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, nil, fmt.Errorf("node.list answer: %w", err)
	}
	return list.Nodes, raw, nil
}

func listNodes(ctx context.Context, f *operatorFlags, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	c, err := f.dial(ctx, nil)
	if err != nil {
		return err
	}
	defer c.Close()
	nodes, raw, err := fetchNodes(ctx, c)
	if err != nil {
		return err
	}
	if f.json {
		return printJSON(out, raw)
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tNAME\tPLATFORM\tCONNECTED\tCOMMANDS\tUPSTREAM")
	for _, n := range nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%d\t%s\n", n.NodeID, n.DisplayName, n.Platform, n.Connected, len(n.Commands),
			upstreamColumn(n.Upstreams))
	}
	return tw.Flush()
}

// resolveNode finds a node as the stock CLI does: exact id, remote IP,
// display name (case-insensitive), then a unique id prefix of 6+ characters.
func resolveNode(nodes []nodeSummary, query string) (string, error) {
	q := strings.TrimSpace(query)
	for _, n := range nodes {
		if n.NodeID == q {
			return n.NodeID, nil
		}
	}
	var matches []string
	for _, n := range nodes {
		if n.RemoteIP != "" && n.RemoteIP == q {
			matches = append(matches, n.NodeID)
		}
	}
	if len(matches) == 0 {
		for _, n := range nodes {
			if strings.EqualFold(strings.TrimSpace(n.DisplayName), q) {
				matches = append(matches, n.NodeID)
			}
		}
	}
	if len(matches) == 0 && len(q) >= 6 {
		for _, n := range nodes {
			if strings.HasPrefix(n.NodeID, q) {
				matches = append(matches, n.NodeID)
			}
		}
	}
	switch len(matches) {
	case 1:
		return matches[0], nil
	case 0:
		return "", &exitError{exitGatewayErr, fmt.Errorf("unknown node %q (xiaoclaw nodes lists them)", query)}
	default:
		sort.Strings(matches)
		return "", &exitError{exitUsage, fmt.Errorf("node %q is ambiguous: %s", query, strings.Join(matches, ", "))}
	}
}

// dialResolve connects and resolves query to a node id of the tenant.
func (f *operatorFlags) dialResolve(ctx context.Context, query string) (*occlient.Client, string, error) {
	c, err := f.dial(ctx, nil)
	if err != nil {
		return nil, "", err
	}
	nodes, _, err := fetchNodes(ctx, c)
	if err == nil {
		var id string
		if id, err = resolveNode(nodes, query); err == nil {
			return c, id, nil
		}
	}
	c.Close()
	return nil, "", err
}

func describeNode(ctx context.Context, f *operatorFlags, query string, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	c, id, err := f.dialResolve(ctx, query)
	if err != nil {
		return err
	}
	defer c.Close()
	raw, err := c.Call(ctx, "node.describe", map[string]string{"nodeId": id})
	if err != nil {
		return callErr(err)
	}
	if f.json {
		return printJSON(out, raw)
	}
	var d struct {
		nodeSummary
		Tools []struct {
			Name        string `json:"name"`
			Description string `json:"description"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return fmt.Errorf("node.describe answer: %w", err)
	}
	fmt.Fprintf(out, "node:      %s\nname:      %s\nplatform:  %s\nconnected: %v\ncommands:  %s\n",
		d.NodeID, d.DisplayName, d.Platform, d.Connected, strings.Join(d.Commands, ", "))
	for _, u := range d.Upstreams {
		line := u.Name + " " + u.State
		if u.RequestID != "" {
			line += ", approve pairing request " + u.RequestID + " there"
		}
		if u.LastError != "" {
			line += " (" + u.LastError + ")"
		}
		fmt.Fprintf(out, "upstream:  %s\n", line)
	}
	if len(d.Tools) > 0 {
		fmt.Fprintln(out, "tools:")
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		for _, t := range d.Tools {
			fmt.Fprintf(tw, "  %s\t%s\n", t.Name, t.Description)
		}
		return tw.Flush()
	}
	return nil
}

func invokeNode(ctx context.Context, f *operatorFlags, query, command string, params json.RawMessage, invokeTimeout time.Duration, idemKey string, out io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, f.timeout+invokeTimeout)
	defer cancel()
	c, id, err := f.dialResolve(ctx, query)
	if err != nil {
		return err
	}
	defer c.Close()
	raw, err := c.Invoke(ctx, occlient.InvokeParams{NodeID: id, Command: command, Params: params,
		TimeoutMs: invokeTimeout.Milliseconds(), IdempotencyKey: idemKey})
	if err != nil {
		return callErr(err)
	}
	if f.json {
		return printJSON(out, raw)
	}
	var res struct {
		Payload json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(raw, &res); err != nil || len(res.Payload) == 0 {
		return printJSON(out, raw)
	}
	// An MCP tool result prints its text content; anything else as JSON.
	var mcp struct {
		Content []struct {
			Type string `json:"type"`
			Text string `json:"text"`
		} `json:"content"`
		IsError bool `json:"isError"`
	}
	if command == "mcp.tools.call" && json.Unmarshal(res.Payload, &mcp) == nil && len(mcp.Content) > 0 {
		for _, c := range mcp.Content {
			if c.Type == "text" {
				fmt.Fprintln(out, c.Text)
			}
		}
		if mcp.IsError {
			return &exitError{exitGatewayErr, errors.New("the tool reported an error")}
		}
		return nil
	}
	return printJSON(out, res.Payload)
}

func tailEvents(ctx context.Context, f *operatorFlags, out io.Writer) error {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	dialCtx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	enc := json.NewEncoder(out)
	c, err := f.dial(dialCtx, func(e occlient.Event) {
		if f.json {
			_ = enc.Encode(e)
			return
		}
		fmt.Fprintf(out, "%s %s %s\n", time.Now().Format(time.TimeOnly), e.Event, e.Payload)
	})
	if err != nil {
		return err
	}
	defer c.Close()
	select {
	case <-ctx.Done():
		return nil
	case <-c.Done():
		return &exitError{exitConnect, errors.New("the gateway closed the connection")}
	}
}

func printJSON(out io.Writer, raw json.RawMessage) error {
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		_, err = out.Write(append(raw, '\n'))
		return err
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
