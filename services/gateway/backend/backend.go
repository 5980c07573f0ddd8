// Package backend builds what a gateway serves from its databases: the
// tenancy store (tenants, operator tokens, device keys, policies) and the
// audit trail, with the operator authenticator, the policy engine, the admin
// and audit APIs and the audit publisher built on them. The gateway command
// opens one per replica on PostgreSQL; `xiaoclaw dev` opens one on
// PostgreSQL or SQLite and shares it among its replicas.
package backend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"path/filepath"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/activation"
	"github.com/xiaoclaw/xiaoclaw/pkg/audit"
	"github.com/xiaoclaw/xiaoclaw/pkg/authguard"
	"github.com/xiaoclaw/xiaoclaw/pkg/ops"
	"github.com/xiaoclaw/xiaoclaw/pkg/policy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/services/gateway"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/adminapi"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/auditapi"
)

// Config of a backend. Everything but one of DatabaseURL and SQLiteDir is
// optional.
type Config struct {
	// DatabaseURL selects PostgreSQL for both stores; empty keeps them in
	// SQLite files in SQLiteDir (xiaoclaw.db and audit.db; development).
	DatabaseURL string
	SQLiteDir   string
	// Static operator tokens are tried before the store's.
	Static access.StaticTokens
	// AdminToken, when set, is the admin and audit APIs' global admin token.
	AdminToken string
	// AuthFailures, ActivationFailures and TrustedProxies throttle failed
	// authentications and activation codes of the admin and audit APIs
	// (zero: their defaults).
	AuthFailures, ActivationFailures authguard.Config
	TrustedProxies                   []netip.Prefix
	// Activations are the devices' activation codes the admin API binds;
	// nil: the KV bucket on NATS.
	Activations activation.Store
	// DeviceTokens, when set, mints the admin API's MCP endpoint tokens in
	// place of the store's device keys, which it is given (`xiaoclaw dev`:
	// the dev tenant's static token first).
	DeviceTokens func(keys *tenancy.DeviceAuth) adminapi.DeviceTokenMinter
	Log          *slog.Logger
}

// Backend is the stores and what is built on them. Open builds it; Close
// closes the stores.
type Backend struct {
	Store     *tenancy.SQLStore
	Manager   *tenancy.Manager
	Operators *tenancy.OperatorAuth // the store's operator tokens
	// OperatorAuth tries Config.Static, then Operators.
	OperatorAuth access.Authenticator
	Devices      *tenancy.DeviceAuth // the tenants' device keys
	Policy       *policy.Engine
	AuditStore   audit.Store
	// Publisher puts audit records on the stream the audit writer drains
	// into AuditStore.
	Publisher *audit.Publisher
	// AdminAPI and AuditAPI serve /api/ and /api/audit/; API routes to both.
	AdminAPI, AuditAPI, API http.Handler
	// DB pings the tenancy store's database (the "db" readiness check and
	// xiaoclaw_db_connected) while its Run runs.
	DB *ops.DBHealth
	// Upstreams keeps the stored upstreams' bucket (xc_upstreams) the shims
	// run them from equal to the store while its Run runs; the Manager
	// delivers added and removed upstreams through it, and the Watcher
	// tells it about changes.
	Upstreams *tenancy.UpstreamSync

	log     *slog.Logger
	closers []func()
}

// Open opens the stores, applies pending migrations (idempotent and
// advisory-locked on PostgreSQL, so replicas and the migrations Job may race)
// and builds the rest; nc carries tenancy change notices, audit records and
// the activation and node buckets.
func Open(ctx context.Context, cfg Config, nc *nats.Conn) (*Backend, error) {
	if cfg.DatabaseURL == "" && cfg.SQLiteDir == "" {
		return nil, errors.New("backend: DatabaseURL or SQLiteDir is required")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	b := &Backend{log: cfg.Log}
	if err := b.open(ctx, cfg, nc); err != nil {
		b.Close()
		return nil, err
	}
	return b, nil
}

func (b *Backend) open(ctx context.Context, cfg Config, nc *nats.Conn) error {
	log := cfg.Log
	var err error
	if cfg.DatabaseURL != "" {
		b.Store, err = tenancy.OpenPostgres(ctx, cfg.DatabaseURL)
	} else {
		b.Store, err = tenancy.OpenSQLite(ctx, filepath.Join(cfg.SQLiteDir, "xiaoclaw.db"))
	}
	if err != nil {
		return fmt.Errorf("tenancy store: %w", err)
	}
	b.closers = append(b.closers, func() { _ = b.Store.Close() })
	if err := b.Store.Migrate(ctx); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if err := b.openAudit(ctx, cfg); err != nil {
		return fmt.Errorf("audit store: %w", err)
	}
	if b.DB, err = ops.NewDBHealth(ops.DBHealthConfig{Ping: b.Store.DB().PingContext}, log); err != nil {
		return err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if b.Upstreams, err = tenancy.NewUpstreamSync(tenancy.UpstreamSyncConfig{Store: b.Store, JS: js}, log); err != nil {
		return err
	}
	if b.Manager, err = tenancy.NewManager(tenancy.ManagerConfig{Store: b.Store, CheckRule: policy.CheckRule,
		Notify: tenancy.NATSNotifier(nc), Upstreams: b.Upstreams, Log: log}); err != nil {
		return err
	}
	b.Operators = tenancy.NewOperatorAuth(b.Store, tenancy.CacheConfig{}, log)
	b.OperatorAuth = b.Operators
	if len(cfg.Static) > 0 {
		b.OperatorAuth = tenancy.OperatorChain{cfg.Static, b.Operators}
	}
	// Mints MCP endpoint tokens with the tenants' device keys (cached with
	// the store's TTL; after a key rotation the old key still verifies for
	// its overlap).
	if b.Devices, err = tenancy.NewDeviceAuth(b.Store, tenancy.DeviceAuthConfig{}, log); err != nil {
		return err
	}
	if b.Policy, err = policy.New(policy.Config{Store: b.Store, Log: log}); err != nil {
		return err
	}
	acts := cfg.Activations
	if acts == nil {
		if acts, err = activation.NewKV(ctx, js, activation.Config{}); err != nil {
			return fmt.Errorf("activations: %w", err)
		}
	}
	var minter adminapi.DeviceTokenMinter = b.Devices
	if cfg.DeviceTokens != nil {
		minter = cfg.DeviceTokens(b.Devices)
	}
	var admins []string
	if cfg.AdminToken != "" {
		admins = []string{cfg.AdminToken}
	}
	if b.AdminAPI, err = adminapi.New(adminapi.Config{Manager: b.Manager, Operators: b.OperatorAuth, Policy: b.Policy,
		AdminTokens: admins, Activator: adminapi.ActivationBinder(acts), DeviceTokens: minter,
		AuthFailures: cfg.AuthFailures, ActivationFailures: cfg.ActivationFailures, TrustedProxies: cfg.TrustedProxies,
		Nodes: adminapi.KVNodeApprover(js), Log: log}); err != nil {
		return err
	}
	if b.AuditAPI, err = auditapi.New(auditapi.Config{Store: b.AuditStore, Operators: b.OperatorAuth, AdminTokens: admins,
		AuthFailures: cfg.AuthFailures, TrustedProxies: cfg.TrustedProxies, Log: log}); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/api/audit/", b.AuditAPI)
	mux.Handle("/api/", b.AdminAPI)
	b.API = mux
	if b.Publisher, err = audit.NewPublisher(ctx, nc, audit.PublisherConfig{}, log); err != nil {
		return fmt.Errorf("audit publisher: %w", err)
	}
	return nil
}

// openAudit opens and migrates the audit store: on PostgreSQL the tenancy
// store's database, on SQLite a file of its own.
func (b *Backend) openAudit(ctx context.Context, cfg Config) error {
	if cfg.DatabaseURL != "" {
		pg, err := audit.OpenPostgres(ctx, cfg.DatabaseURL)
		if err != nil {
			return err
		}
		b.AuditStore = pg
		b.closers = append(b.closers, func() { _ = pg.Close() })
		return pg.Migrate(ctx)
	}
	lite, err := audit.OpenSQLite(ctx, filepath.Join(cfg.SQLiteDir, "audit.db"))
	if err != nil {
		return err
	}
	b.AuditStore = lite
	b.closers = append(b.closers, func() { _ = lite.Close() })
	return lite.Migrate(ctx)
}

// Configure gives a gateway the backend: operator authentication and
// per-operator limits, the policy, the audit hooks and the admin and audit
// APIs.
func (b *Backend) Configure(cfg *gateway.Config) {
	cfg.Auth = b.OperatorAuth
	cfg.Limits = b.Operators
	cfg.Authorizer = b.Policy
	cfg.Auditor = auditapi.InvokeAuditor(b.Publisher)
	cfg.ConnectAuditor = auditapi.ConnectAuditor(b.Publisher, b.log)
	cfg.AdminAPI = b.API
}

// Watcher keeps the backend's caches current from tenancy change notices
// on nc, then calls recheck (a gateway's re-check of its live connections)
// unless it is nil, then tells Upstreams.
func (b *Backend) Watcher(nc *nats.Conn, recheck tenancy.ChangeHandler) *tenancy.Watcher {
	handlers := []tenancy.ChangeHandler{b.Operators, b.Devices, b.Policy}
	if recheck != nil {
		handlers = append(handlers, recheck)
	}
	handlers = append(handlers, b.Upstreams)
	return tenancy.NewWatcher(nc, tenancy.WatcherConfig{Store: b.Store}, b.log, handlers...)
}

// AuditWriter returns the run of the audit writer (stream → AuditStore) on
// nc and, when reg is set, of the monitor exporting its backlog and lag.
func (b *Backend) AuditWriter(nc *nats.Conn, reg prometheus.Registerer) (func(context.Context) error, error) {
	w, err := audit.NewWriter(nc, b.AuditStore, audit.WriterConfig{}, b.log)
	if err != nil {
		return nil, err
	}
	if reg == nil {
		return w.Run, nil
	}
	lag, err := audit.NewLagMonitor(nc, audit.LagMonitorConfig{Registerer: reg}, b.log)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		g, gctx := errgroup.WithContext(ctx)
		g.Go(func() error { return w.Run(gctx) })
		g.Go(func() error { return lag.Run(gctx) })
		return g.Wait()
	}, nil
}

// Close closes the stores.
func (b *Backend) Close() {
	for i := len(b.closers) - 1; i >= 0; i-- {
		b.closers[i]()
	}
	b.closers = nil
}
