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
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/peterbourgon/ff/v3"
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

// run serves until ctx is done (main cancels it on SIGINT or SIGTERM).
func run(ctx context.Context, args []string, stderr io.Writer) error {
	host, _ := os.Hostname()
	fs := flag.NewFlagSet("shim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	natsURL := fs.String("nats-url", nats.DefaultURL, "NATS server URL")
	var natsCreds natsauth.Credentials
	natsCreds.Register(fs)
	opsAddr := fs.String("ops-addr", ":9090", "listen address of /healthz, /readyz, /metrics and /debug/loglevel")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "json", "json or text")
	cfg := shim.Config{}
	fs.StringVar(&cfg.Instance, "instance", host, "replica name in logs and NATS")
	fs.DurationVar(&cfg.DefaultTimeout, "default-timeout", 15*time.Second, "deadline of an invoke that carries none")
	fs.DurationVar(&cfg.HubTimeout, "hub-timeout", shim.DefaultHubTimeout,
		"mark the devices of a devicehub disconnected after this long without its heartbeat; negative: never")
	fs.IntVar(&cfg.MaxInFlight, "max-inflight", 10000, "invokes the replica runs at once; more fail with BUSY")
	fs.IntVar(&cfg.TenantMaxInFlight, "tenant-max-inflight", 0, "a tenant's default share: its invokes the replica runs at once, more fail with RATE_LIMITED; 0: a tenth of --max-inflight. The tenant record's limit replaces it")
	fs.IntVar(&cfg.DeviceMaxInFlight, "device-max-inflight", 32, "a tenant's default share per device: invokes to one device the replica runs at once, more fail with BUSY. The tenant record's limit replaces it")
	upFlags := addUpstreamFlags(fs)
	if err := ff.Parse(fs, args, ff.WithEnvVarPrefix("XIAOCLAW")); err != nil {
		return err
	}
	if err := cfg.Validate(); err != nil {
		return err
	}

	proc, err := telemetry.StartProcess(ctx, telemetry.ProcessConfig{Service: telemetry.ServiceShim,
		Instance: cfg.Instance, Version: version, LogLevel: *logLevel, LogFormat: *logFormat, Stderr: stderr})
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
	nc, err := natsconn.Connect(proc.Registry, *natsURL, "shim "+cfg.Instance, telemetry.LabelShim, log, natsOpts...)
	if err != nil {
		return err
	}
	defer nc.Close()

	cfg.TracerProvider, cfg.Registerer = tp, reg
	svc, err := shim.New(cfg, nc, log)
	if err != nil {
		return err
	}
	up, upInvoker, err := upFlags.service(cfg.Instance, nc, reg, log)
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
