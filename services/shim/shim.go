// Package shim is the shim service: stateless workers that give every XiaoZhi
// device behind a devicehub the shape of an OpenClaw node.
//
// Replicas share the work through the NATS queue group wire.QueueShim. They
// keep the node registry (JetStream KV wire.BucketNodes) from the devicehubs'
// lifecycle events, serve node.invoke by translating each command into one
// MCP JSON-RPC request to the device, and turn device notifications and
// presence changes into node events. api/mcp-mapping.md describes the
// commands, results and errors.
package shim

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/xiaoclaw/xiaoclaw/pkg/gopool"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/shim/internal/catalog"
	"github.com/xiaoclaw/xiaoclaw/services/shim/internal/inflight"
	"github.com/xiaoclaw/xiaoclaw/services/shim/internal/nodes"
)

// Config of a shim replica. Zero values take the documented defaults.
type Config struct {
	// Instance names the replica in logs; default "shim".
	Instance string
	// DefaultTimeout is the deadline of an invoke that carries no
	// Xc-Timeout-Ms header; default 15 s (OpenClaw's CLI default).
	DefaultTimeout time.Duration
	// MaxTimeout caps every invoke's deadline; default 300 s.
	MaxTimeout time.Duration
	// DrainTimeout bounds how long Run waits, at shutdown, for invokes in
	// flight; default 30 s.
	DrainTimeout time.Duration
	// MaxInFlight bounds the invokes one replica runs at once; beyond it a
	// call fails with BUSY. Default 10000.
	MaxInFlight int
	// TenantMaxInFlight is a tenant's default share of the replica: the
	// invokes of one tenant it runs at once; beyond it the tenant's calls
	// fail with RATE_LIMITED while other tenants' calls go on. A tenant
	// record's limit (header wire.HeaderInflightLimits) replaces it.
	// Default a tenth of MaxInFlight (1000).
	TenantMaxInFlight int
	// DeviceMaxInFlight is a tenant's default share per device: the invokes
	// to one device the replica runs at once; beyond it calls to that
	// device fail with BUSY. A tenant record's limit replaces it. Default 32.
	DeviceMaxInFlight int
	// RetryAfter is the retry hint (retryAfterMs) of a call refused by a
	// limit. Default 1 s.
	RetryAfter time.Duration
	// MaxRequestBytes bounds a node.invoke request; a larger one fails with
	// PAYLOAD_TOO_LARGE. Default 128 KiB.
	MaxRequestBytes int
	// EventWorkers is how many device events are written to the registry in
	// parallel (one device's events always go to the same worker, in order);
	// default 8.
	EventWorkers int
	// HubTimeout is how long a devicehub may miss its heartbeats before the
	// nodes it holds are marked disconnected (see DefaultHubTimeout);
	// negative turns the check off (hubs that send no heartbeats).
	HubTimeout time.Duration

	// TracerProvider traces invokes (telemetry.NewTracerProvider); nil
	// means no tracing.
	TracerProvider trace.TracerProvider
	// Registerer receives the shim's metrics; nil keeps them in a private
	// registry nobody scrapes.
	Registerer prometheus.Registerer
}

func (c *Config) setDefaults() {
	if c.Instance == "" {
		c.Instance = "shim"
	}
	if c.DefaultTimeout == 0 {
		c.DefaultTimeout = 15 * time.Second
	}
	if c.MaxTimeout == 0 {
		c.MaxTimeout = 300 * time.Second
	}
	if c.DrainTimeout == 0 {
		c.DrainTimeout = 30 * time.Second
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = 10000
	}
	if c.TenantMaxInFlight == 0 {
		c.TenantMaxInFlight = max(1, c.MaxInFlight/10)
	}
	if c.DeviceMaxInFlight == 0 {
		c.DeviceMaxInFlight = 32
	}
	if c.RetryAfter == 0 {
		c.RetryAfter = time.Second
	}
	if c.MaxRequestBytes == 0 {
		c.MaxRequestBytes = 128 << 10
	}
	if c.EventWorkers == 0 {
		c.EventWorkers = 8
	}
	if c.HubTimeout == 0 {
		c.HubTimeout = DefaultHubTimeout
	}
	if c.TracerProvider == nil {
		c.TracerProvider = noop.NewTracerProvider()
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
}

// Validate reports a configuration the service cannot run with.
func (c Config) Validate() error {
	c.setDefaults()
	var errs []error
	if c.DefaultTimeout < 0 || c.MaxTimeout < 0 || c.DrainTimeout < 0 {
		errs = append(errs, errors.New("timeouts must not be negative"))
	}
	if c.DefaultTimeout > c.MaxTimeout {
		errs = append(errs, fmt.Errorf("default timeout %s exceeds the max timeout %s", c.DefaultTimeout, c.MaxTimeout))
	}
	if c.MaxInFlight < 0 || c.MaxRequestBytes < 0 || c.EventWorkers < 0 || c.TenantMaxInFlight < 0 || c.DeviceMaxInFlight < 0 || c.RetryAfter < 0 {
		errs = append(errs, errors.New("limits must not be negative"))
	}
	if c.TenantMaxInFlight > wire.MaxInflightLimit || c.DeviceMaxInFlight > wire.MaxInflightLimit {
		errs = append(errs, fmt.Errorf("per-tenant and per-device limits must be at most %d", wire.MaxInflightLimit))
	}
	return errors.Join(errs...)
}

// Service is one shim replica.
type Service struct {
	cfg     Config
	nc      *nats.Conn
	log     *slog.Logger
	ready   chan struct{}
	schemas *catalog.Schemas

	reg *nodes.Registry // set by Run before ready closes

	sem      chan struct{} // one slot per invoke in flight
	tenants  inflight.Table
	inflight sync.WaitGroup
	workers  *gopool.Pool // runs the invokes

	events     []chan nodes.Pending
	eventsDone chan struct{} // closed when event workers must finish

	tracer     trace.Tracer
	invokes    *prometheus.CounterVec
	refused    *prometheus.CounterVec
	hopShimHub prometheus.Observer
}

// New returns a replica; it does no I/O until Run.
func New(cfg Config, nc *nats.Conn, log *slog.Logger) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("shim: %w", err)
	}
	if nc == nil {
		return nil, errors.New("shim: a NATS connection is required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	cfg.setDefaults()
	s := &Service{
		cfg:        cfg,
		nc:         nc,
		log:        log.With("service", "shim", "instance", cfg.Instance),
		ready:      make(chan struct{}),
		schemas:    catalog.NewSchemas(0),
		sem:        make(chan struct{}, cfg.MaxInFlight),
		workers:    gopool.New(0),
		eventsDone: make(chan struct{}),
	}
	s.tracer = cfg.TracerProvider.Tracer(telemetry.ScopeName)
	var err error
	if s.invokes, err = telemetry.NewInvokes(cfg.Registerer); err != nil {
		return nil, fmt.Errorf("shim: %w", err)
	}
	if s.refused, err = telemetry.NewInvokesRefused(cfg.Registerer); err != nil {
		return nil, fmt.Errorf("shim: %w", err)
	}
	hops, err := telemetry.NewHopDuration(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("shim: %w", err)
	}
	s.hopShimHub = hops.WithLabelValues(telemetry.HopShimDevicehub)
	s.events = make([]chan nodes.Pending, cfg.EventWorkers)
	for i := range s.events {
		s.events[i] = make(chan nodes.Pending, 1024)
	}
	return s, nil
}

// Ready is closed once the registry cache is loaded, both subscriptions are
// live and the hubs were asked to re-announce their sessions.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// Run serves until ctx is done, then drains: it stops taking invokes and
// events (the queue group routes new ones to other replicas), lets the
// invokes in flight finish within DrainTimeout, and returns nil.
func (s *Service) Run(ctx context.Context) error {
	reg, err := nodes.Open(ctx, s.nc, s.log, s.schemas, nodes.Options{Resubmit: s.enqueue})
	if err != nil {
		return fmt.Errorf("shim: %w", err)
	}
	s.reg = reg

	watchCtx, stopWatch := context.WithCancel(context.Background())
	loaded := make(chan struct{})
	watching := make(chan struct{})
	go func() {
		defer close(watching)
		s.watch(watchCtx, loaded)
	}()
	defer func() {
		stopWatch()
		<-watching
	}()
	select {
	case <-loaded:
	case <-ctx.Done():
		return nil
	}

	var workers sync.WaitGroup
	for _, ch := range s.events {
		workers.Go(func() { s.eventWorker(ch) })
	}
	defer func() {
		close(s.eventsDone)
		workers.Wait()
	}()

	stateSub, err := s.nc.QueueSubscribe(wire.SubjectDeviceStateAll, wire.QueueShim, s.onState)
	if err != nil {
		return fmt.Errorf("shim: subscribe %s: %w", wire.SubjectDeviceStateAll, err)
	}
	_ = stateSub.SetPendingLimits(statePendingMsgs, statePendingBytes)
	notifySub, err := s.nc.QueueSubscribe(wire.SubjectDeviceNotifyAll, wire.QueueShim, s.onNotify)
	if err != nil {
		_ = stateSub.Unsubscribe()
		return fmt.Errorf("shim: subscribe %s: %w", wire.SubjectDeviceNotifyAll, err)
	}
	_ = notifySub.SetPendingLimits(notifyPendingMsgs, notifyPendingBytes)
	invokeSub, err := s.nc.QueueSubscribe(wire.SubjectNodeInvokeAll, wire.QueueShim, s.onInvoke)
	if err != nil {
		_ = stateSub.Unsubscribe()
		_ = notifySub.Unsubscribe()
		return fmt.Errorf("shim: subscribe %s: %w", wire.SubjectNodeInvokeAll, err)
	}
	// Ask every hub to re-announce its sessions: records written while no
	// shim ran (or lost) are rebuilt.
	if err := s.nc.Publish(wire.SubjectHubResync, nil); err != nil {
		s.log.Warn("could not ask hubs to resync", "err", err)
	}
	if err := s.nc.Flush(); err != nil {
		s.log.Warn("flush after subscribe", "err", err)
	}
	hw, err := s.startHubWatch(stateSub)
	if err != nil {
		return fmt.Errorf("shim: subscribe %s: %w", wire.SubjectHubHeartbeat, err)
	}
	hwCtx, stopHW := context.WithCancel(ctx)
	hwDone := make(chan struct{})
	go func() { defer close(hwDone); hw.run(hwCtx) }()
	defer func() { stopHW(); <-hwDone }()
	close(s.ready)
	s.log.Info("shim ready", "nodes", reg.Len())

	sweep := time.NewTicker(5 * time.Second)
	defer sweep.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-sweep.C:
			reg.Sweep()
		}
	}

	s.log.Info("shim draining")
	budget := time.NewTimer(s.cfg.DrainTimeout)
	defer budget.Stop()
	drainSub(invokeSub, budget.C)
	drainSub(stateSub, budget.C)
	drainSub(notifySub, budget.C)
	done := make(chan struct{})
	go func() { s.inflight.Wait(); close(done) }()
	select {
	case <-done:
		s.log.Info("shim drained")
	case <-budget.C:
		s.log.Warn("shim stopped with invokes still in flight", "in_flight", len(s.sem))
	}
	return nil
}

// watch keeps the registry cache fed until ctx is done, starting the KV
// watcher again if it fails. loaded is closed after the first full load.
func (s *Service) watch(ctx context.Context, loaded chan struct{}) {
	var once sync.Once
	for {
		first := make(chan struct{})
		go func() {
			select {
			case <-first:
				once.Do(func() { close(loaded) })
			case <-ctx.Done():
			}
		}()
		err := s.reg.Watch(ctx, first)
		if ctx.Err() != nil {
			return
		}
		s.log.Warn("node registry watcher stopped; starting again", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// drainSub unsubscribes and waits until the messages already delivered to
// the subscription have been handed to their handlers.
func drainSub(sub *nats.Subscription, budget <-chan time.Time) {
	closed := sub.StatusChanged(nats.SubscriptionClosed)
	if err := sub.Drain(); err != nil {
		return
	}
	select {
	case <-closed:
	case <-budget:
	}
}

// enqueue hands a device event to the worker owning its device.
func (s *Service) enqueue(p nodes.Pending) {
	h := fnv.New32a()
	_, _ = h.Write([]byte(p.Event.Tenant))
	_, _ = h.Write([]byte(p.Event.Device))
	ch := s.events[int(h.Sum32()%uint32(len(s.events)))]
	select {
	case ch <- p:
	case <-s.eventsDone:
	}
}

func (s *Service) eventWorker(ch chan nodes.Pending) {
	for {
		select {
		case p := <-ch:
			s.applyEvent(p)
		case <-s.eventsDone:
			for {
				select {
				case p := <-ch:
					s.applyEvent(p)
				default:
					return
				}
			}
		}
	}
}

// registryTimeout bounds one registry update; it does not follow the
// service's context so that shutdown does not cut a write in half.
const registryTimeout = 5 * time.Second

func (s *Service) applyEvent(p nodes.Pending) {
	ctx, cancel := context.WithTimeout(context.Background(), registryTimeout)
	defer cancel()
	ev := p.Event
	out, err := s.reg.ApplyEvent(ctx, p)
	if err != nil {
		s.log.Warn("device event not applied", "kind", ev.Kind, "tenant", ev.Tenant, "device", ev.Device, "session", ev.SessionID, "err", err)
		return
	}
	s.log.Debug("device event", "kind", ev.Kind, "tenant", ev.Tenant, "device", ev.Device, "session", ev.SessionID, "outcome", out.String())
}
