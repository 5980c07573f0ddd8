// Command shim runs one shim replica: it connects to NATS, serves node.invoke
// for XiaoZhi devices and keeps the node registry, until SIGINT or SIGTERM.
// Every flag falls back to an environment variable XIAOCLAW_<FLAG> (for
// example XIAOCLAW_NATS_URL).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel"
	"golang.org/x/sync/errgroup"

	"github.com/xiaoclaw/xiaoclaw/pkg/natsauth"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsconn"
	"github.com/xiaoclaw/xiaoclaw/pkg/ops"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/services/shim"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "shim:", err)
		os.Exit(1)
	}
}

// env returns XIAOCLAW_<NAME> (dashes become underscores) or def.
func env(name, def string) string {
	if v, ok := os.LookupEnv("XIAOCLAW_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))); ok {
		return v
	}
	return def
}

// run serves until ctx is done (main cancels it on SIGINT or SIGTERM).
func run(ctx context.Context, args []string, stderr io.Writer) error {
	host, _ := os.Hostname()
	fs := flag.NewFlagSet("shim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	natsURL := fs.String("nats-url", env("nats-url", nats.DefaultURL), "NATS server URL")
	var natsCreds natsauth.Credentials
	natsCreds.Register(fs, os.Getenv)
	opsAddr := fs.String("ops-addr", env("ops-addr", ":9090"), "listen address of /healthz, /readyz, /metrics and /debug/loglevel")
	instance := fs.String("instance", env("instance", host), "replica name in logs and NATS")
	logLevel := fs.String("log-level", env("log-level", "info"), "debug, info, warn or error")
	logFormat := fs.String("log-format", env("log-format", "json"), "json or text")
	defTimeout := fs.String("default-timeout", env("default-timeout", "15s"), "deadline of an invoke that carries none")
	hubTimeout := fs.String("hub-timeout", env("hub-timeout", shim.DefaultHubTimeout.String()),
		"mark the devices of a devicehub disconnected after this long without its heartbeat; negative: never")
	maxInFlight := fs.String("max-inflight", env("max-inflight", "10000"), "invokes the replica runs at once; more fail with BUSY")
	tenantInFlight := fs.String("tenant-max-inflight", env("tenant-max-inflight", "0"), "a tenant's default share: its invokes the replica runs at once, more fail with RATE_LIMITED; 0: a tenth of --max-inflight. The tenant record's limit replaces it")
	deviceInFlight := fs.String("device-max-inflight", env("device-max-inflight", "32"), "a tenant's default share per device: invokes to one device the replica runs at once, more fail with BUSY. The tenant record's limit replaces it")
	upFlags := addUpstreamFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	timeout, err := time.ParseDuration(*defTimeout)
	if err != nil {
		return fmt.Errorf("--default-timeout: %w", err)
	}
	hubTO, err := time.ParseDuration(*hubTimeout)
	if err != nil {
		return fmt.Errorf("--hub-timeout: %w", err)
	}
	cfg := shim.Config{Instance: *instance, DefaultTimeout: timeout, HubTimeout: hubTO}
	for _, l := range []struct {
		flag string
		v    string
		dst  *int
	}{{"max-inflight", *maxInFlight, &cfg.MaxInFlight}, {"tenant-max-inflight", *tenantInFlight, &cfg.TenantMaxInFlight}, {"device-max-inflight", *deviceInFlight, &cfg.DeviceMaxInFlight}} {
		if *l.dst, err = strconv.Atoi(l.v); err != nil {
			return fmt.Errorf("--%s: %q is not a number", l.flag, l.v)
		}
	}
	if err := cfg.Validate(); err != nil {
		return err
	}

	proc, err := telemetry.StartProcess(ctx, telemetry.ProcessConfig{Service: telemetry.ServiceShim,
		Instance: *instance, Version: version, LogLevel: *logLevel, LogFormat: *logFormat, Stderr: stderr})
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
	nc, err := natsconn.Connect(proc.Registry, *natsURL, "shim "+*instance, telemetry.LabelShim, log, natsOpts...)
	if err != nil {
		return err
	}
	defer nc.Close()

	cfg.TracerProvider, cfg.Registerer = tp, reg
	svc, err := shim.New(cfg, nc, log)
	if err != nil {
		return err
	}
	up, upInvoker, err := upFlags.service(*instance, nc, log)
	if err != nil {
		return err
	}
	ops, err := ops.NewServer(ops.Config{
		Addr: *opsAddr, Gatherer: reg, LogLevel: level,
		Checks: []ops.Check{ops.NATSCheck(nc), ops.ChannelCheck("shim", svc.Ready())},
	}, log)
	if err != nil {
		return err
	}

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return ops.Run(gctx) })
	select {
	case <-ops.Ready():
	case <-gctx.Done():
		return g.Wait()
	}
	log.Info("shim starting", "version", version, "nats", nc.ConnectedUrlRedacted(), "ops", ops.Addr())
	g.Go(func() error { return svc.Run(gctx) })
	if up != nil {
		g.Go(func() error {
			defer upInvoker.Close()
			return up.Run(gctx)
		})
	}
	runErr := g.Wait()

	if err := nc.Drain(); err != nil {
		log.Warn("NATS drain", "err", err)
	}
	return runErr
}
