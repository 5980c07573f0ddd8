package tenancy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// Limits on what an administrator may set.
const (
	DefaultTokenTTL = 90 * 24 * time.Hour
	MaxTokenTTL     = 10 * 365 * 24 * time.Hour
	MaxKeyOverlap   = 90 * 24 * time.Hour
	maxNameLen      = 128
	maxListLen      = 100_000
)

// ManagerConfig configures a Manager.
type ManagerConfig struct {
	Store Store
	// Notify publishes a change after it is committed (NATSNotifier). Nil
	// publishes nothing: then only the Watcher's resync spreads changes.
	Notify func(context.Context, wire.TenancyChange) error
	// CheckRule validates a rule and rewrites it to canonical form; it is
	// required (pkg/policy provides policy.CheckRule).
	CheckRule func(*Rule) error
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Upstreams, when set, delivers the stored upstreams to the shims
	// (UpstreamSync): a new upstream's caller token goes into its bucket
	// entry only, and AddUpstream returns none.
	Upstreams UpstreamDelivery
	Log       *slog.Logger
}

// UpstreamDelivery hands stored upstreams to the shims.
type UpstreamDelivery interface {
	Deliver(ctx context.Context, u Upstream, callerToken string) error
	Withdraw(ctx context.Context, tenant, name string) error
}

// Manager is the write path for tenants and everything they own: it
// validates input (ErrInvalid, leaving the store untouched), writes through
// the store and announces each committed change.
type Manager struct {
	cfg ManagerConfig
}

// NewManager returns a Manager.
func NewManager(cfg ManagerConfig) (*Manager, error) {
	if cfg.Store == nil || cfg.CheckRule == nil || cfg.Log == nil {
		return nil, errors.New("tenancy: manager needs a store, a rule checker and a logger")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Manager{cfg: cfg}, nil
}

// Store returns the underlying store, for reads.
func (m *Manager) Store() Store { return m.cfg.Store }

func (m *Manager) now() time.Time { return m.cfg.Now().UTC().Truncate(time.Millisecond) }

// notify announces a committed change. A failed publish is logged, not
// returned: the change is in the store, and every replica's Watcher picks
// it up at its next resync.
func (m *Manager) notify(ctx context.Context, tenant, kind, id string) {
	if m.cfg.Notify == nil {
		return
	}
	c := wire.TenancyChange{Tenant: tenant, Kind: kind, ID: id}
	if err := m.cfg.Notify(ctx, c); err != nil {
		m.cfg.Log.Warn("tenancy change not published; replicas catch up at their next resync",
			"tenant", tenant, "kind", kind, "id", id, "err", err)
	}
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}

func checkName(field, v string) error {
	if len(v) > maxNameLen {
		return invalid("%s must be at most %d bytes", field, maxNameLen)
	}
	for _, r := range v {
		if r < 0x20 || r == 0x7f {
			return invalid("%s must not contain control characters", field)
		}
	}
	return nil
}

func checkEffect(e string) error {
	if e != EffectAllow && e != EffectDeny {
		return invalid("effect must be %q or %q, not %q", EffectAllow, EffectDeny, e)
	}
	return nil
}

// checkLimit accepts an unset limit, 0 (the shim's default) and 1 up to
// wire.MaxInflightLimit.
func checkLimit(field string, v *int) error {
	if v != nil && (*v < 0 || *v > wire.MaxInflightLimit) {
		return invalid("%s must be between 0 (the default) and %d, not %d", field, wire.MaxInflightLimit, *v)
	}
	return nil
}

// TenantSpec describes a new tenant.
type TenantSpec struct {
	ID          string `json:"id"`
	DisplayName string `json:"displayName,omitempty"`
	// DefaultEffect decides requests no rule matches; "" means allow.
	DefaultEffect string `json:"defaultEffect,omitempty"`
}

// CreateTenant creates an active tenant.
func (m *Manager) CreateTenant(ctx context.Context, s TenantSpec) (Tenant, error) {
	if err := wire.ValidTenant(s.ID); err != nil {
		return Tenant{}, invalid("%v", err)
	}
	if err := checkName("displayName", s.DisplayName); err != nil {
		return Tenant{}, err
	}
	if s.DefaultEffect == "" {
		s.DefaultEffect = EffectAllow
	}
	if err := checkEffect(s.DefaultEffect); err != nil {
		return Tenant{}, err
	}
	now := m.now()
	t := Tenant{ID: s.ID, DisplayName: s.DisplayName, Status: StatusActive, DefaultEffect: s.DefaultEffect,
		Version: 1, CreatedAt: now, UpdatedAt: now}
	if err := m.cfg.Store.CreateTenant(ctx, t); err != nil {
		return Tenant{}, fmt.Errorf("tenant %q: %w", s.ID, err)
	}
	m.notify(ctx, t.ID, wire.ChangeTenant, "")
	return t, nil
}

// UpdateTenant changes a tenant's display name, status, default effect or
// in-flight limits.
func (m *Manager) UpdateTenant(ctx context.Context, id string, u TenantUpdate) (Tenant, error) {
	if u.DisplayName != nil {
		if err := checkName("displayName", *u.DisplayName); err != nil {
			return Tenant{}, err
		}
	}
	if u.Status != nil && *u.Status != StatusActive && *u.Status != StatusSuspended {
		return Tenant{}, invalid("status must be %q or %q", StatusActive, StatusSuspended)
	}
	if u.DefaultEffect != nil {
		if err := checkEffect(*u.DefaultEffect); err != nil {
			return Tenant{}, err
		}
	}
	if err := checkLimit("maxInflight", u.MaxInflight); err != nil {
		return Tenant{}, err
	}
	if err := checkLimit("maxInflightPerDevice", u.MaxInflightPerDevice); err != nil {
		return Tenant{}, err
	}
	t, err := m.cfg.Store.UpdateTenant(ctx, id, u, m.now())
	if err != nil {
		return Tenant{}, err
	}
	m.notify(ctx, id, wire.ChangeTenant, "")
	return t, nil
}

// SuspendTenant suspends a tenant: its tokens and devices stop
// authenticating, and live connections are cut by the gateway's recheck.
func (m *Manager) SuspendTenant(ctx context.Context, id string) (Tenant, error) {
	s := StatusSuspended
	return m.UpdateTenant(ctx, id, TenantUpdate{Status: &s})
}

// ResumeTenant makes a suspended tenant active again.
func (m *Manager) ResumeTenant(ctx context.Context, id string) (Tenant, error) {
	s := StatusActive
	return m.UpdateTenant(ctx, id, TenantUpdate{Status: &s})
}

// TokenSpec describes a new operator token.
type TokenSpec struct {
	Name string `json:"name,omitempty"`
	Role string `json:"role"`
	// TTL is the lifetime; 0 means DefaultTokenTTL.
	TTL time.Duration `json:"-"`
}

// IssueToken creates an operator token and returns its record and the
// token string, which is shown this once and never stored.
func (m *Manager) IssueToken(ctx context.Context, tenant string, s TokenSpec) (Token, string, error) {
	switch s.Role {
	case access.RoleAdmin, access.RoleOperator, access.RoleViewer:
	default:
		return Token{}, "", invalid("role must be admin, operator or viewer, not %q", s.Role)
	}
	if err := checkName("name", s.Name); err != nil {
		return Token{}, "", err
	}
	if s.TTL == 0 {
		s.TTL = DefaultTokenTTL
	}
	if s.TTL < time.Second || s.TTL > MaxTokenTTL {
		return Token{}, "", invalid("token lifetime must be between 1s and %s", MaxTokenTTL)
	}
	if err := wire.ValidTenant(tenant); err != nil {
		return Token{}, "", fmt.Errorf("tenant %q: %w", tenant, ErrNotFound)
	}
	id, secret := newOperatorToken()
	now := m.now()
	t := Token{ID: id, Tenant: tenant, Name: s.Name, Role: s.Role, SecretHash: hashToken(secret),
		CreatedAt: now, ExpiresAt: now.Add(s.TTL)}
	if err := m.cfg.Store.CreateToken(ctx, t); err != nil {
		return Token{}, "", err
	}
	m.notify(ctx, tenant, wire.ChangeToken, id)
	return t, secret, nil
}

// RevokeToken revokes a token of the tenant. Live connections using it are
// cut by the gateway's recheck after the change notification.
func (m *Manager) RevokeToken(ctx context.Context, tenant, id string) (Token, error) {
	if !ValidTokenID(id) {
		return Token{}, fmt.Errorf("token %q: %w", id, ErrNotFound)
	}
	t, err := m.cfg.Store.RevokeToken(ctx, tenant, id, m.now())
	if err != nil {
		return Token{}, err
	}
	m.notify(ctx, tenant, wire.ChangeToken, id)
	return t, nil
}

// CreateDeviceKey adds a device key to the tenant and returns it with its
// secret (shown this once by the admin API).
func (m *Manager) CreateDeviceKey(ctx context.Context, tenant string) (DeviceKey, error) {
	k := DeviceKey{ID: newID(PrefixDeviceKey), Tenant: tenant, Secret: randomB32(32), CreatedAt: m.now()}
	if err := m.cfg.Store.CreateDeviceKey(ctx, k); err != nil {
		return DeviceKey{}, err
	}
	m.notify(ctx, tenant, wire.ChangeDeviceKey, k.ID)
	return k, nil
}

// RotateDeviceKey adds a new key and lets every other key of the tenant
// keep verifying for overlap, then retire. New credentials are minted with
// the new key at once.
func (m *Manager) RotateDeviceKey(ctx context.Context, tenant string, overlap time.Duration) (DeviceKey, []DeviceKey, error) {
	if overlap < 0 || overlap > MaxKeyOverlap {
		return DeviceKey{}, nil, invalid("overlap must be between 0 and %s", MaxKeyOverlap)
	}
	now := m.now()
	k := DeviceKey{ID: newID(PrefixDeviceKey), Tenant: tenant, Secret: randomB32(32), CreatedAt: now}
	all, err := m.cfg.Store.RotateDeviceKeys(ctx, k, now.Add(overlap))
	if err != nil {
		return DeviceKey{}, nil, err
	}
	m.notify(ctx, tenant, wire.ChangeDeviceKey, k.ID)
	return k, all, nil
}

// SetAllowlist replaces the tenant's device allowlist. Device ids are
// stored canonical (wire.CanonicalDevice), so a MAC matches in any spelling.
func (m *Manager) SetAllowlist(ctx context.Context, tenant string, enabled bool, devices []string) ([]string, error) {
	if len(devices) > maxListLen {
		return nil, invalid("at most %d devices", maxListLen)
	}
	canon := make([]string, 0, len(devices))
	for _, d := range devices {
		c, err := wire.CanonicalDevice(d)
		if err != nil {
			return nil, invalid("%v", err)
		}
		canon = append(canon, c)
	}
	if err := m.cfg.Store.SetAllowlist(ctx, tenant, enabled, canon, m.now()); err != nil {
		return nil, err
	}
	m.notify(ctx, tenant, wire.ChangeAllowlist, "")
	return dedupe(canon), nil
}

// AddRule checks, numbers and stores a policy rule.
func (m *Manager) AddRule(ctx context.Context, r Rule) (Rule, error) {
	r.ID = NewRuleID()
	if err := checkEffect(r.Effect); err != nil {
		return Rule{}, err
	}
	if err := checkName("description", r.Description); err != nil {
		return Rule{}, err
	}
	if err := m.cfg.CheckRule(&r); err != nil {
		return Rule{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	r.CreatedAt = m.now()
	if err := m.cfg.Store.AddRule(ctx, r); err != nil {
		return Rule{}, err
	}
	m.notify(ctx, r.Tenant, wire.ChangeRule, r.ID)
	return r, nil
}

// RemoveRule deletes a rule of the tenant.
func (m *Manager) RemoveRule(ctx context.Context, tenant, id string) error {
	if !ValidRuleID(id) {
		return fmt.Errorf("rule %q: %w", id, ErrNotFound)
	}
	if err := m.cfg.Store.RemoveRule(ctx, tenant, id, m.now()); err != nil {
		return err
	}
	m.notify(ctx, tenant, wire.ChangeRule, id)
	return nil
}

// ValidGroupName reports whether g may name a node group: 1-64 characters
// of [A-Za-z0-9_-].
func ValidGroupName(g string) bool {
	if len(g) == 0 || len(g) > 64 {
		return false
	}
	for i := 0; i < len(g); i++ {
		c := g[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// SetGroup replaces the node ids in a group (empty deletes the group).
func (m *Manager) SetGroup(ctx context.Context, tenant, group string, nodes []string) error {
	if !ValidGroupName(group) {
		return invalid("group name must be 1-64 characters of [A-Za-z0-9_-]")
	}
	if len(nodes) > maxListLen {
		return invalid("at most %d nodes", maxListLen)
	}
	for _, n := range nodes {
		if err := wire.ValidNodeID(n); err != nil {
			return invalid("%v", err)
		}
	}
	if err := m.cfg.Store.SetGroup(ctx, tenant, group, nodes, m.now()); err != nil {
		return err
	}
	m.notify(ctx, tenant, wire.ChangeGroup, group)
	return nil
}
