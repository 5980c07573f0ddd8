package audit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// LagMonitorConfig configures a LagMonitor. Zero values take the defaults.
type LagMonitorConfig struct {
	// Durable names the writers' shared consumer. Default
	// wire.ConsumerAuditWriter.
	Durable string
	// Interval between two samples. Default 5 s.
	Interval time.Duration
	// Registerer receives xiaoclaw_audit_backlog and
	// xiaoclaw_audit_lag_seconds; nil: a private registry.
	Registerer prometheus.Registerer
}

// lagSampleTimeout bounds the JetStream requests of one sample.
const lagSampleTimeout = 5 * time.Second

// LagMonitor samples how far the audit writers are behind and sets the
// backlog and lag gauges. Both come from JetStream, not from a writer's
// memory, so they count events whichever writer replica holds them, and
// events published while no writer ran: the backlog is the writers'
// durable consumer's pending events (not yet delivered, plus delivered
// and not yet acknowledged, i.e. not yet committed), the lag the age of
// the oldest of them, from its time in the stream (0 when none waits).
// Every replica that runs one reports the same stream-wide values.
type LagMonitor struct {
	js           jetstream.JetStream
	cfg          LagMonitorConfig
	backlog, lag prometheus.Gauge
	log          *slog.Logger
	stream       jetstream.Stream // looked up once, on the first backlog
	failing      slog.Level       // level of the logged failure, while one lasts
	failed       bool
}

// NewLagMonitor returns a monitor on nc; Run starts it.
func NewLagMonitor(nc *nats.Conn, cfg LagMonitorConfig, log *slog.Logger) (*LagMonitor, error) {
	if nc == nil || log == nil {
		return nil, errors.New("audit: lag monitor needs a NATS connection and a logger")
	}
	if cfg.Durable == "" {
		cfg.Durable = wire.ConsumerAuditWriter
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Second
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("audit lag monitor: %w", err)
	}
	m := &LagMonitor{js: js, cfg: cfg, log: log}
	if m.backlog, err = telemetry.NewAuditBacklog(cfg.Registerer); err != nil {
		return nil, err
	}
	if m.lag, err = telemetry.NewAuditLag(cfg.Registerer); err != nil {
		return nil, err
	}
	return m, nil
}

// Run samples at once and then every Interval until ctx is done; it
// returns nil. While the stream or the consumer cannot be read the gauges
// keep their last values; one log line says so when that starts and one
// when it ends.
func (m *LagMonitor) Run(ctx context.Context) error {
	telemetry.Poll(ctx, m.cfg.Interval, func() { m.sample(ctx) })
	return nil
}

// sample measures once and sets the gauges (the backlog first, so that a
// reader who sees a new lag sees its backlog too).
func (m *LagMonitor) sample(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, lagSampleTimeout)
	defer cancel()
	events, oldest, err := m.measure(sctx)
	if err != nil {
		if ctx.Err() == nil {
			m.reportFailure(err)
		}
		return
	}
	if m.failed {
		m.failed = false
		m.log.Log(ctx, m.failing, "audit lag monitor: backlog readable again")
	}
	lag := 0.0
	if events > 0 {
		lag = max(time.Since(oldest).Seconds(), 0) // a clock behind the server's reads 0
	}
	m.backlog.Set(float64(events))
	m.lag.Set(lag)
}

// measure returns the consumer's pending events and the stream time of
// the oldest not yet acknowledged.
func (m *LagMonitor) measure(ctx context.Context) (events uint64, oldest time.Time, err error) {
	cons, err := m.js.Consumer(ctx, wire.StreamAudit, m.cfg.Durable)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("consumer %s of stream %s: %w", m.cfg.Durable, wire.StreamAudit, err)
	}
	info := cons.CachedInfo() // fresh: Consumer just fetched it
	events = info.NumPending + uint64(info.NumAckPending)
	if events == 0 {
		return 0, time.Time{}, nil
	}
	if m.stream == nil {
		if m.stream, err = m.js.Stream(ctx, wire.StreamAudit); err != nil {
			return 0, time.Time{}, fmt.Errorf("stream %s: %w", wire.StreamAudit, err)
		}
	}
	// Everything up to the ack floor is acknowledged; the first event
	// after it is the oldest still waiting.
	msg, err := m.stream.GetMsg(ctx, info.AckFloor.Stream+1, jetstream.WithGetMsgSubject(wire.SubjectAuditAll))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, time.Time{}, nil // acknowledged (and removed) since the consumer answered
	}
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("oldest pending event of stream %s: %w", wire.StreamAudit, err)
	}
	return events, msg.Time, nil
}

// reportFailure logs the first failure of an outage: at debug level when
// the stream or consumer does not exist yet (no writer has started), else
// as a warning.
func (m *LagMonitor) reportFailure(err error) {
	if m.failed {
		return
	}
	m.failed, m.failing = true, slog.LevelWarn
	if errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound) {
		m.failing = slog.LevelDebug
	}
	m.log.Log(context.Background(), m.failing, "audit lag monitor: cannot read the backlog; the gauges keep their last values", "err", err)
}
