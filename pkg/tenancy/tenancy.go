// Package tenancy keeps tenants and their credentials: operator API tokens
// (stored hashed, shown once, with a role and an expiry), per-tenant HMAC
// device keys with rotation, device allowlists, the raw policy rules and
// node groups that pkg/policy evaluates, and the upstream OpenClaw gateways
// a tenant publishes its nodes to (with the caller tokens of their calls).
//
// The Store interface has one SQL implementation that runs on PostgreSQL
// (production) and SQLite (the embedded default of `xiaoclaw dev`); one
// conformance suite tests both. Manager is the write path: it validates,
// writes and publishes a wire.TenancyChange on NATS. OperatorAuth and
// DeviceAuth are the read path: they implement access.Authenticator and
// deviceauth.Authenticator from in-memory caches that the Watcher
// invalidates on every change notification.
package tenancy

import (
	"context"
	"errors"
	"time"
)

// Errors returned by the store and the manager. Callers test with errors.Is.
var (
	// ErrNotFound: no such tenant, token, key or rule within the tenant.
	// Another tenant's object is also "not found", never "forbidden".
	ErrNotFound = errors.New("not found")
	// ErrConflict: the id is taken.
	ErrConflict = errors.New("already exists")
	// ErrInvalid: bad input; the message says which field and why.
	ErrInvalid = errors.New("invalid")
)

// Tenant statuses.
const (
	StatusActive    = "active"
	StatusSuspended = "suspended"
)

// Policy effects, used for rules and for a tenant's default.
const (
	EffectAllow = "allow"
	EffectDeny  = "deny"
)

// Tenant is the isolation unit.
type Tenant struct {
	ID          string `json:"id"`
	DisplayName string `json:"displayName,omitempty"`
	Status      string `json:"status"`
	// DefaultEffect decides a request no policy rule matches.
	DefaultEffect string `json:"defaultEffect"`
	// DeviceAllowlist, when true, admits only devices on the tenant's list.
	DeviceAllowlist bool `json:"deviceAllowlist"`
	// Limits are the tenant's shares of each shim replica.
	Limits    Limits    `json:"limits"`
	Version   int64     `json:"version"`
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`

	// RequireToolApproval hides and refuses the tools a known node gains
	// (wire.NodeRecord.PendingTools) until an admin approves them.
	RequireToolApproval bool `json:"requireToolApproval"`
}

// Limits bound the node.invoke calls of a tenant in flight on each shim
// replica, in all and to any one device; calls over a limit fail with
// RATE_LIMITED or BUSY and a retry hint. 0 takes the shim's default
// (--tenant-max-inflight, --device-max-inflight).
type Limits struct {
	MaxInflight          int `json:"maxInflight"`
	MaxInflightPerDevice int `json:"maxInflightPerDevice"`
}

// TenantUpdate names the fields to change; nil leaves a field as it is.
type TenantUpdate struct {
	DisplayName   *string
	Status        *string
	DefaultEffect *string
	// MaxInflight and MaxInflightPerDevice set Limits; 0 restores the
	// shim's default.
	MaxInflight          *int
	MaxInflightPerDevice *int
	// RequireToolApproval switches the approval of tools nodes gain.
	RequireToolApproval *bool
}

// Token is an operator API token as stored: the secret itself is never
// kept, only the SHA-256 of the whole token string.
type Token struct {
	ID         string    `json:"id"`
	Tenant     string    `json:"tenant"`
	Name       string    `json:"name,omitempty"`
	Role       string    `json:"role"`
	SecretHash string    `json:"-"`
	CreatedAt  time.Time `json:"createdAt"`
	ExpiresAt  time.Time `json:"expiresAt,omitzero"` // zero: never
	RevokedAt  time.Time `json:"revokedAt,omitzero"` // zero: not revoked
}

// Usable reports whether the token may authenticate at now.
func (t Token) Usable(now time.Time) bool {
	return t.RevokedAt.IsZero() && (t.ExpiresAt.IsZero() || now.Before(t.ExpiresAt))
}

// DeviceKey is a per-tenant HMAC key. The key id names the tenant; the
// secret signs device tokens and MQTT passwords.
type DeviceKey struct {
	ID        string    `json:"id"`
	Tenant    string    `json:"tenant"`
	Secret    string    `json:"-"`
	CreatedAt time.Time `json:"createdAt"`
	RetireAt  time.Time `json:"retireAt,omitzero"` // zero: never
}

// Active reports whether the key still verifies at now.
func (k DeviceKey) Active(now time.Time) bool { return k.RetireAt.IsZero() || now.Before(k.RetireAt) }

// Rule is a policy rule as stored; pkg/policy defines and checks its syntax.
type Rule struct {
	ID          string    `json:"id"`
	Tenant      string    `json:"tenant"`
	Effect      string    `json:"effect"`
	Subject     string    `json:"subject"`
	Object      string    `json:"object"`
	Action      string    `json:"action"`
	When        string    `json:"when,omitempty"`
	Description string    `json:"description,omitempty"`
	CreatedAt   time.Time `json:"createdAt"`
}

// Store persists tenants and everything they own. Every mutation of a
// tenant's data bumps that tenant's version in the same transaction.
// Lookups scoped by tenant answer ErrNotFound for another tenant's object.
type Store interface {
	CreateTenant(ctx context.Context, t Tenant) error
	Tenant(ctx context.Context, id string) (Tenant, error)
	Tenants(ctx context.Context) ([]Tenant, error)
	UpdateTenant(ctx context.Context, id string, u TenantUpdate, at time.Time) (Tenant, error)
	// TenantVersions maps every tenant id to its current version.
	TenantVersions(ctx context.Context) (map[string]int64, error)

	CreateToken(ctx context.Context, t Token) error
	// Token looks a token up by id alone: ids are unique across tenants.
	Token(ctx context.Context, id string) (Token, error)
	Tokens(ctx context.Context, tenant string) ([]Token, error)
	// RevokeToken marks the token revoked at at; revoking twice keeps the
	// first time.
	RevokeToken(ctx context.Context, tenant, id string, at time.Time) (Token, error)

	CreateDeviceKey(ctx context.Context, k DeviceKey) error
	// DeviceKey looks a key up by id alone: ids are unique across tenants.
	DeviceKey(ctx context.Context, id string) (DeviceKey, error)
	DeviceKeys(ctx context.Context, tenant string) ([]DeviceKey, error)
	// RotateDeviceKeys adds k and, in the same transaction, makes every
	// other key of k.Tenant retire no later than retireAt.
	RotateDeviceKeys(ctx context.Context, k DeviceKey, retireAt time.Time) ([]DeviceKey, error)

	// Allowlist returns whether the tenant's allowlist is enforced and the
	// canonical device ids on it, sorted.
	Allowlist(ctx context.Context, tenant string) (enabled bool, devices []string, err error)
	SetAllowlist(ctx context.Context, tenant string, enabled bool, devices []string, at time.Time) error

	AddRule(ctx context.Context, r Rule) error
	// Rules returns the tenant's rules in the order they were added.
	Rules(ctx context.Context, tenant string) ([]Rule, error)
	RemoveRule(ctx context.Context, tenant, id string, at time.Time) error

	// SetGroup replaces the members of a node group; no nodes deletes it.
	SetGroup(ctx context.Context, tenant, group string, nodes []string, at time.Time) error
	// Groups maps each group name of the tenant to its sorted node ids.
	Groups(ctx context.Context, tenant string) (map[string][]string, error)

	// CreateUpstream stores an OpenClaw gateway the tenant publishes to;
	// ErrConflict if the name is taken within the tenant.
	CreateUpstream(ctx context.Context, u Upstream) error
	Upstream(ctx context.Context, tenant, name string) (Upstream, error)
	// Upstreams returns the tenant's upstreams sorted by name.
	Upstreams(ctx context.Context, tenant string) ([]Upstream, error)
	// UpstreamTenants returns the tenants that have an upstream, sorted.
	UpstreamTenants(ctx context.Context) ([]string, error)
	DeleteUpstream(ctx context.Context, tenant, name string, at time.Time) error
	// SetUpstreamCaller replaces the upstream's caller hash if it is still
	// old, and reports whether it did.
	SetUpstreamCaller(ctx context.Context, tenant, name, old, hash string, at time.Time) (bool, error)

	Close() error
}
