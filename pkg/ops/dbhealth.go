package ops

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
)

// DBHealthConfig configures a DBHealth. Zero durations take the defaults.
type DBHealthConfig struct {
	// Ping asks the database to answer, e.g. (*sql.DB).PingContext or
	// (*pgxpool.Pool).Ping.
	Ping func(ctx context.Context) error
	// Interval between two pings of Run. Default 5 s.
	Interval time.Duration
	// Timeout bounds one ping of Run. Default 2 s (the readiness checks'
	// default timeout).
	Timeout time.Duration
}

// DBHealth knows whether a service's database answers. Run pings it on a
// schedule and the "db" readiness check pings it on every /readyz; both
// record the answer, which Connected returns and the xiaoclaw_db_connected
// gauge shows, so /readyz and /metrics agree and a scrape never dials.
type DBHealth struct {
	cfg DBHealthConfig
	log *slog.Logger

	mu    sync.Mutex
	known bool // a ping has answered
	up    bool
}

// NewDBHealth returns a tracker that reports the database unreachable
// until a ping has succeeded. log receives one line when the database
// stops answering and one when it answers again.
func NewDBHealth(cfg DBHealthConfig, log *slog.Logger) (*DBHealth, error) {
	if cfg.Ping == nil {
		return nil, errors.New("ops: database health needs a ping func")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &DBHealth{cfg: cfg, log: log}, nil
}

// Connected reports the answer of the last ping: true when it succeeded.
func (h *DBHealth) Connected() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.up
}

// Register exports Connected as xiaoclaw_db_connected{service}.
func (h *DBHealth) Register(reg prometheus.Registerer, service string) error {
	return telemetry.RegisterDBConnected(reg, service, h.Connected)
}

// Check is the "db" readiness check: it pings now and records the answer.
func (h *DBHealth) Check() Check {
	return Check{Name: "db", Run: h.ping}
}

// Run pings at once and then every Interval until ctx is done; it returns nil.
func (h *DBHealth) Run(ctx context.Context) error {
	telemetry.Poll(ctx, h.cfg.Interval, func() {
		pctx, cancel := context.WithTimeout(ctx, h.cfg.Timeout)
		defer cancel()
		_ = h.ping(pctx)
	})
	return nil
}

// ping pings and records the answer, unless the caller gave up first (a
// closed /readyz request or shutdown says nothing about the database).
func (h *DBHealth) ping(ctx context.Context) error {
	err := h.cfg.Ping(ctx)
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		return err
	}
	h.record(err)
	return err
}

// record stores the answer and logs a change of state.
func (h *DBHealth) record(err error) {
	up := err == nil
	h.mu.Lock()
	changed, first := h.up != up, !h.known
	h.known, h.up = true, up
	h.mu.Unlock()
	switch {
	case !up && (changed || first):
		h.log.Warn("database unreachable", "err", err)
	case up && changed && !first:
		h.log.Info("database reachable again")
	}
}
