package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/activation"
	"github.com/xiaoclaw/xiaoclaw/pkg/audit"
	"github.com/xiaoclaw/xiaoclaw/pkg/authguard"
	"github.com/xiaoclaw/xiaoclaw/pkg/ops"
	"github.com/xiaoclaw/xiaoclaw/pkg/policy"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/services/gateway"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/adminapi"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/auditapi"
)

// backend is what the gateway builds on Postgres: operator tokens, the
// policy engine, the audit trail and the admin and audit APIs.
type backend struct {
	tenancy    *tenancy.SQLStore
	audit      *audit.PostgresStore
	operators  *tenancy.OperatorAuth
	auth       access.Authenticator
	policy     *policy.Engine
	auditor    gateway.Auditor
	connects   gateway.ConnectAuditor
	api        http.Handler
	db         *ops.DBHealth                 // the db readiness check and xiaoclaw_db_connected
	runners    []func(context.Context) error // database pings; audit writer, collector and lag monitor
	watcherFor func(svc *gateway.Service) func(context.Context) error
}

// apiLimits are the failure budgets of the admin and audit APIs.
type apiLimits struct {
	authFailures, activationFailures authguard.Config
	trustedProxies                   []netip.Prefix
}

// openBackend connects to Postgres, applies pending migrations (idempotent
// and advisory-locked, so replicas and the migrations Job may race) and
// builds the stores' users. static tokens are tried before the store's.
// reg receives the database and audit backlog gauges.
func openBackend(ctx context.Context, dsn string, nc *nats.Conn, static access.StaticTokens, adminToken string,
	runAuditWriter bool, reg prometheus.Registerer, log *slog.Logger, limits apiLimits) (*backend, error) {
	b := &backend{}
	var err error
	if b.tenancy, err = tenancy.OpenPostgres(ctx, dsn); err != nil {
		return nil, fmt.Errorf("tenancy store: %w", err)
	}
	if err := b.tenancy.Migrate(ctx); err != nil {
		b.close()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	if b.audit, err = audit.OpenPostgres(ctx, dsn); err != nil {
		b.close()
		return nil, fmt.Errorf("audit store: %w", err)
	}
	if b.db, err = ops.NewDBHealth(ops.DBHealthConfig{Ping: b.tenancy.DB().PingContext}, log); err == nil {
		err = b.db.Register(reg, telemetry.LabelGateway)
	}
	if err != nil {
		b.close()
		return nil, err
	}
	b.runners = append(b.runners, b.db.Run)
	mgr, err := tenancy.NewManager(tenancy.ManagerConfig{Store: b.tenancy, CheckRule: policy.CheckRule,
		Notify: tenancy.NATSNotifier(nc), Log: log})
	if err != nil {
		b.close()
		return nil, err
	}
	b.operators = tenancy.NewOperatorAuth(b.tenancy, tenancy.CacheConfig{}, log)
	b.auth = b.operators
	if len(static) > 0 {
		b.auth = tenancy.OperatorChain{static, b.operators}
	}
	if b.policy, err = policy.New(policy.Config{Store: b.tenancy, Log: log}); err != nil {
		b.close()
		return nil, err
	}
	var admins []string
	if adminToken != "" {
		admins = []string{adminToken}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		b.close()
		return nil, err
	}
	acts, err := activation.NewKV(ctx, js, activation.Config{})
	if err != nil {
		b.close()
		return nil, fmt.Errorf("activations: %w", err)
	}
	// Mints MCP endpoint tokens with the tenants' device keys (cached with
	// the store's TTL; after a key rotation the old key still verifies for
	// its overlap).
	devs, err := tenancy.NewDeviceAuth(b.tenancy, tenancy.DeviceAuthConfig{}, log)
	if err != nil {
		b.close()
		return nil, err
	}
	admin, err := adminapi.New(adminapi.Config{Manager: mgr, Operators: b.auth, Policy: b.policy, AdminTokens: admins,
		Activator: adminapi.ActivationBinder(acts), DeviceTokens: devs, AuthFailures: limits.authFailures,
		ActivationFailures: limits.activationFailures, TrustedProxies: limits.trustedProxies,
		Nodes: adminapi.KVNodeApprover(js), Log: log})
	if err != nil {
		b.close()
		return nil, err
	}
	auditAPI, err := auditapi.New(auditapi.Config{Store: b.audit, Operators: b.auth, AdminTokens: admins,
		AuthFailures: limits.authFailures, TrustedProxies: limits.trustedProxies, Log: log})
	if err != nil {
		b.close()
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/api/audit/", auditAPI)
	mux.Handle("/api/", admin)
	b.api = mux

	pub, err := audit.NewPublisher(ctx, nc, audit.PublisherConfig{}, log)
	if err != nil {
		b.close()
		return nil, fmt.Errorf("audit publisher: %w", err)
	}
	b.auditor = auditapi.InvokeAuditor(pub)
	b.connects = auditapi.ConnectAuditor(pub, log)
	if runAuditWriter {
		w, err := audit.NewWriter(nc, b.audit, audit.WriterConfig{}, log)
		if err != nil {
			b.close()
			return nil, err
		}
		c, err := audit.NewCollector(nc, pub, log)
		if err != nil {
			b.close()
			return nil, err
		}
		lag, err := audit.NewLagMonitor(nc, audit.LagMonitorConfig{Registerer: reg}, log)
		if err != nil {
			b.close()
			return nil, err
		}
		b.runners = append(b.runners, w.Run, c.Run, lag.Run)
	}
	b.watcherFor = func(svc *gateway.Service) func(context.Context) error {
		// Caches first, then the re-check of live connections.
		return tenancy.NewWatcher(nc, tenancy.WatcherConfig{Store: b.tenancy}, log,
			b.operators, b.policy, tenancy.ChangeFunc(svc.TenancyChanged)).Run
	}
	return b, nil
}

// checks are the readiness checks of the database.
func (b *backend) checks() []ops.Check {
	return []ops.Check{b.db.Check()}
}

func (b *backend) close() {
	if b.audit != nil {
		b.audit.Close()
	}
	if b.tenancy != nil {
		b.tenancy.Close()
	}
}
