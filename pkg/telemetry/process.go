package telemetry

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// ProcessConfig describes one service process for StartProcess.
type ProcessConfig struct {
	Service   string // tracer service name, e.g. ServiceGateway
	Instance  string
	Version   string
	LogLevel  string    // debug, info, warn or error
	LogFormat string    // json or text
	Stderr    io.Writer // logs
}

// Process is the telemetry of one service process: a logger whose level
// changes at run time, a tracer provider and a metrics registry.
type Process struct {
	Log      *slog.Logger
	Level    *slog.LevelVar
	Tracer   *TracerProvider
	Registry *prometheus.Registry
}

// StartProcess builds what every service main needs first; Shutdown flushes
// the spans still queued when the process ends.
func StartProcess(ctx context.Context, cfg ProcessConfig) (*Process, error) {
	p := &Process{Level: new(slog.LevelVar), Registry: NewRegistry()}
	if err := p.Level.UnmarshalText([]byte(cfg.LogLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	log, err := NewLogger(cfg.Stderr, cfg.LogFormat, p.Level)
	if err != nil {
		return nil, fmt.Errorf("--log-format: %w", err)
	}
	p.Log = log
	p.Tracer, err = NewTracerProvider(ctx, cfg.Service, Config{Instance: cfg.Instance, Version: cfg.Version})
	if err != nil {
		return nil, err
	}
	p.Log.Info("tracing", "config", p.Tracer.String())
	return p, nil
}

// Shutdown flushes and stops the tracer provider, waiting at most 5 s.
func (p *Process) Shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := p.Tracer.Shutdown(ctx); err != nil {
		p.Log.Warn("tracer shutdown", "err", err)
	}
}

// ConnectNATS connects to NATS for ever-retrying use by a service, logs
// disconnects, reconnects and asynchronous errors such as slow consumers and
// permission violations (NATSErrorHandler) on log, and exports the
// connection state as the xiaoclaw_nats_connected gauge with the service
// label. opts add the service's credentials (natsauth).
func (p *Process) ConnectNATS(url, name, label string, log *slog.Logger, opts ...nats.Option) (*nats.Conn, error) {
	onErr, err := NATSErrorHandler(p.Registry, label, log)
	if err != nil {
		return nil, err
	}
	opts = append([]nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.ErrorHandler(onErr),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn("NATS disconnected", "err", err) }),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("NATS reconnected", "url", c.ConnectedUrlRedacted()) }),
	}, opts...)
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect NATS %s: %w", url, err)
	}
	if err := RegisterNATSConnected(p.Registry, label, nc); err != nil {
		nc.Close()
		return nil, err
	}
	return nc, nil
}
