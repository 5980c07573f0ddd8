// Command shim runs one shim replica: it connects to NATS, serves node.invoke
// for XiaoZhi devices and keeps the node registry, until SIGINT or SIGTERM.
// Every flag falls back to an environment variable XIAOCLAW_<FLAG> (for
// example XIAOCLAW_NATS_URL).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

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
	opsAddr := fs.String("ops-addr", env("ops-addr", ":9090"), "listen address of /healthz and /readyz")
	instance := fs.String("instance", env("instance", host), "replica name in logs and NATS")
	logLevel := fs.String("log-level", env("log-level", "info"), "debug, info, warn or error")
	logFormat := fs.String("log-format", env("log-format", "json"), "json or text")
	defTimeout := fs.String("default-timeout", env("default-timeout", "15s"), "deadline of an invoke that carries none")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log, err := newLogger(stderr, *logLevel, *logFormat)
	if err != nil {
		return err
	}
	timeout, err := time.ParseDuration(*defTimeout)
	if err != nil {
		return fmt.Errorf("--default-timeout: %w", err)
	}
	cfg := shim.Config{Instance: *instance, DefaultTimeout: timeout}
	if err := cfg.Validate(); err != nil {
		return err
	}

	nc, err := nats.Connect(*natsURL,
		nats.Name("shim "+*instance),
		nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn("NATS disconnected", "err", err) }),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("NATS reconnected", "url", c.ConnectedUrlRedacted()) }),
	)
	if err != nil {
		return fmt.Errorf("connect NATS %s: %w", *natsURL, err)
	}
	defer nc.Close()

	svc, err := shim.New(cfg, nc, log)
	if err != nil {
		return err
	}

	ln, err := net.Listen("tcp", *opsAddr)
	if err != nil {
		return fmt.Errorf("ops listener: %w", err)
	}
	ops := &http.Server{Handler: opsHandler(nc, svc), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := ops.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("ops server", "err", err)
		}
	}()
	log.Info("shim starting", "version", version, "nats", nc.ConnectedUrlRedacted(), "ops", ln.Addr().String())

	runErr := svc.Run(ctx)

	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = ops.Shutdown(shutdownCtx)
	if err := nc.Drain(); err != nil {
		log.Warn("NATS drain", "err", err)
	}
	return runErr
}

// opsHandler serves /healthz (the process runs) and /readyz (the replica is
// serving and NATS is connected).
func opsHandler(nc *nats.Conn, svc *shim.Service) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-svc.Ready():
		default:
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		if !nc.IsConnected() {
			http.Error(w, "NATS disconnected", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
	return mux
}

func newLogger(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format must be json or text, not %q", format)
}
