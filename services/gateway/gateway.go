// Package gateway is the xiaoclaw gateway: an OpenClaw-compatible WebSocket
// gateway (protocol v3 and v4) for operators and stock OpenClaw node hosts.
//
// Operators authenticate with a tenant's token, list and describe the
// tenant's nodes from an in-memory copy of the node registry, and call
// node.invoke, which the gateway checks (declared command, policy), dedupes
// by idempotency key and forwards over NATS: to the shim for XiaoZhi
// devices, or to the gateway replica that holds an OpenClaw node host. Node
// events from NATS fan out to the tenant's operators. The gateway keeps no
// state of its own beyond open sockets, so any number of replicas can serve
// the same tenants.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/authguard"
	"github.com/xiaoclaw/xiaoclaw/pkg/gopool"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/idempotency"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/protocol"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/registry"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/mcpserver"
)

// Default limits (Config).
const (
	DefaultMaxPayload        = 1 << 20
	DefaultMaxInvokeParams   = 128 << 10
	DefaultMaxConnsPerToken  = 64
	DefaultMaxConnsPerTenant = 512
	// DefaultMaxInflightPerConn caps the requests in flight per connection.
	DefaultMaxInflightPerConn = 1024
)

// Config configures a gateway. Zero values take the documented defaults.
type Config struct {
	// Addr is the listen address of the WebSocket endpoint ("/") and of
	// /healthz, /readyz and the admin API. Default 127.0.0.1:18789.
	Addr string
	// Instance names this replica in the node registry (owner of the node
	// hosts it holds) and in logs; keep it stable across restarts.
	// Default: a random name.
	Instance string
	// Version is hello-ok's server.version. Default "xiaoclaw".
	Version string

	// Auth resolves operator tokens (also used by node hosts). Required.
	Auth access.Authenticator
	// Authorizer decides each node.invoke and each listed tool.
	// Default access.AllowAll.
	Authorizer access.Authorizer
	// Auditor is told about every node.invoke. Default: none.
	Auditor Auditor
	// Limits, when set, tells each tenant's in-flight limits, which the
	// shim enforces (tenancy.OperatorAuth). Default: none, the shim's
	// defaults apply to every tenant.
	Limits InflightLimiter
	// ConnectAuditor, when set, is told about every accepted and refused
	// connect (operators and node hosts). Default: none.
	ConnectAuditor ConnectAuditor
	// AdminAPI, when set, is served under /api/ on Addr.
	AdminAPI http.Handler
	// Console, when set, is served under /ui/ on Addr (the operator
	// console, package console).
	Console http.Handler
	// Ops, when set, serves /healthz, /readyz, /metrics and /debug/loglevel
	// on Addr in place of the gateway's own /healthz and /readyz
	// (ops.Server.Handler; `xiaoclaw dev` mounts the ops endpoints
	// of all its services there).
	Ops http.Handler
	// TracerProvider traces node.invoke (telemetry.NewTracerProvider); nil
	// means no tracing.
	TracerProvider trace.TracerProvider
	// Registerer receives the gateway's metrics; nil keeps them in a
	// private registry nobody scrapes.
	Registerer prometheus.Registerer
	// OriginPatterns lists the browser origins allowed besides the
	// gateway's own host (see websocket.AcceptOptions.OriginPatterns).
	OriginPatterns []string

	// HandshakeTimeout closes a socket that has not completed connect.
	// Default 15 s.
	HandshakeTimeout time.Duration
	// TickInterval is how often tick events are sent (advertised as
	// policy.tickIntervalMs). Default 30 s.
	TickInterval time.Duration
	// MaxPayload caps a frame after hello, advertised as policy.maxPayload;
	// a larger frame closes the socket with 1009 "payload too large: …".
	// Default 1 MiB (OpenClaw's 25 MiB let any viewer make the gateway
	// buffer that much per connection).
	MaxPayload int64
	// MaxInvokeParams caps node.invoke params (a tool call's name and
	// arguments) in bytes; a larger call is refused with INVALID_REQUEST,
	// details.code PAYLOAD_TOO_LARGE. Default 128 KiB, the shim's and the
	// devicehub's limit too.
	MaxInvokeParams int
	// MaxConnsPerToken and MaxConnsPerTenant cap the connections (operators
	// and node hosts) open on this replica with one token and for one
	// tenant; connect beyond them is refused with UNAVAILABLE, details.code
	// TOO_MANY_CONNECTIONS, and close 1008. Default 64 and 512.
	MaxConnsPerToken  int
	MaxConnsPerTenant int
	// MaxBufferedBytes closes a connection whose unsent frames exceed it
	// (policy.maxBufferedBytes). Default 50 MiB.
	MaxBufferedBytes int64
	// DefaultInvokeTimeout applies when node.invoke has no timeoutMs.
	// Default 30 s, as in OpenClaw.
	DefaultInvokeTimeout time.Duration
	// MaxInvokeTimeout caps any node.invoke timeout. Default 300 s.
	MaxInvokeTimeout time.Duration
	// MaxInflightPerConn caps the requests a connection has running off
	// its read loop (node.invoke, node.list, node.describe,
	// node.pair.list); more are refused with UNAVAILABLE, and a connection
	// that reaches twice the cap is closed with 1008 "too many requests in
	// flight". Default 1024.
	MaxInflightPerConn int
	// IdempotencyTTL is how long an idempotency key is remembered.
	// Default 5 min. It sets the bucket's TTL.
	IdempotencyTTL time.Duration
	// IdempotencyReplicas is the idempotency bucket's replica count in a
	// NATS cluster (file storage either way). Default 1; use 3 in production.
	IdempotencyReplicas int
	// ShutdownGrace bounds how long Run waits for in-flight invokes before
	// it closes the sockets. Default 5 s.
	ShutdownGrace time.Duration
	// RestartExpected is sent as shutdown.restartExpectedMs (0 omits it).
	RestartExpected time.Duration
	// AuthFailures throttles connects refused before a token was accepted,
	// per source address (default: 10 in a row, then one every 6 s; a
	// throttled connect gets AUTH_RATE_LIMITED with retryAfterMs), and
	// folds them into one ConnectAudit per source and minute.
	AuthFailures authguard.Config
	// TrustedProxies are the reverse proxies (an Ingress) whose
	// X-Forwarded-For names the client: its address is then the one
	// throttled and audited. Default: none, the peer's address counts.
	TrustedProxies []netip.Prefix

	// MCP configures the MCP endpoint /mcp (docs/mcp.md).
	MCP MCPConfig
}

func (c *Config) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	if c.Addr == "" {
		c.Addr = "127.0.0.1:18789"
	}
	if c.Instance == "" {
		c.Instance = "gateway-" + newID()[:8]
	}
	if c.Version == "" {
		c.Version = "xiaoclaw"
	}
	if c.Authorizer == nil {
		c.Authorizer = access.AllowAll{}
	}
	if c.Auditor == nil {
		c.Auditor = NopAuditor{}
	}
	if c.TracerProvider == nil {
		c.TracerProvider = noop.NewTracerProvider()
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	def(&c.HandshakeTimeout, 15*time.Second)
	def(&c.TickInterval, 30*time.Second)
	def(&c.DefaultInvokeTimeout, protocol.DefaultNodeInvokeTimeoutMs*time.Millisecond)
	def(&c.MaxInvokeTimeout, 300*time.Second)
	def(&c.IdempotencyTTL, 5*time.Minute)
	def(&c.ShutdownGrace, 5*time.Second)
	if c.MaxPayload == 0 {
		c.MaxPayload = DefaultMaxPayload
	}
	if c.MaxInvokeParams == 0 {
		c.MaxInvokeParams = DefaultMaxInvokeParams
	}
	if c.MaxConnsPerToken == 0 {
		c.MaxConnsPerToken = DefaultMaxConnsPerToken
	}
	if c.MaxConnsPerTenant == 0 {
		c.MaxConnsPerTenant = DefaultMaxConnsPerTenant
	}
	if c.MaxBufferedBytes == 0 {
		c.MaxBufferedBytes = 50 << 20
	}
	if c.MaxInflightPerConn == 0 {
		c.MaxInflightPerConn = DefaultMaxInflightPerConn
	}
}

// Validate reports a configuration the gateway cannot run with.
func (c Config) Validate() error {
	var errs []error
	if c.Auth == nil {
		errs = append(errs, errors.New("gateway: an operator authenticator (Config.Auth) is required"))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"HandshakeTimeout", c.HandshakeTimeout}, {"TickInterval", c.TickInterval}, {"DefaultInvokeTimeout", c.DefaultInvokeTimeout},
		{"MaxInvokeTimeout", c.MaxInvokeTimeout}, {"IdempotencyTTL", c.IdempotencyTTL}, {"ShutdownGrace", c.ShutdownGrace}, {"RestartExpected", c.RestartExpected}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("%s must not be negative", d.name))
		}
	}
	if c.DefaultInvokeTimeout > c.MaxInvokeTimeout && c.MaxInvokeTimeout > 0 {
		errs = append(errs, errors.New("DefaultInvokeTimeout exceeds MaxInvokeTimeout"))
	}
	if c.MaxPayload < 0 || (c.MaxPayload > 0 && c.MaxPayload < protocol.MaxPreauthPayload) {
		errs = append(errs, fmt.Errorf("MaxPayload must be at least %d bytes", protocol.MaxPreauthPayload))
	}
	if c.MaxBufferedBytes < 0 || c.MaxInflightPerConn < 0 || c.MaxInvokeParams < 0 || c.MaxConnsPerToken < 0 || c.MaxConnsPerTenant < 0 {
		errs = append(errs, errors.New("MaxBufferedBytes, MaxInflightPerConn, MaxInvokeParams, MaxConnsPerToken and MaxConnsPerTenant must not be negative"))
	}
	if c.IdempotencyReplicas < 0 || c.IdempotencyReplicas > 5 {
		errs = append(errs, errors.New("IdempotencyReplicas must be 0-5"))
	}
	if c.IdempotencyTTL > 0 && c.IdempotencyTTL < time.Second {
		errs = append(errs, errors.New("IdempotencyTTL must be at least 1s"))
	}
	return errors.Join(errs...)
}

// Service is a running gateway replica.
type Service struct {
	cfg     Config
	nc      *nats.Conn
	js      jetstream.JetStream
	log     *slog.Logger
	ln      net.Listener
	http    *http.Server
	started time.Time

	reg   *registry.Registry
	links *registry.Links // the nodes' upstream links, for node.list
	idem  *idempotency.Store

	ready    chan struct{}
	runCtx   context.Context // cancelled when Run's shutdown completes
	draining atomic.Bool

	mu        sync.RWMutex
	conns     map[*conn]struct{}
	operators map[string]map[*conn]struct{} // tenant → operator connections after hello
	nodeHosts map[string]*conn              // registry key → the node host held here
	perToken  map[string]int                // open connections after hello by token id
	perTenant map[string]int                // open connections after hello by tenant

	connWG     sync.WaitGroup // open sockets
	inflightWG sync.WaitGroup // node.invoke calls in progress
	workers    *gopool.Pool   // runs node.invoke calls past their checks

	tracer  trace.Tracer
	metrics invokeMetrics
	// authFails throttles and folds unauthenticated connect refusals.
	authFails *authguard.Guard[ConnectAudit]

	mcp *mcpserver.Server // nil when Config.MCP.Disabled
}

// New checks cfg and binds its listen address; Run serves it.
func New(cfg Config, nc *nats.Conn, log *slog.Logger) (*Service, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("gateway config: %w", err)
	}
	if nc == nil {
		return nil, errors.New("gateway: nil NATS connection")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("gateway: jetstream: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("gateway: listen %s: %w", cfg.Addr, err)
	}
	s := &Service{
		cfg:       cfg,
		nc:        nc,
		js:        js,
		log:       log.With("svc", "gateway", "instance", cfg.Instance),
		ln:        ln,
		started:   time.Now(),
		ready:     make(chan struct{}),
		runCtx:    context.Background(),
		conns:     map[*conn]struct{}{},
		operators: map[string]map[*conn]struct{}{},
		nodeHosts: map[string]*conn{},
		perToken:  map[string]int{},
		perTenant: map[string]int{},
		workers:   gopool.New(0),
	}
	if s.cfg.MCP.Groups == nil {
		// The policy's groups, asked of the policy itself: the approval
		// gate below wraps it for decisions only.
		s.cfg.MCP.Groups, _ = cfg.Authorizer.(mcpserver.NodeGroups)
	}
	if tp, ok := cfg.Authorizer.(toolApprovalPolicy); ok {
		s.cfg.Authorizer = approvalGate{next: cfg.Authorizer, tenants: tp, s: s}
	}
	s.tracer = cfg.TracerProvider.Tracer(telemetry.ScopeName)
	s.authFails = authguard.New(cfg.AuthFailures, func(a ConnectAudit, count int) {
		a.Count = count
		s.auditConnect(a)
	})
	if s.metrics, err = newInvokeMetrics(cfg.Registerer); err != nil {
		ln.Close()
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if !cfg.MCP.Disabled {
		if s.mcp, err = s.newMCPServer(); err != nil {
			ln.Close()
			return nil, fmt.Errorf("gateway: %w", err)
		}
	}
	s.http = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	return s, nil
}

// Addr is the address the gateway listens on (the real port when Config.Addr
// asked for port 0).
func (s *Service) Addr() string { return s.ln.Addr().String() }

// URL is the WebSocket URL of the gateway.
func (s *Service) URL() string { return "ws://" + s.Addr() }

// Ready is closed once the gateway serves: the registry is loaded and the
// subscriptions are active.
func (s *Service) Ready() <-chan struct{} { return s.ready }

// CheckReady reports whether the gateway can serve right now: started and
// connected to NATS. main's /readyz and the gateway's own use it.
func (s *Service) CheckReady() error {
	select {
	case <-s.ready:
	default:
		return errors.New("starting")
	}
	if s.draining.Load() {
		return errors.New("shutting down")
	}
	if !s.nc.IsConnected() {
		return errors.New("NATS disconnected")
	}
	return nil
}

// Run serves until ctx is done, then shuts down gracefully: it stops taking
// requests, lets in-flight invokes finish (up to Config.ShutdownGrace),
// sends every client a shutdown event, closes the sockets with 1012 and
// marks its node hosts disconnected. It returns nil after a clean shutdown.
func (s *Service) Run(ctx context.Context) error {
	defer s.ln.Close()
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	s.runCtx = runCtx

	var err error
	if s.reg, err = registry.Open(ctx, s.js, s.log); err != nil {
		return err
	}
	if s.idem, err = idempotency.Open(ctx, s.nc, s.js, idempotency.Options{TTL: s.cfg.IdempotencyTTL, Replicas: s.cfg.IdempotencyReplicas}); err != nil {
		return err
	}
	s.reg.OnChange(s.onRegistryChange)
	if s.mcp != nil {
		s.reg.OnChange(s.mcp.NodeChanged)
		if err := s.shareMCPSessions(ctx, runCtx); err != nil {
			return err
		}
	}
	regErr := make(chan error, 1)
	go func() { regErr <- s.reg.Run(runCtx) }()
	select {
	case <-s.reg.Ready():
	case err := <-regErr:
		return err
	case <-ctx.Done():
		return nil
	}
	s.releaseStaleNodeHosts(ctx)
	s.links = registry.NewLinks(s.js, s.log, 0)
	go func() { _ = s.links.Run(runCtx) }() // never fails; ends with runCtx

	sub, err := s.nc.Subscribe(wire.SubjectNodeEventAll, s.onNodeEvent)
	if err != nil {
		return fmt.Errorf("gateway: subscribe node events: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := s.nc.FlushTimeout(10 * time.Second); err != nil && ctx.Err() == nil {
		return fmt.Errorf("gateway: flush subscriptions: %w", err)
	}

	serveErr := make(chan error, 1)
	go func() { serveErr <- s.http.Serve(s.ln) }()
	go s.tickLoop(runCtx)
	go s.authFails.Run(runCtx)
	close(s.ready)
	s.log.Info("gateway ready", "addr", s.Addr())

	var runErr error
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		if !errors.Is(err, http.ErrServerClosed) {
			runErr = fmt.Errorf("gateway: serve: %w", err)
		}
	case err := <-regErr:
		runErr = err
	}
	s.shutdown()
	return runErr
}

// shutdown drains and closes everything Run started.
func (s *Service) shutdown() {
	s.mu.Lock()
	s.draining.Store(true)
	s.mu.Unlock()
	waitTimeout(&s.inflightWG, s.cfg.ShutdownGrace)

	payload := protocol.Shutdown("gateway stopping", s.cfg.RestartExpected.Milliseconds())
	s.mu.RLock()
	for c := range s.conns {
		if c.helloDone.Load() {
			c.sendEvent(protocol.EventShutdown, payload)
		}
		c.closeWith(protocol.CloseServiceRestart, protocol.ReasonServiceRestart)
	}
	s.mu.RUnlock()

	if s.mcp != nil {
		s.mcp.Close() // their GET streams would hold the HTTP server's shutdown
	}
	hctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = s.http.Shutdown(hctx)
	cancel()
	// Closing handshakes take up to a few seconds; after that, cut.
	if !waitTimeout(&s.connWG, 5*time.Second) {
		s.mu.RLock()
		for c := range s.conns {
			c.ws.CloseNow()
		}
		s.mu.RUnlock()
		waitTimeout(&s.connWG, 2*time.Second)
	}
	s.log.Info("gateway stopped")
}

// waitTimeout waits for wg up to d and reports whether it finished.
func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// Handler serves the WebSocket endpoint, health checks and the admin API.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	if s.cfg.Ops != nil {
		for _, p := range []string{"/healthz", "/readyz", "/metrics", "/debug/loglevel"} {
			mux.Handle(p, s.cfg.Ops)
		}
	} else {
		mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
			_, _ = w.Write([]byte("ok\n"))
		})
		mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
			if err := s.CheckReady(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			_, _ = w.Write([]byte("ready\n"))
		})
	}
	if s.cfg.AdminAPI != nil {
		mux.Handle("/api/", s.cfg.AdminAPI)
	}
	if s.mcp != nil {
		for _, p := range []string{"/mcp", "/mcp/", mcpserver.ProtectedResourcePath} {
			mux.Handle(p, s.mcp.Handler())
		}
	}
	if s.cfg.Console != nil {
		mux.Handle("/ui/", s.cfg.Console)
	}
	mux.HandleFunc("/", s.serveWebSocket)
	return mux
}

// releaseStaleNodeHosts marks disconnected the node hosts a previous run of
// this instance left marked connected (it crashed before it could).
func (s *Service) releaseStaleNodeHosts(ctx context.Context) {
	for _, n := range s.reg.Owned(s.cfg.Instance, wire.NodeKindOpenClaw) {
		if _, err := s.reg.MarkDisconnected(ctx, n.Tenant, n.NodeID, n.SessionID, time.Now()); err != nil {
			s.log.Warn("release stale node host", "tenant", n.Tenant, "node", n.NodeID, "err", err)
		}
	}
}
