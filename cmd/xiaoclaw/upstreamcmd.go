package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw/internal/admincmd"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsauth"
	"github.com/xiaoclaw/xiaoclaw/services/shim/upstream"
)

// upstreamCommand groups the upstream-mode commands: a tenant's upstream
// gateways (add, list, remove, over the admin API) and the state of every
// (device, upstream) link, read from the lease bucket on NATS.
func upstreamCommand(env func(string) string, stdout io.Writer) *cobra.Command {
	cmd := &cobra.Command{Use: "upstream", Short: "Devices published as nodes on OpenClaw gateways (upstream mode)"}
	var natsURL string
	var asJSON bool
	creds := natsauth.FromEnv(env)
	status := &cobra.Command{
		Use:   "status",
		Short: "State of every device's link to its upstream OpenClaw gateways",
		Long: `Lists each (device, upstream) link held by a shim worker: connecting, pairing (with the
upstream's requestId to approve), online, backoff or disabled (credentials refused), the last
error and the holder. Reads the lease bucket on NATS: xiaoclaw dev --nats-listen prints its URL,
user and password.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if natsURL == "" {
				return &exitError{exitUsage, fmt.Errorf("--nats-url is required (xiaoclaw dev --nats-listen prints it)")}
			}
			opts, err := creds.Options()
			if err != nil {
				return &exitError{exitUsage, err}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 10*time.Second)
			defer cancel()
			nc, err := nats.Connect(natsURL, append(opts, nats.Name("xiaoclaw upstream status"), nats.Timeout(5*time.Second))...)
			if err != nil {
				return &exitError{exitConnect, err}
			}
			defer nc.Close()
			sts, err := upstream.ReadStatus(ctx, nc)
			if err != nil {
				return &exitError{exitConnect, err}
			}
			if asJSON {
				if sts == nil {
					sts = []upstream.Status{}
				}
				b, _ := json.MarshalIndent(sts, "", "  ")
				_, err := fmt.Fprintln(stdout, string(b))
				return err
			}
			w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "TENANT\tUPSTREAM\tNODE\tSTATE\tSINCE\tHOLDER\tUPSTREAM NODE ID\tTOOLS\tDETAIL")
			for _, s := range sts {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\n", s.Tenant, s.Upstream, s.NodeID, s.State,
					time.UnixMilli(s.SinceMs).Format("15:04:05"), s.Holder, s.DeviceID, s.Tools, statusDetail(s))
			}
			return w.Flush()
		},
	}
	status.Flags().StringVar(&natsURL, "nats-url", env("XIAOCLAW_NATS_URL"), "NATS server of the deployment (env XIAOCLAW_NATS_URL)")
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	credFlags := flag.NewFlagSet("nats", flag.ContinueOnError)
	creds.Register(credFlags)
	status.Flags().AddGoFlagSet(credFlags)
	cmd.AddCommand(status)
	cmd.AddCommand(admincmd.UpstreamCommands(env)...)
	return cmd
}

// statusDetail is the DETAIL column of a link: what to do or what went
// wrong, then any warning about its setup or refusal of its tools.
func statusDetail(s upstream.Status) string {
	var parts []string
	switch {
	case s.RequestID != "":
		parts = append(parts, "approve request "+s.RequestID+": "+s.LastError)
	case s.LastError != "":
		parts = append(parts, s.LastError)
	}
	if s.ToolsError != "" {
		parts = append(parts, "plugin tools refused: "+s.ToolsError)
	}
	if s.Warning != "" {
		parts = append(parts, "warning: "+s.Warning)
	}
	return strings.Join(parts, "; ")
}
