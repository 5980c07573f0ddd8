package devstack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/activation"
	"github.com/xiaoclaw/xiaoclaw/pkg/deviceauth"
	"github.com/xiaoclaw/xiaoclaw/pkg/policy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/services/devicehub"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/adminapi"
	"github.com/xiaoclaw/xiaoclaw/services/shim/upstream"
)

// Tenancy is the tenants, credentials and policy store with everything
// built on it: the operator and device authenticators (the dev tenant's
// static tokens first, then the store), the policy engine and the admin API.
type Tenancy struct {
	Store    *tenancy.SQLStore
	Manager  *tenancy.Manager
	Operator *tenancy.OperatorAuth
	Devices  *tenancy.DeviceAuth
	Policy   *policy.Engine

	OperatorAuth access.Authenticator     // static dev token, then the store
	DeviceAuth   deviceauth.Authenticator // static dev token, then the store
	// DeviceMinter mints the credentials OTA hands out: from the static dev
	// token for the dev tenant, from the tenant's device keys otherwise.
	DeviceMinter devicehub.CredentialMinter
	AdminAPI     http.Handler
}

// openTenancy opens the store (Postgres when databaseURL is set, else SQLite
// in dataDir), migrates it, seeds the dev tenant and builds the rest.
func openTenancy(ctx context.Context, cfg Config, upstreamToken string, nc *nats.Conn, acts activation.Store, log *slog.Logger) (*Tenancy, error) {
	var (
		store *tenancy.SQLStore
		err   error
	)
	if cfg.DatabaseURL != "" {
		store, err = tenancy.OpenPostgres(ctx, cfg.DatabaseURL)
	} else {
		store, err = tenancy.OpenSQLite(ctx, filepath.Join(cfg.DataDir, "xiaoclaw.db"))
	}
	if err != nil {
		return nil, fmt.Errorf("tenancy store: %w", err)
	}
	fail := func(err error) (*Tenancy, error) {
		store.Close()
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		return fail(fmt.Errorf("migrate: %w", err))
	}
	t := &Tenancy{Store: store}
	t.Manager, err = tenancy.NewManager(tenancy.ManagerConfig{Store: store, CheckRule: policy.CheckRule,
		Notify: tenancy.NATSNotifier(nc), Log: log})
	if err != nil {
		return fail(err)
	}
	if _, err := t.Manager.CreateTenant(ctx, tenancy.TenantSpec{ID: DevTenant, DisplayName: "development"}); err != nil &&
		!errors.Is(err, tenancy.ErrConflict) {
		return fail(fmt.Errorf("seed tenant %q: %w", DevTenant, err))
	}
	t.Operator = tenancy.NewOperatorAuth(store, tenancy.CacheConfig{}, log)
	if t.Devices, err = tenancy.NewDeviceAuth(store, tenancy.DeviceAuthConfig{}, log); err != nil {
		return fail(err)
	}
	if t.Policy, err = policy.New(policy.Config{Store: store, Log: log}); err != nil {
		return fail(err)
	}
	static := access.StaticTokens{cfg.OperatorToken: devOperator}
	if upstreamToken != "" {
		static[upstreamToken] = access.Principal{Tenant: DevTenant, ID: upstream.Principal(cfg.Upstream.Name),
			Name: "upstream " + cfg.Upstream.Name, Role: access.RoleOperator}
	}
	t.OperatorAuth = tenancy.OperatorChain{static, t.Operator}
	devCreds := devicehub.StaticCredentials{Token: cfg.DeviceToken, Tenant: DevTenant}
	t.DeviceAuth = tenancy.DeviceChain{devCreds, t.Devices}
	t.DeviceMinter = minterByTenant{dev: devCreds, other: t.Devices}
	var admins []string
	if cfg.AdminToken != "" {
		admins = []string{cfg.AdminToken}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return fail(err)
	}
	if t.AdminAPI, err = adminapi.New(adminapi.Config{Manager: t.Manager, Operators: t.OperatorAuth, Policy: t.Policy,
		AdminTokens: admins, Activator: adminapi.ActivationBinder(acts), DeviceTokens: t.DeviceMinter,
		Nodes: adminapi.KVNodeApprover(js), Log: log}); err != nil {
		return fail(err)
	}
	return t, nil
}

// minterByTenant mints the dev tenant's credentials from its static token
// and every other tenant's from its device keys.
type minterByTenant struct {
	dev   devicehub.StaticCredentials
	other devicehub.CredentialMinter
}

func (m minterByTenant) pick(tenant string) devicehub.CredentialMinter {
	if tenant == m.dev.Tenant {
		return m.dev
	}
	return m.other
}

func (m minterByTenant) MintDeviceToken(ctx context.Context, tenant, clientID, deviceID string) (string, error) {
	return m.pick(tenant).MintDeviceToken(ctx, tenant, clientID, deviceID)
}

func (m minterByTenant) MintMQTTCredentials(ctx context.Context, tenant, clientID string) (string, string, error) {
	return m.pick(tenant).MintMQTTCredentials(ctx, tenant, clientID)
}

// DefaultUpstreamName names the dev tenant's upstream when none is given;
// its calls are the principal "upstream:openclaw".
const DefaultUpstreamName = "openclaw"

// randomSecret returns 128 random bits, hex-encoded.
func randomSecret() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// devOperator is the principal of the dev tenant's static operator token:
// an admin of the tenant, which may do everything until a deny rule says
// otherwise.
var devOperator = access.Principal{Tenant: DevTenant, ID: "dev-operator", Name: "dev operator", Role: access.RoleAdmin}

// watcher returns a change watcher that refreshes the shared caches and
// then calls recheck (a gateway's re-check of live connections).
func (t *Tenancy) watcher(nc *nats.Conn, log *slog.Logger, recheck tenancy.ChangeHandler) *tenancy.Watcher {
	handlers := []tenancy.ChangeHandler{t.Operator, t.Devices, t.Policy}
	if recheck != nil {
		handlers = append(handlers, recheck)
	}
	return tenancy.NewWatcher(nc, tenancy.WatcherConfig{Store: t.Store}, log, handlers...)
}
