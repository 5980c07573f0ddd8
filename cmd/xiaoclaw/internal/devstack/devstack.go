// Package devstack runs the whole xiaoclaw system in one process: an
// embedded NATS server with JetStream (or an external NATS), devicehub, shim
// and gateway replicas, each on its own NATS connection exactly as separate
// processes would be. `xiaoclaw dev` runs one of each; the end-to-end tests
// and benchmarks run several replicas and stop single ones.
package devstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/xiaoclaw/xiaoclaw/pkg/activation"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed"
	"github.com/xiaoclaw/xiaoclaw/pkg/ops"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/services/devicehub"
	"github.com/xiaoclaw/xiaoclaw/services/gateway"
	"github.com/xiaoclaw/xiaoclaw/services/shim"
	"github.com/xiaoclaw/xiaoclaw/services/shim/upstream"
)

// DevTenant is the tenant seeded by the development system.
const DevTenant = "dev"

// Config of a stack. Zero values give `xiaoclaw dev` defaults except for
// addresses, which default to random loopback ports (tests).
type Config struct {
	// DataDir holds the embedded NATS JetStream store. Required with embedded NATS.
	DataDir string
	// NATSURL, when set, uses that NATS server instead of an embedded one.
	NATSURL string
	// NATSListen, when set, makes the embedded server listen there
	// ("127.0.0.1:4223"; port 0: a free port) for processes outside this
	// one, and every client, the in-process services included, must then
	// present user NATSUser with NATSPassword. Empty: no listener at all;
	// the services connect in-process, so nothing outside the process can
	// reach the bus.
	NATSListen string
	// NATSPassword is required with NATSListen; the dev command generates
	// it once and keeps it in the data directory.
	NATSPassword string
	// NATSUsers, when set, are the embedded server's users with their
	// subject permissions, and NATSOptions gives each component (by name:
	// "hub-1", "shim-1", "gateway-1", "audit-writer", "tenancy", …) the
	// options it connects with: tests run the system under production
	// permissions this way.
	NATSUsers   []*server.User
	NATSOptions func(component string) []nats.Option

	DeviceAddr string // first hub; further hubs get random ports
	// MQTTAddr runs the first hub's MQTT broker there ("host:0": a free
	// port); empty: no MQTT. Further hubs get a free port when it is set.
	MQTTAddr string
	// AutoActivate binds every new device that boots through OTA to the dev
	// tenant; when false an operator binds its activation code.
	AutoActivate bool
	GatewayAddr  string // first gateway; further gateways get random ports

	// DeviceToken and OperatorToken are the dev tenant's static credentials;
	// AdminToken, when set, is the admin API's global admin token.
	DeviceToken   string
	OperatorToken string
	AdminToken    string
	// DatabaseURL selects Postgres for tenants, credentials and policies;
	// empty keeps them in SQLite in DataDir.
	DatabaseURL string

	Hubs, Shims, Gateways int // replicas; default 1 each

	// One tracer provider per service, so every span says which service it
	// comes from (telemetry.NewTracerProvider with SharedProcess); nil: no
	// tracing for that service.
	GatewayTracerProvider, ShimTracerProvider, HubTracerProvider trace.TracerProvider
	// Registerer receives the metrics of every replica (they tell
	// themselves apart by the service label), the database gauge and the
	// audit backlog and lag; nil: each replica keeps its own private
	// registry and the stack exports neither gauge.
	Registerer prometheus.Registerer
	// Ops, when set, is mounted by every gateway on its HTTP port for
	// /healthz, /readyz, /metrics and /debug/loglevel.
	Ops http.Handler
	// Console, when set, is served by every gateway under /ui/
	// (services/gateway/console).
	Console http.Handler

	// Upstream, when its URL is set, publishes every device of the dev
	// tenant as a node on that OpenClaw gateway (services/shim/upstream):
	// one upstream worker beside each shim replica.
	Upstream upstream.Upstream

	// Tune lets tests and benchmarks adjust each service's config.
	TuneHub      func(*devicehub.Config)
	TuneShim     func(*shim.Config)
	TuneGateway  func(*gateway.Config)
	TuneUpstream func(*upstream.Config)

	Log *slog.Logger
}

// Component is one running service replica.
type Component struct {
	Name   string
	cancel context.CancelFunc
	done   chan struct{}
	err    error
	nc     *nats.Conn
	ready  <-chan struct{}
}

// NATS is the replica's own NATS connection.
func (c *Component) NATS() *nats.Conn { return c.nc }

// Ready is closed once the replica serves.
func (c *Component) Ready() <-chan struct{} { return c.ready }

// Stop stops the replica gracefully and waits for it.
func (c *Component) Stop() error {
	c.cancel()
	<-c.done
	c.nc.Close()
	return c.err
}

// Done is closed when the replica has stopped.
func (c *Component) Done() <-chan struct{} { return c.done }

// Stack is a running system.
type Stack struct {
	cfg      Config
	nats     *natsembed.Server
	natsURL  string
	Hubs     []*devicehub.Service
	Shims    []*shim.Service
	Gateways []*gateway.Service
	// Upstreams are the upstream workers, one per shim replica: they run
	// the stored upstreams and Config.Upstream.
	Upstreams []*upstream.Service
	// upstreamToken authenticates the upstream workers to the gateway as
	// the principal upstream:<name>.
	upstreamToken string
	// Tenancy is the gateway backend (tenants, credentials, policies and
	// the audit trail) shared by all replicas (each gateway opens its own in
	// production); the audit writer and collector run as components.
	Tenancy *Tenancy
	// Activations are the devices' activation codes, shared by the hubs.
	Activations activation.Store
	// DB knows whether the tenancy store's database answers: the "db"
	// readiness check and, with a Registerer, xiaoclaw_db_connected of the
	// gateway and the devicehub, which share that store here.
	DB    *ops.DBHealth
	tenNC *nats.Conn
	// background runs what is no replica (the database pings, the stored
	// upstreams' bucket sync of the shared backend) until Close.
	background     sync.WaitGroup
	stopBackground context.CancelFunc
	// Components in start order; Close stops them in reverse.
	Components []*Component
	mu         sync.Mutex
	ctx        context.Context
}

// Start builds and starts the stack and waits until every replica is ready.
func Start(ctx context.Context, cfg Config) (*Stack, error) {
	if cfg.Hubs == 0 {
		cfg.Hubs = 1
	}
	if cfg.Shims == 0 {
		cfg.Shims = 1
	}
	if cfg.Gateways == 0 {
		cfg.Gateways = 1
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.DeviceToken == "" || cfg.OperatorToken == "" {
		return nil, errors.New("devstack: DeviceToken and OperatorToken are required")
	}
	s := &Stack{cfg: cfg, ctx: ctx}
	if cfg.Upstream.URL != "" {
		if cfg.Upstream.Name == "" {
			cfg.Upstream.Name = DefaultUpstreamName
		}
		cfg.Upstream.Tenant = DevTenant
		if err := cfg.Upstream.Validate(); err != nil {
			return nil, fmt.Errorf("devstack: %w", err)
		}
		s.cfg = cfg
		s.upstreamToken = "devupstream_" + randomSecret()
	}
	if cfg.NATSURL != "" {
		s.natsURL = cfg.NATSURL
	} else {
		if cfg.DataDir == "" {
			return nil, errors.New("devstack: DataDir is required with embedded NATS")
		}
		ncfg := natsembed.Config{StoreDir: filepath.Join(cfg.DataDir, "nats"), Port: -1, Users: cfg.NATSUsers}
		if cfg.NATSListen != "" {
			host, port, err := splitHostPort(cfg.NATSListen)
			if err != nil {
				return nil, fmt.Errorf("devstack: NATS listen address: %w", err)
			}
			if cfg.NATSPassword == "" {
				return nil, errors.New("devstack: a NATS listener requires NATSPassword")
			}
			ncfg.Host, ncfg.Port = host, port
			ncfg.User, ncfg.Password = NATSUser, cfg.NATSPassword
		}
		if err := os.MkdirAll(ncfg.StoreDir, 0o755); err != nil {
			return nil, err
		}
		ns, err := natsembed.Start(ncfg)
		if err != nil {
			return nil, err
		}
		s.nats, s.natsURL = ns, ns.ClientURL()
	}
	if cfg.DataDir == "" && cfg.DatabaseURL == "" {
		s.Close()
		return nil, errors.New("devstack: DataDir or DatabaseURL is required for the tenancy store")
	}
	tnc, err := s.connect("tenancy")
	if err != nil {
		s.Close()
		return nil, err
	}
	s.tenNC = tnc
	js, err := jetstream.New(tnc)
	if err != nil {
		s.Close()
		return nil, err
	}
	if s.Activations, err = activation.NewKV(ctx, js, activation.Config{}); err != nil {
		s.Close()
		return nil, fmt.Errorf("activations: %w", err)
	}
	if s.Tenancy, err = openTenancy(ctx, s.cfg, s.upstreamToken, tnc, s.Activations, cfg.Log); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.watchDatabase(); err != nil {
		s.Close()
		return nil, err
	}
	if err := s.startAuditWorkers(); err != nil {
		s.Close()
		return nil, err
	}
	// Shims first so they see the hubs' first online events; gateways last.
	for i := range cfg.Shims {
		if _, err := s.AddShim(fmt.Sprintf("shim-%d", i+1)); err != nil {
			s.Close()
			return nil, err
		}
	}
	for i := range cfg.Hubs {
		addr, mqtt := "127.0.0.1:0", ""
		if i == 0 && cfg.DeviceAddr != "" {
			addr = cfg.DeviceAddr
		}
		if cfg.MQTTAddr != "" {
			mqtt = "127.0.0.1:0"
			if i == 0 {
				mqtt = cfg.MQTTAddr
			}
		}
		if _, err := s.AddHub(fmt.Sprintf("hub-%d", i+1), addr, mqtt); err != nil {
			s.Close()
			return nil, err
		}
	}
	for i := range cfg.Gateways {
		addr := "127.0.0.1:0"
		if i == 0 && cfg.GatewayAddr != "" {
			addr = cfg.GatewayAddr
		}
		if _, err := s.AddGateway(fmt.Sprintf("gateway-%d", i+1), addr); err != nil {
			s.Close()
			return nil, err
		}
	}
	for i := range cfg.Shims {
		if _, err := s.AddUpstream(fmt.Sprintf("upstream-%d", i+1)); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

func (s *Stack) connect(name string) (*nats.Conn, error) {
	opts := []nats.Option{s.errorHandler(name)}
	if s.cfg.NATSOptions != nil {
		opts = append(opts, s.cfg.NATSOptions(name)...)
	}
	if s.nats != nil {
		return s.nats.Connect(name, opts...)
	}
	return nats.Connect(s.natsURL, append([]nats.Option{nats.Name(name), nats.MaxReconnects(-1)}, opts...)...)
}

// NATSUser is the user clients of a listening embedded NATS present.
const NATSUser = "xiaoclaw"

// NATSURL is the URL of the stack's NATS server: the external one, or the
// embedded one's listener ("" when it listens nowhere). It carries no
// credentials.
func (s *Stack) NATSURL() string { return s.natsURL }

// Connect opens a NATS connection to the stack's server (for tests).
func (s *Stack) Connect(name string) (*nats.Conn, error) { return s.connect(name) }

type runner interface {
	Run(context.Context) error
	Ready() <-chan struct{}
}

// start runs svc until its component is stopped and waits for readiness.
func (s *Stack) start(name string, nc *nats.Conn, svc runner) (*Component, error) {
	ctx, cancel := context.WithCancel(s.ctx)
	c := &Component{Name: name, cancel: cancel, done: make(chan struct{}), nc: nc, ready: svc.Ready()}
	go func() {
		defer close(c.done)
		c.err = svc.Run(ctx)
	}()
	select {
	case <-svc.Ready():
	case <-c.done:
		nc.Close()
		return nil, fmt.Errorf("%s stopped while starting: %v", name, c.err)
	case <-time.After(30 * time.Second):
		c.Stop()
		return nil, fmt.Errorf("%s not ready within 30s", name)
	}
	s.mu.Lock()
	s.Components = append(s.Components, c)
	s.mu.Unlock()
	return c, nil
}

// add connects a replica to NATS on its own connection, builds it with
// build, runs it until its component stops and records it with keep.
func add[S any](s *Stack, name string, build func(*nats.Conn) (S, runner, error), keep func(S)) (*Component, error) {
	nc, err := s.connect(name)
	if err != nil {
		return nil, err
	}
	svc, run, err := build(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	c, err := s.start(name, nc, run)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	keep(svc)
	s.mu.Unlock()
	return c, nil
}

// AddHub starts another devicehub replica listening on addr for WebSocket
// and OTA, and on mqttAddr for MQTT unless it is empty.
func (s *Stack) AddHub(name, addr, mqttAddr string) (*Component, error) {
	cfg := devicehub.Config{
		Instance:   name,
		DeviceAddr: addr,
		MQTTAddr:   mqttAddr,
		Auth:       s.Tenancy.DeviceAuth,
		OTA: devicehub.OTAConfig{
			Credentials: s.Tenancy.DeviceMinter,
			Activations: s.Activations,
		},
		TracerProvider: s.cfg.HubTracerProvider,
		Registerer:     s.cfg.Registerer,
	}
	if s.cfg.AutoActivate {
		cfg.OTA.AutoActivateTenant = DevTenant
	}
	if s.cfg.TuneHub != nil {
		s.cfg.TuneHub(&cfg)
	}
	return add(s, name, func(nc *nats.Conn) (*devicehub.Service, runner, error) {
		svc, err := devicehub.New(cfg, nc, s.cfg.Log)
		return svc, svc, err
	}, func(svc *devicehub.Service) { s.Hubs = append(s.Hubs, svc) })
}

// AddShim starts another shim replica.
func (s *Stack) AddShim(name string) (*Component, error) {
	cfg := shim.Config{Instance: name, TracerProvider: s.cfg.ShimTracerProvider, Registerer: s.cfg.Registerer}
	if s.cfg.TuneShim != nil {
		s.cfg.TuneShim(&cfg)
	}
	return add(s, name, func(nc *nats.Conn) (*shim.Service, runner, error) {
		svc, err := shim.New(cfg, nc, s.cfg.Log)
		return svc, svc, err
	}, func(svc *shim.Service) { s.Shims = append(s.Shims, svc) })
}

// UpstreamConfig returns the upstream the stack publishes to (Tenant and
// Name filled in); its URL is empty when there is none.
func (s *Stack) UpstreamConfig() upstream.Upstream { return s.cfg.Upstream }

// AddUpstream starts another upstream worker: it runs the stored
// upstreams and Config.Upstream, if any; their calls go through the first
// gateway as the principal upstream:<name>.
func (s *Stack) AddUpstream(name string) (*Component, error) {
	inv := &upstream.GatewayInvoker{URL: s.GatewayURL(0)}
	cfg := upstream.Config{Instance: name, Stored: true, Invoker: inv, Registerer: s.cfg.Registerer}
	if s.upstreamToken != "" {
		u := s.cfg.Upstream
		u.CallerToken = s.upstreamToken
		cfg.Upstreams = []upstream.Upstream{u}
	}
	if s.cfg.TuneUpstream != nil {
		s.cfg.TuneUpstream(&cfg)
	}
	return add(s, name, func(nc *nats.Conn) (*upstream.Service, runner, error) {
		svc, err := upstream.New(cfg, nc, s.cfg.Log)
		if err != nil {
			return nil, nil, err
		}
		return svc, readyAtOnce(func(ctx context.Context) error {
			defer inv.Close()
			return svc.Run(ctx)
		}), nil
	}, func(svc *upstream.Service) { s.Upstreams = append(s.Upstreams, svc) })
}

// AddGateway starts another gateway replica listening on addr.
func (s *Stack) AddGateway(name, addr string) (*Component, error) {
	cfg := gateway.Config{
		Addr:           addr,
		Instance:       name,
		Ops:            s.cfg.Ops,
		Console:        s.cfg.Console,
		TracerProvider: s.cfg.GatewayTracerProvider,
		Registerer:     s.cfg.Registerer,
	}
	s.Tenancy.Configure(&cfg)
	if s.cfg.TuneGateway != nil {
		s.cfg.TuneGateway(&cfg)
	}
	return add(s, name, func(nc *nats.Conn) (*gateway.Service, runner, error) {
		svc, err := gateway.New(cfg, nc, s.cfg.Log)
		if err != nil {
			return nil, nil, err
		}
		return svc, gatewayWithWatcher{svc, s.Tenancy.Watcher(nc, svc)}, nil
	}, func(svc *gateway.Service) { s.Gateways = append(s.Gateways, svc) })
}

// watchDatabase pings the tenancy store's database until Close and, with a
// Registerer, exports the answer for the services that use it; it also
// keeps the stored upstreams' bucket in sync with the store.
func (s *Stack) watchDatabase() error {
	db := s.Tenancy.DB
	if s.cfg.Registerer != nil {
		for _, service := range []string{telemetry.LabelGateway, telemetry.LabelDevicehub} {
			if err := db.Register(s.cfg.Registerer, service); err != nil {
				return err
			}
		}
	}
	s.DB = db
	ctx, cancel := context.WithCancel(s.ctx)
	s.stopBackground = cancel
	s.background.Go(func() { _ = db.Run(ctx) })
	s.background.Go(func() { _ = s.Tenancy.Upstreams.Run(ctx) })
	return nil
}

// Component returns the running component with that name, or nil.
func (s *Stack) Component(name string) *Component {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.Components {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// OTAURL is the OTA endpoint of the i-th hub.
func (s *Stack) OTAURL(i int) string {
	return "http://" + s.Hubs[i].DeviceAddr() + "/xiaozhi/ota/"
}

// DeviceURL is the XiaoZhi WebSocket URL of the i-th hub.
func (s *Stack) DeviceURL(i int) string {
	return "ws://" + s.Hubs[i].DeviceAddr() + "/xiaozhi/v1/"
}

// GatewayURL is the operator WebSocket URL of the i-th gateway.
func (s *Stack) GatewayURL(i int) string { return s.Gateways[i].URL() }

// Close stops every component in reverse start order, then NATS.
func (s *Stack) Close() {
	s.mu.Lock()
	comps := append([]*Component(nil), s.Components...)
	s.mu.Unlock()
	for i := len(comps) - 1; i >= 0; i-- {
		select {
		case <-comps[i].Done():
			comps[i].nc.Close()
		default:
			_ = comps[i].Stop()
		}
	}
	if s.stopBackground != nil {
		s.stopBackground()
		s.background.Wait()
	}
	if s.Tenancy != nil {
		s.Tenancy.Close()
	}
	if s.tenNC != nil {
		s.tenNC.Close()
	}
	if s.nats != nil {
		s.nats.Shutdown()
	}
}

// gatewayWithWatcher runs a gateway with its tenancy change watcher, as a
// gateway process does: revocations and policy changes reach it within a
// second.
type gatewayWithWatcher struct {
	*gateway.Service
	w *tenancy.Watcher
}

func (g gatewayWithWatcher) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	werr := make(chan error, 1)
	go func() { werr <- g.w.Run(ctx) }()
	err := g.Service.Run(ctx)
	cancel()
	if e := <-werr; err == nil && e != nil && !errors.Is(e, context.Canceled) {
		err = e
	}
	return err
}
