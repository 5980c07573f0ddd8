package main

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/xiaoclaw/xiaoclaw/pkg/audit"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/backend"
)

// openBackend opens the backend on PostgreSQL and returns what keeps it
// going: the database pings, the stored upstreams' bucket sync (one per
// replica: only one wins each caller token it mints) and, with
// runAuditWriter, the audit writer, collector and lag monitor. reg receives the database and audit backlog
// gauges.
func openBackend(ctx context.Context, cfg backend.Config, nc *nats.Conn, runAuditWriter bool,
	reg prometheus.Registerer, log *slog.Logger) (*backend.Backend, []func(context.Context) error, error) {
	cfg.Log = log
	be, err := backend.Open(ctx, cfg, nc)
	if err != nil {
		return nil, nil, err
	}
	fail := func(err error) (*backend.Backend, []func(context.Context) error, error) {
		be.Close()
		return nil, nil, err
	}
	if err := be.DB.Register(reg, telemetry.LabelGateway); err != nil {
		return fail(err)
	}
	runners := []func(context.Context) error{be.DB.Run, be.Upstreams.Run}
	if runAuditWriter {
		w, err := be.AuditWriter(nc, reg)
		if err != nil {
			return fail(err)
		}
		c, err := audit.NewCollector(nc, be.Publisher, log)
		if err != nil {
			return fail(err)
		}
		runners = append(runners, w, c.Run)
	}
	return be, runners, nil
}
