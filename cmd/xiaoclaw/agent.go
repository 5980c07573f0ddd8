package main

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw/internal/agent"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

func agentCommand(env func(string) string, stdout io.Writer) *cobra.Command {
	var (
		o         agent.Options
		logLevel  string
		logFormat string
	)
	cmd := &cobra.Command{
		Use:   "agent --config FILE",
		Short: "Serve local programs, HTTP/TCP services and stdio MCP servers as the MCP tools of one node",
		Long: `agent connects to a devicehub as a XiaoZhi device and serves the tools of its configuration
file: programs (JSON arguments on stdin, run without a shell), HTTP and TCP services, and the tools
of stdio MCP servers ("mcpServers"), relayed as <server>.<tool>. It reconnects with backoff and
reloads the file on SIGHUP or when it changes. See docs/agent.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(os.Stderr, logLevel, logFormat)
			if err != nil {
				return err
			}
			if o.ConfigPath == "" {
				return &exitError{exitUsage, fmt.Errorf("--config is required")}
			}
			if o.Token == "" && o.OTAURL == "" {
				return &exitError{exitUsage, fmt.Errorf("no device token: pass --token or set XIAOCLAW_DEVICE_TOKEN, or boot through --ota")}
			}
			if o.OTAURL != "" {
				o.URL = ""
			}
			o.Log, o.Env, o.Version = log, env, version
			a, err := agent.New(o)
			if err != nil {
				return &exitError{exitUsage, err}
			}
			dev, _ := wire.CanonicalDevice(a.DeviceID())
			fmt.Fprintf(stdout, "agent %s (node %s) serving %d tools\n", a.DeviceID(), wire.DeviceNodeID(dev), len(a.ToolNames()))
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return a.Run(ctx)
		},
	}
	fl := cmd.Flags()
	fl.StringVarP(&o.ConfigPath, "config", "c", env("XIAOCLAW_AGENT_CONFIG"), "configuration file (env XIAOCLAW_AGENT_CONFIG)")
	fl.StringVar(&o.URL, "url", envOr(env, "XIAOCLAW_DEVICE_URL", "ws://127.0.0.1:8000/xiaozhi/v1/"), "devicehub WebSocket URL (env XIAOCLAW_DEVICE_URL)")
	fl.StringVar(&o.Token, "token", env("XIAOCLAW_DEVICE_TOKEN"), "device token (env XIAOCLAW_DEVICE_TOKEN)")
	fl.StringVar(&o.OTAURL, "ota", "", "boot through this OTA URL like the firmware; the reply names the endpoint and credentials")
	fl.StringVar(&o.DeviceID, "device-id", env("XIAOCLAW_AGENT_DEVICE_ID"), "MAC-style id to connect as (default: derived from the host name and --config)")
	fl.StringVar(&o.Name, "name", "xiaoclaw-agent", "MCP serverInfo name")
	fl.DurationVar(&o.MinBackoff, "min-backoff", agent.DefaultMinBackoff, "first wait before reconnecting")
	fl.DurationVar(&o.MaxBackoff, "max-backoff", agent.DefaultMaxBackoff, "longest wait before reconnecting")
	fl.DurationVar(&o.ReloadPoll, "reload-poll", agent.DefaultReloadPoll, "how often to check the configuration file for changes (negative: only on SIGHUP)")
	fl.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	fl.StringVar(&logFormat, "log-format", "text", "text or json")
	return cmd
}
