package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw/internal/devstack"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/console"
	"github.com/xiaoclaw/xiaoclaw/services/shim/upstream"
)

type devFlags struct {
	deviceAddr     string
	gatewayAddr    string
	mqttAddr       string
	noAutoActivate bool
	natsListen     string
	natsURL        string
	dataDir        string
	deviceToken    string
	operatorToken  string
	adminToken     string
	databaseURL    string
	logLevel       string
	logFormat      string
	jaegerURL      string
	upstreamURL    string
	upstreamToken  string
	upstreamName   string
}

// devCredentials persist in the data directory so a restart keeps the
// tokens people have already pasted into devices and scripts.
type devCredentials struct {
	DeviceToken   string `json:"deviceToken"`
	OperatorToken string `json:"operatorToken"`
	AdminToken    string `json:"adminToken"`
	// NATSPassword protects the embedded NATS server when --nats-listen
	// exposes it.
	NATSPassword string `json:"natsPassword"`
}

func devCommand(env func(string) string, stdout io.Writer) *cobra.Command {
	f := &devFlags{}
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the whole system in one process: gateway, shim, devicehub, embedded NATS",
		Long: `dev runs gateway, shim and devicehub in one process on an embedded NATS server with
JetStream (data in --data-dir), seeds the tenant "dev" and prints the endpoints and credentials.
Tokens not given as flags are generated once and kept in the data directory.
Ctrl-C (SIGINT) or SIGTERM shuts down gracefully.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDev(cmd.Context(), f, stdout)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.deviceAddr, "device-addr", "127.0.0.1:8000", "device endpoint: XiaoZhi WebSocket /xiaozhi/v1/")
	fl.StringVar(&f.gatewayAddr, "gateway-addr", "127.0.0.1:18789", "operator endpoint: OpenClaw gateway protocol")
	fl.StringVar(&f.mqttAddr, "mqtt-addr", "127.0.0.1:1884", "MQTT device endpoint (embedded broker; empty: no MQTT)")
	fl.BoolVar(&f.noAutoActivate, "no-auto-activate", false, "do not bind new OTA devices to the dev tenant; bind their codes with xiaoclaw device activate")
	fl.StringVar(&f.natsListen, "nats-listen", "", "let processes outside dev reach the embedded NATS server at this address, with user "+devstack.NATSUser+" and a generated password (empty: in-process only, no listener)")
	fl.StringVar(&f.natsURL, "nats-url", env("XIAOCLAW_NATS_URL"), "use this NATS server instead of the embedded one (env XIAOCLAW_NATS_URL)")
	fl.StringVar(&f.dataDir, "data-dir", defaultDataDir(env), "state directory (JetStream store, generated credentials)")
	fl.StringVar(&f.deviceToken, "device-token", env("XIAOCLAW_DEVICE_TOKEN"), "the dev tenant's device token (generated when empty)")
	fl.StringVar(&f.operatorToken, "operator-token", env("XIAOCLAW_OPERATOR_TOKEN"), "the dev tenant's operator token (generated when empty)")
	fl.StringVar(&f.adminToken, "admin-token", env("XIAOCLAW_ADMIN_TOKEN"), "global admin token of the admin API (generated when empty)")
	fl.StringVar(&f.databaseURL, "database-url", env("XIAOCLAW_DATABASE_URL"), "Postgres URL for tenants, credentials and policies (default: SQLite in --data-dir)")
	fl.StringVar(&f.jaegerURL, "jaeger-url", env("XIAOCLAW_JAEGER_URL"), "Jaeger UI base URL the console links traces to, e.g. http://127.0.0.1:16686 (env XIAOCLAW_JAEGER_URL)")
	fl.StringVar(&f.upstreamURL, "upstream-url", env("XIAOCLAW_UPSTREAM_URL"), "publish every dev tenant device as a node on this OpenClaw gateway, e.g. ws://127.0.0.1:18790 (env XIAOCLAW_UPSTREAM_URL)")
	fl.StringVar(&f.upstreamToken, "upstream-token", env("XIAOCLAW_UPSTREAM_TOKEN"), "that OpenClaw gateway's token (env XIAOCLAW_UPSTREAM_TOKEN)")
	fl.StringVar(&f.upstreamName, "upstream-name", devstack.DefaultUpstreamName, "name of the upstream; its calls are the policy principal upstream:<name>")
	fl.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fl.StringVar(&f.logFormat, "log-format", "text", "text or json")
	return cmd
}

func defaultDataDir(env func(string) string) string {
	if d := env("XIAOCLAW_DATA_DIR"); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "xiaoclaw", "dev")
	}
	return filepath.Join(os.TempDir(), "xiaoclaw-dev")
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, &exitError{exitUsage, fmt.Errorf("--log-level: %w", err)}
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	default:
		return nil, &exitError{exitUsage, fmt.Errorf("--log-format must be text or json, not %q", format)}
	}
}

func loadCredentials(dir string, f *devFlags) (devCredentials, error) {
	path := filepath.Join(dir, "credentials.json")
	var c devCredentials
	if b, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(b, &c); err != nil {
			return c, fmt.Errorf("%s is damaged (%v): remove it to generate new tokens", path, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return c, err
	}
	for _, p := range []struct {
		flag  string
		saved *string
		pref  string
	}{{f.deviceToken, &c.DeviceToken, "devdev_"}, {f.operatorToken, &c.OperatorToken, "devop_"}, {f.adminToken, &c.AdminToken, "devadmin_"},
		{"", &c.NATSPassword, "devnats_"}} {
		switch {
		case p.flag != "":
			*p.saved = p.flag
		case *p.saved == "":
			*p.saved = p.pref + randomToken()
		}
	}
	b, _ := json.MarshalIndent(c, "", "  ")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return c, fmt.Errorf("save credentials: %w", err)
	}
	return c, nil
}

func randomToken() string {
	var b [18]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func runDev(ctx context.Context, f *devFlags, stdout io.Writer) error {
	var level slog.LevelVar
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return &exitError{exitUsage, fmt.Errorf("--log-level: %w", err)}
	}
	log, err := telemetry.NewLogger(os.Stderr, f.logFormat, &level)
	if err != nil {
		return &exitError{exitUsage, fmt.Errorf("--log-format: %w", err)}
	}
	if err := os.MkdirAll(f.dataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	creds, err := loadCredentials(f.dataDir, f)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	tel, err := newDevTelemetry(ctx, log)
	if err != nil {
		return err
	}
	defer tel.shutdown() // after the stack has stopped: flushes the last spans
	cfg := devstack.Config{
		DataDir:       f.dataDir,
		NATSURL:       f.natsURL,
		NATSListen:    f.natsListen,
		NATSPassword:  creds.NATSPassword,
		DeviceAddr:    f.deviceAddr,
		MQTTAddr:      f.mqttAddr,
		AutoActivate:  !f.noAutoActivate,
		GatewayAddr:   f.gatewayAddr,
		DeviceToken:   creds.DeviceToken,
		OperatorToken: creds.OperatorToken,
		AdminToken:    creds.AdminToken,
		DatabaseURL:   f.databaseURL,
		Log:           log,
	}
	if f.upstreamURL != "" {
		cfg.Upstream = upstream.Upstream{Name: f.upstreamName, URL: f.upstreamURL, Token: f.upstreamToken}
	} else if f.upstreamToken != "" {
		return &exitError{exitUsage, errors.New("--upstream-token needs --upstream-url")}
	}
	if cfg.Console, err = console.New(console.Config{JaegerURL: f.jaegerURL, Version: version}); err != nil {
		return &exitError{exitUsage, fmt.Errorf("--jaeger-url: %w", err)}
	}
	tel.stackConfig(&cfg)
	st, err := devstack.Start(ctx, cfg)
	if err != nil {
		return err
	}
	if err := tel.serve(st, &level); err != nil {
		st.Close()
		return err
	}
	printBanner(stdout, st, creds, f)
	<-ctx.Done()
	stop() // a second signal now kills the process the default way
	fmt.Fprintln(stdout, "shutting down…")
	st.Close()
	return nil
}

func printBanner(w io.Writer, st *devstack.Stack, c devCredentials, f *devFlags) {
	dataDir := f.dataDir
	var b strings.Builder
	fmt.Fprintf(&b, "\nxiaoclaw dev is running (tenant %q, data in %s)\n\n", devstack.DevTenant, dataDir)
	fmt.Fprintf(&b, "  operators  %s\n", st.GatewayURL(0))
	fmt.Fprintf(&b, "             operator token: %s\n", c.OperatorToken)
	fmt.Fprintf(&b, "  devices    %s\n", st.DeviceURL(0))
	fmt.Fprintf(&b, "             device token:   %s\n", c.DeviceToken)
	fmt.Fprintf(&b, "  OTA        %s\n", st.OTAURL(0))
	if addr := st.Hubs[0].MQTTAddr(); addr != "" {
		fmt.Fprintf(&b, "  MQTT       %s (credentials from OTA)\n", addr)
	}
	fmt.Fprintf(&b, "  admin API  http://%s/api/   admin token: %s\n", st.Gateways[0].Addr(), c.AdminToken)
	fmt.Fprintf(&b, "  console    http://%s/ui/    (sign in with the operator or admin token)\n", st.Gateways[0].Addr())
	fmt.Fprintf(&b, "  MCP        http://%s/mcp    (Authorization: Bearer <operator token>; docs/mcp.md)\n", st.Gateways[0].Addr())
	switch {
	case f.natsURL != "":
		fmt.Fprintf(&b, "  nats       %s (external)\n", st.NATSURL())
	case st.NATSURL() != "":
		fmt.Fprintf(&b, "  nats       %s   user %s, password %s\n", st.NATSURL(), devstack.NATSUser, c.NATSPassword)
	default:
		fmt.Fprintf(&b, "  nats       in-process only (--nats-listen exposes it, with a password)\n")
	}
	if u := st.UpstreamConfig(); u.URL != "" {
		fmt.Fprintf(&b, "  upstream   %s publishes every device (policy principal %s)\n", u.URL, upstream.Principal(u.Name))
	}
	fmt.Fprintln(&b)
	fmt.Fprintf(&b, "Try, in another terminal:\n")
	fmt.Fprintf(&b, "  xiaoclaw sim --url %s --token %s --count 3\n", st.DeviceURL(0), c.DeviceToken)
	fmt.Fprintf(&b, "  XIAOCLAW_URL=%s XIAOCLAW_TOKEN=%s xiaoclaw nodes\n", st.GatewayURL(0), c.OperatorToken)
	fmt.Fprintf(&b, "  XIAOCLAW_SERVER=http://%s XIAOCLAW_TOKEN=%s xiaoclaw policy list --tenant %s\n\n", st.Gateways[0].Addr(), c.AdminToken, devstack.DevTenant)
	fmt.Fprint(w, b.String())
}
