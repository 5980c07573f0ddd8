package tenancy

import (
	"context"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// CacheConfig tunes the in-memory caches of OperatorAuth and DeviceAuth.
type CacheConfig struct {
	// MaxAge bounds how long a cached lookup is trusted when no change
	// notification arrives; 0 means 5 minutes. Notifications (and the
	// Watcher's resync) normally invalidate entries long before.
	MaxAge time.Duration
	// MaxEntries bounds each cache; 0 means 100,000.
	MaxEntries int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func (c *CacheConfig) setDefaults() {
	if c.MaxAge <= 0 {
		c.MaxAge = 5 * time.Minute
	}
	if c.MaxEntries <= 0 {
		c.MaxEntries = 100_000
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// OperatorAuth authenticates operator API tokens (xco_<id>_<secret>)
// against the store. It implements access.Authenticator and ChangeHandler.
type OperatorAuth struct {
	store   Store
	log     *slog.Logger
	now     func() time.Time
	tokens  *cache[Token]
	tenants *cache[Tenant]
}

var _ access.Authenticator = (*OperatorAuth)(nil)

// NewOperatorAuth returns an authenticator over store. Register it with a
// Watcher so that revocations and suspensions reach it.
func NewOperatorAuth(store Store, cfg CacheConfig, log *slog.Logger) *OperatorAuth {
	cfg.setDefaults()
	return &OperatorAuth{
		store:   store,
		log:     log,
		now:     cfg.Now,
		tokens:  newCache[Token](cfg.MaxAge, cfg.MaxEntries, cfg.Now),
		tenants: newCache[Tenant](cfg.MaxAge, cfg.MaxEntries, cfg.Now),
	}
}

// AuthenticateOperator resolves an operator token, or an upstream's caller
// token (xcu_…, principal "upstream:<name>"), to its principal. It
// answers access.ErrUnauthenticated for a malformed, unknown, wrong,
// expired or revoked token and for a suspended tenant; any other error means
// the store could not be asked (the caller should answer "unavailable").
func (a *OperatorAuth) AuthenticateOperator(ctx context.Context, token string) (access.Principal, error) {
	if strings.HasPrefix(token, UpstreamCallerPrefix) {
		return a.authenticateUpstream(ctx, token)
	}
	id, err := ParseOperatorToken(token)
	if err != nil {
		return access.Principal{}, access.ErrUnauthenticated
	}
	t, found, err := a.tokens.get(ctx, id, a.store.Token)
	if err != nil {
		return access.Principal{}, fmt.Errorf("tenancy: token lookup: %w", err)
	}
	// Hash even when the id is unknown, so timing does not tell them apart.
	sum := hashToken(token)
	if !found || subtle.ConstantTimeCompare([]byte(sum), []byte(t.SecretHash)) != 1 || !t.Usable(a.now()) {
		return access.Principal{}, access.ErrUnauthenticated
	}
	if err := a.tenantActive(ctx, t.Tenant); err != nil {
		return access.Principal{}, err
	}
	return access.Principal{Tenant: t.Tenant, ID: t.ID, Name: t.Name, Role: t.Role}, nil
}

// Recheck tells whether a principal authenticated earlier may keep its
// connection: it fails with access.ErrUnauthenticated once the tenant is
// suspended or, for a principal that is one of the store's tokens, once the
// token is revoked or expired. Principals that are not store tokens (the dev
// tenant's static token) are checked for the tenant only. The gateway calls
// it for each live connection of a tenant after a change notification.
func (a *OperatorAuth) Recheck(ctx context.Context, p access.Principal) error {
	if err := a.tenantActive(ctx, p.Tenant); err != nil {
		return err
	}
	if name, ok := strings.CutPrefix(p.ID, upstreamPrincipalPrefix); ok && p.Name == upstreamCallerName(name) {
		return a.recheckUpstream(ctx, p, name)
	}
	if !ValidTokenID(p.ID) {
		return nil
	}
	t, found, err := a.tokens.get(ctx, p.ID, a.store.Token)
	if err != nil {
		return fmt.Errorf("tenancy: token lookup: %w", err)
	}
	if !found || t.Tenant != p.Tenant || !t.Usable(a.now()) {
		return access.ErrUnauthenticated
	}
	return nil
}

func (a *OperatorAuth) tenantActive(ctx context.Context, tenant string) error {
	t, found, err := a.tenants.get(ctx, tenant, a.store.Tenant)
	if err != nil {
		return fmt.Errorf("tenancy: tenant lookup: %w", err)
	}
	if !found || t.Status != StatusActive {
		return access.ErrUnauthenticated
	}
	return nil
}

// TenancyChanged drops what the change may have made stale.
func (a *OperatorAuth) TenancyChanged(c wire.TenancyChange) {
	switch c.Kind {
	case wire.ChangeToken:
		a.tokens.drop(c.ID)
	case wire.ChangeTenant, wire.ChangeResync:
		a.tenants.drop(c.Tenant)
		a.tokens.dropWhere(func(_ string, t Token, found bool) bool { return !found || t.Tenant == c.Tenant })
	}
}

// InflightLimits returns the tenant's in-flight limits from the tenant
// cache (dropped on every change of the tenant): the gateway sends them to
// the shim with each node.invoke. An unknown tenant has the defaults (0).
func (a *OperatorAuth) InflightLimits(ctx context.Context, tenant string) (wire.InflightLimits, error) {
	t, _, err := a.tenants.get(ctx, tenant, a.store.Tenant)
	if err != nil {
		return wire.InflightLimits{}, fmt.Errorf("tenancy: tenant lookup: %w", err)
	}
	return wire.InflightLimits{Tenant: t.Limits.MaxInflight, Device: t.Limits.MaxInflightPerDevice}, nil
}
