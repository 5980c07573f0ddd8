package telemetry

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

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
