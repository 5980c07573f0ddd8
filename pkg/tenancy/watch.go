package tenancy

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// flushTimeout bounds waiting for the NATS server to confirm a publish or
// a subscription.
const flushTimeout = 5 * time.Second

// NATSNotifier returns a ManagerConfig.Notify that publishes each change on
// wire.SubjectTenancyChanged and flushes, so that the change is on the
// server before the admin call answers.
func NATSNotifier(nc *nats.Conn) func(context.Context, wire.TenancyChange) error {
	return func(ctx context.Context, c wire.TenancyChange) error {
		b, err := json.Marshal(c)
		if err != nil {
			return err
		}
		if err := nc.Publish(wire.SubjectTenancyChanged, b); err != nil {
			return err
		}
		fctx, cancel := context.WithTimeout(ctx, flushTimeout) // nats needs a deadline
		defer cancel()
		return nc.FlushWithContext(fctx)
	}
}

// ChangeHandler is told about tenancy changes. Handlers run one at a time,
// in the order they were given to the Watcher, and must not block long.
type ChangeHandler interface {
	TenancyChanged(wire.TenancyChange)
}

// ChangeFunc adapts a function to ChangeHandler (e.g. the gateway's
// re-check of live connections, registered after the caches).
type ChangeFunc func(wire.TenancyChange)

// TenancyChanged calls f.
func (f ChangeFunc) TenancyChanged(c wire.TenancyChange) { f(c) }

// WatcherConfig configures a Watcher.
type WatcherConfig struct {
	// Store is polled for tenant versions every ResyncInterval, to catch
	// changes whose notification was lost (e.g. while NATS was down). Nil
	// disables polling.
	Store Store
	// ResyncInterval defaults to 10 s.
	ResyncInterval time.Duration
}

// Watcher delivers tenancy changes to handlers: the notifications on
// wire.SubjectTenancyChanged, plus a wire.ChangeResync for every tenant
// whose version moved without one.
type Watcher struct {
	nc       *nats.Conn
	cfg      WatcherConfig
	log      *slog.Logger
	handlers []ChangeHandler
	ready    chan struct{}

	mu       sync.Mutex // serialises handler calls
	versions map[string]int64
}

// NewWatcher returns a Watcher; call Run.
func NewWatcher(nc *nats.Conn, cfg WatcherConfig, log *slog.Logger, handlers ...ChangeHandler) *Watcher {
	if cfg.ResyncInterval <= 0 {
		cfg.ResyncInterval = 10 * time.Second
	}
	return &Watcher{nc: nc, cfg: cfg, log: log, handlers: handlers, ready: make(chan struct{})}
}

// Ready is closed once the Watcher is subscribed.
func (w *Watcher) Ready() <-chan struct{} { return w.ready }

// Run subscribes and polls until ctx is done, then unsubscribes and
// returns nil.
func (w *Watcher) Run(ctx context.Context) error {
	sub, err := w.nc.Subscribe(wire.SubjectTenancyChanged, func(m *nats.Msg) {
		var c wire.TenancyChange
		if err := json.Unmarshal(m.Data, &c); err != nil || wire.ValidTenant(c.Tenant) != nil {
			w.log.Warn("malformed tenancy change ignored", "err", err, "data", string(m.Data))
			return
		}
		w.dispatch(c)
	})
	if err != nil {
		return fmt.Errorf("tenancy: subscribe %s: %w", wire.SubjectTenancyChanged, err)
	}
	fctx, cancel := context.WithTimeout(ctx, flushTimeout)
	err = w.nc.FlushWithContext(fctx)
	cancel()
	if err != nil && ctx.Err() == nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("tenancy: subscribe %s: %w", wire.SubjectTenancyChanged, err)
	}
	close(w.ready)
	defer func() { _ = sub.Unsubscribe() }()
	if w.cfg.Store == nil {
		<-ctx.Done()
		return nil
	}
	w.resync(ctx, true)
	tick := time.NewTicker(w.cfg.ResyncInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			w.resync(ctx, false)
		}
	}
}

func (w *Watcher) dispatch(c wire.TenancyChange) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, h := range w.handlers {
		h.TenancyChanged(c)
	}
}

// resync compares tenant versions with the last poll and announces a
// resync for each tenant that changed. The first poll only records.
func (w *Watcher) resync(ctx context.Context, first bool) {
	v, err := w.cfg.Store.TenantVersions(ctx)
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn("tenancy resync failed", "err", err)
		}
		return
	}
	prev := w.versions
	w.versions = v
	if first {
		return
	}
	for id, ver := range v {
		if prev[id] != ver {
			w.dispatch(wire.TenancyChange{Tenant: id, Kind: wire.ChangeResync})
		}
	}
}
