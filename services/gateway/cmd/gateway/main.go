// Command gateway runs one xiaoclaw gateway replica: the OpenClaw-compatible
// WebSocket gateway for operators and OpenClaw node hosts. Every flag falls
// back to an environment variable XIAOCLAW_<FLAG> (for example
// XIAOCLAW_MAX_PAYLOAD for --max-payload).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/peterbourgon/ff/v3"
	"go.opentelemetry.io/otel"
	"golang.org/x/sync/errgroup"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/authguard"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsauth"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsconn"
	"github.com/xiaoclaw/xiaoclaw/pkg/ops"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/adminapi"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/backend"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/console"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

// tokenList collects --operator-token values, repeated or comma-separated
// (the form XIAOCLAW_OPERATOR_TOKEN takes).
type tokenList []string

func (t *tokenList) String() string { return strings.Join(*t, ",") }
func (t *tokenList) Set(v string) error {
	*t = append(*t, strings.Split(v, ",")...)
	return nil
}

// run parses the flags, each falling back to XIAOCLAW_<FLAG> (upper case,
// "-" as "_"), and serves until SIGINT or SIGTERM.
func run(args []string) error {
	host, _ := os.Hostname()
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	natsURL := fs.String("nats-url", nats.DefaultURL, "NATS server URL")
	var natsCreds natsauth.Credentials
	natsCreds.Register(fs)
	addr := fs.String("addr", "127.0.0.1:18789", "WebSocket listen address")
	opsAddr := fs.String("ops-addr", ":9090", "ops listen address for /healthz, /readyz, /metrics and /debug/loglevel")
	instance := fs.String("instance", host, "replica name, stable across restarts")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "json", "json or text")
	handshake := fs.Duration("handshake-timeout", 15*time.Second, "close sockets that do not complete connect in time")
	maxInvoke := fs.Duration("max-invoke-timeout", 300*time.Second, "cap of any node.invoke timeoutMs")
	mcpOn := fs.Bool("mcp", true, "serve the tenant's device tools as an MCP server at /mcp")
	mcpPage := fs.Int("mcp-page-size", 100, "tools per MCP tools/list page")
	mcpIdle := fs.Duration("mcp-session-timeout", 30*time.Minute, "end an MCP session idle for this long")
	mcpSessions := fs.Int("mcp-max-sessions", 100, "MCP sessions one token may have open across the replicas; more are refused with 429")
	ttl := fs.Duration("idempotency-ttl", 5*time.Minute, "how long a node.invoke idempotency key is remembered (at least 1s)")
	replicas := fs.Int("idempotency-replicas", 1, "replicas of the idempotency KV bucket in a NATS cluster, 1 to 5; 3 in production")
	maxPayload := fs.Int64("max-payload", gateway.DefaultMaxPayload, "cap of one frame after hello in bytes, advertised as policy.maxPayload")
	maxParams := fs.Int("max-invoke-params", gateway.DefaultMaxInvokeParams, "cap of node.invoke params (a tool call's arguments) in bytes")
	maxPerToken := fs.Int("max-conns-per-token", gateway.DefaultMaxConnsPerToken, "cap of connections per token on this replica")
	maxPerTenant := fs.Int("max-conns-per-tenant", gateway.DefaultMaxConnsPerTenant, "cap of connections per tenant on this replica")
	maxInflight := fs.Int("max-inflight-per-conn", gateway.DefaultMaxInflightPerConn, "cap of requests in flight per connection")
	databaseURL := fs.String("database-url", "", "Postgres URL: tenants, operator tokens, policies, audit trail, admin API")
	adminToken := fs.String("admin-token", "", "global admin token of the admin API, at least 16 characters")
	jaegerURL := fs.String("jaeger-url", "", "Jaeger UI base URL the console at /ui/ links traces to")
	noConsole := fs.Bool("no-console", false, "do not serve the operator console at /ui/")
	auditWriter := fs.Bool("audit-writer", true, "also run the audit writer (stream → Postgres) in this process")
	var authFails, codeFails authguard.Config
	authFails.RegisterFlags(fs, "auth-failure", "authentications (operator connect, admin and audit APIs)", authguard.Config{})
	codeFails.RegisterFlags(fs, "activation-failure", "activation codes (per tenant and per source)", adminapi.DefaultActivationFailures)
	trustedProxies := fs.String("trusted-proxies", "", "reverse proxies (CIDRs or addresses, comma-separated) whose X-Forwarded-For names the client whose failures are throttled")
	var tokens tokenList
	fs.Var(&tokens, "operator-token", "static operator token TENANT=TOKEN or TENANT:ROLE=TOKEN (role admin, operator or viewer; default admin); repeatable or comma-separated")
	if err := ff.Parse(fs, args, ff.WithEnvVarPrefix("XIAOCLAW")); err != nil {
		return err
	}

	proxies, err := authguard.ParsePrefixes(*trustedProxies)
	if err != nil {
		return fmt.Errorf("--trusted-proxies: %w", err)
	}
	auth, err := parseTokens(tokens)
	if err != nil {
		return err
	}
	if *ttl < time.Second {
		return fmt.Errorf("--idempotency-ttl %s: want at least 1s", *ttl)
	}
	if *replicas < 1 || *replicas > 5 {
		return fmt.Errorf("--idempotency-replicas %d: want 1 to 5", *replicas)
	}
	if len(auth) == 0 && *databaseURL == "" {
		return errors.New("no operator credentials: pass --database-url (tokens from the tenancy store) or --operator-token TENANT=TOKEN")
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	proc, err := telemetry.StartProcess(ctx, telemetry.ProcessConfig{Service: telemetry.ServiceGateway,
		Instance: *instance, Version: version, LogLevel: *logLevel, LogFormat: *logFormat, Stderr: os.Stderr})
	if err != nil {
		return err
	}
	defer proc.Shutdown() // flushes the spans still queued, after everything else has stopped
	log, tp, reg, level := proc.Log, proc.Tracer, proc.Registry, proc.Level
	otel.SetErrorHandler(telemetry.ErrorHandler(log, time.Minute))

	natsOpts, err := natsCreds.Options()
	if err != nil {
		return err
	}
	nc, err := natsconn.Connect(proc.Registry, *natsURL, "xiaoclaw-gateway "+*instance, telemetry.LabelGateway, log, natsOpts...)
	if err != nil {
		return err
	}
	defer nc.Close()

	cfg := gateway.Config{
		Addr:                *addr,
		Instance:            *instance,
		Version:             "xiaoclaw-" + version,
		Auth:                auth,
		HandshakeTimeout:    *handshake,
		AuthFailures:        authFails,
		TrustedProxies:      proxies,
		MaxInvokeTimeout:    *maxInvoke,
		MaxPayload:          *maxPayload,
		MaxInvokeParams:     *maxParams,
		MaxConnsPerToken:    *maxPerToken,
		MaxConnsPerTenant:   *maxPerTenant,
		MaxInflightPerConn:  *maxInflight,
		IdempotencyTTL:      *ttl,
		IdempotencyReplicas: *replicas,
		TracerProvider:      tp,
		Registerer:          reg,
		MCP: gateway.MCPConfig{Disabled: !*mcpOn, PageSize: *mcpPage, SessionTimeout: *mcpIdle,
			MaxSessionsPerPrincipal: *mcpSessions},
	}
	if !*noConsole {
		if cfg.Console, err = console.New(console.Config{JaegerURL: *jaegerURL, Version: version}); err != nil {
			return fmt.Errorf("--jaeger-url: %w", err)
		}
	}
	var (
		be      *backend.Backend
		runners []func(context.Context) error
	)
	if *databaseURL != "" {
		if be, runners, err = openBackend(ctx, backend.Config{DatabaseURL: *databaseURL, Static: auth, AdminToken: *adminToken,
			AuthFailures: authFails, ActivationFailures: codeFails, TrustedProxies: proxies}, nc, *auditWriter, reg, log); err != nil {
			return err
		}
		defer be.Close()
		be.Configure(&cfg)
	} else {
		log.Warn("no --database-url: static operator tokens only; no policy store, audit trail or admin API")
	}
	svc, err := gateway.New(cfg, nc, log)
	if err != nil {
		return err
	}
	checks := []ops.Check{
		ops.NATSCheck(nc),
		// Started, not draining (and connected).
		{Name: "gateway", Run: func(context.Context) error { return svc.CheckReady() }},
	}
	if be != nil {
		checks = append(checks, be.DB.Check())
	}
	ops, err := ops.NewServer(ops.Config{Addr: *opsAddr, Gatherer: reg, LogLevel: level, Checks: checks}, log)
	if err != nil {
		return err
	}

	log.Info("gateway starting", "version", version, "addr", svc.Addr(), "ops", *opsAddr, "nats", nc.ConnectedUrlRedacted())
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ops.Run(gctx) })
	g.Go(func() error { return svc.Run(gctx) })
	if be != nil {
		// Caches first, then the re-check of live connections.
		for _, run := range append(runners, be.Watcher(nc, svc).Run) {
			g.Go(func() error { return run(gctx) })
		}
	}
	return g.Wait()
}

// parseTokens reads TENANT=TOKEN and TENANT:ROLE=TOKEN entries.
func parseTokens(entries []string) (access.StaticTokens, error) {
	out := access.StaticTokens{}
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		who, token, ok := strings.Cut(e, "=")
		if !ok || token == "" {
			return nil, fmt.Errorf("--operator-token %q: want TENANT=TOKEN", e)
		}
		tenant, role, hasRole := strings.Cut(who, ":")
		if !hasRole {
			role = access.RoleAdmin
		}
		if err := wire.ValidTenant(tenant); err != nil {
			return nil, fmt.Errorf("--operator-token: %w", err)
		}
		switch role {
		case access.RoleAdmin, access.RoleOperator, access.RoleViewer:
		default:
			return nil, fmt.Errorf("--operator-token: unknown role %q", role)
		}
		if _, dup := out[token]; dup {
			return nil, errors.New("--operator-token: the same token is given twice")
		}
		out[token] = access.Principal{Tenant: tenant, ID: "static:" + tenant + ":" + role, Name: "static " + role + " token of " + tenant, Role: role}
	}
	return out, nil
}
