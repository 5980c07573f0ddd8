package tenancy

import (
	"context"
	"crypto/hmac"
	"fmt"
	"log/slog"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/deviceauth"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// DeviceAuthConfig configures DeviceAuth.
type DeviceAuthConfig struct {
	CacheConfig
	// TokenTTL is how long a WebSocket token verifies after it was minted;
	// 0 means 30 days (as xiaozhi-esp32-server).
	TokenTTL time.Duration
	// ClockSkew is how far in the future a token's timestamp may lie;
	// 0 means 5 minutes.
	ClockSkew time.Duration
	// LegacyTenant, if set, is the single tenant whose active keys verify
	// credentials without a key id: the xiaozhi-esp32-server token
	// "<sig>.<ts>" and MQTT usernames without "kid". Empty rejects them.
	LegacyTenant string
}

// DeviceAuth verifies device credentials signed with per-tenant HMAC device
// keys and mints them for the OTA endpoint. It implements
// deviceauth.Authenticator and ChangeHandler.
type DeviceAuth struct {
	store   Store
	cfg     DeviceAuthConfig
	log     *slog.Logger
	keys    *cache[DeviceKey]
	tenants *cache[deviceTenant]
}

// deviceTenant is what device authentication needs of a tenant.
type deviceTenant struct {
	tenant    Tenant
	keys      []DeviceKey
	allowlist map[string]bool // nil when the tenant enforces none
}

var _ deviceauth.Authenticator = (*DeviceAuth)(nil)

// NewDeviceAuth returns a device authenticator over store.
func NewDeviceAuth(store Store, cfg DeviceAuthConfig, log *slog.Logger) (*DeviceAuth, error) {
	cfg.setDefaults()
	if cfg.TokenTTL <= 0 {
		cfg.TokenTTL = 30 * 24 * time.Hour
	}
	if cfg.ClockSkew <= 0 {
		cfg.ClockSkew = 5 * time.Minute
	}
	if cfg.LegacyTenant != "" {
		if err := wire.ValidTenant(cfg.LegacyTenant); err != nil {
			return nil, fmt.Errorf("tenancy: legacy tenant: %w", err)
		}
	}
	return &DeviceAuth{
		store:   store,
		cfg:     cfg,
		log:     log,
		keys:    newCache[DeviceKey](cfg.MaxAge, cfg.MaxEntries, cfg.Now),
		tenants: newCache[deviceTenant](cfg.MaxAge, cfg.MaxEntries, cfg.Now),
	}, nil
}

func unauthenticated(reason string) error {
	return fmt.Errorf("%w: %s", deviceauth.ErrUnauthenticated, reason)
}

// AuthenticateDevice verifies a WebSocket bearer token or MQTT password and
// returns the tenant. A failure wraps deviceauth.ErrUnauthenticated with the
// reason, for logs; any other error means the store could not be asked.
func (a *DeviceAuth) AuthenticateDevice(ctx context.Context, c deviceauth.Credentials) (string, error) {
	var (
		kid, device string
		verify      func(DeviceKey) bool
	)
	now := a.cfg.Now()
	switch c.Transport {
	case wire.TransportMQTT:
		var err error
		if kid, err = ParseMQTTUsername(c.Username); err != nil {
			return "", unauthenticated(err.Error())
		}
		sig, err := ParseMQTTPassword(c.Password)
		if err != nil {
			return "", unauthenticated(err.Error())
		}
		if len(c.ClientID) > maxClientIDLen {
			return "", unauthenticated("MQTT client id too long")
		}
		device = c.DeviceID
		if device == "" {
			device = DeviceFromMQTTClientID(c.ClientID)
		}
		verify = func(k DeviceKey) bool {
			want, _ := ParseMQTTPassword(MQTTPassword(k.Secret, c.ClientID, c.Username))
			return hmac.Equal(want, sig)
		}
	default: // WebSocket, or any transport presenting a bearer token
		tok, err := ParseDeviceToken(c.Token)
		if err != nil {
			return "", unauthenticated(err.Error())
		}
		minted := time.Unix(tok.TS, 0)
		if minted.After(now.Add(a.cfg.ClockSkew)) {
			return "", unauthenticated("device token minted in the future")
		}
		if !now.Before(minted.Add(a.cfg.TokenTTL)) {
			return "", unauthenticated("device token expired")
		}
		kid, device = tok.KeyID, c.DeviceID
		verify = func(k DeviceKey) bool {
			return hmac.Equal(deviceTokenMAC(k.Secret, c.ClientID, c.DeviceID, tok.TS), tok.Sig)
		}
	}

	tenant, err := a.verifyWithKeys(ctx, kid, now, verify)
	if err != nil {
		return "", err
	}
	if err := a.admit(ctx, tenant, device); err != nil {
		return "", err
	}
	return tenant, nil
}

// verifyWithKeys finds the keys that may have signed (the named key, or
// the legacy tenant's active keys) and returns the tenant of the one that
// verifies.
func (a *DeviceAuth) verifyWithKeys(ctx context.Context, kid string, now time.Time, verify func(DeviceKey) bool) (string, error) {
	if kid == "" {
		if a.cfg.LegacyTenant == "" {
			return "", unauthenticated("credential names no key id and no legacy tenant is configured")
		}
		dt, found, err := a.tenant(ctx, a.cfg.LegacyTenant)
		if err != nil {
			return "", err
		}
		if found {
			for _, k := range dt.keys {
				if k.Active(now) && verify(k) {
					return k.Tenant, nil
				}
			}
		}
		return "", unauthenticated("no active key of the legacy tenant verifies")
	}
	k, found, err := a.keys.get(ctx, kid, a.store.DeviceKey)
	if err != nil {
		return "", fmt.Errorf("tenancy: device key lookup: %w", err)
	}
	if !found {
		return "", unauthenticated("unknown key id")
	}
	if !k.Active(now) {
		return "", unauthenticated("key retired")
	}
	if !verify(k) {
		return "", unauthenticated("bad signature")
	}
	return k.Tenant, nil
}

// admit checks the tenant is active and, if it keeps an allowlist, that
// the device is on it.
func (a *DeviceAuth) admit(ctx context.Context, tenant, device string) error {
	dt, found, err := a.tenant(ctx, tenant)
	if err != nil {
		return err
	}
	if !found || dt.tenant.Status != StatusActive {
		return unauthenticated("tenant suspended or unknown")
	}
	if dt.allowlist == nil {
		return nil
	}
	canon, err := wire.CanonicalDevice(device)
	if err != nil || !dt.allowlist[canon] {
		return unauthenticated("device not on the tenant's allowlist")
	}
	return nil
}

// RecheckDevice tells whether a connected device of tenant may keep its
// session: the tenant is active and, if it keeps an allowlist, the device
// is still on it. A devicehub calls it after a change notification.
func (a *DeviceAuth) RecheckDevice(ctx context.Context, tenant, deviceID string) error {
	return a.admit(ctx, tenant, deviceID)
}

func (a *DeviceAuth) tenant(ctx context.Context, tenant string) (deviceTenant, bool, error) {
	dt, found, err := a.tenants.get(ctx, tenant, a.loadTenant)
	if err != nil {
		return deviceTenant{}, false, fmt.Errorf("tenancy: tenant lookup: %w", err)
	}
	return dt, found, nil
}

func (a *DeviceAuth) loadTenant(ctx context.Context, id string) (deviceTenant, error) {
	t, err := a.store.Tenant(ctx, id)
	if err != nil {
		return deviceTenant{}, err
	}
	keys, err := a.store.DeviceKeys(ctx, id)
	if err != nil {
		return deviceTenant{}, err
	}
	dt := deviceTenant{tenant: t, keys: keys}
	enabled, devices, err := a.store.Allowlist(ctx, id)
	if err != nil {
		return deviceTenant{}, err
	}
	if enabled {
		dt.allowlist = make(map[string]bool, len(devices))
		for _, d := range devices {
			dt.allowlist[d] = true
		}
	}
	return dt, nil
}

// signingKey picks the key new credentials are minted with: the newest
// active key that is not scheduled to retire, else the newest active key.
func (a *DeviceAuth) signingKey(ctx context.Context, tenant string) (DeviceKey, error) {
	dt, found, err := a.tenant(ctx, tenant)
	if err != nil {
		return DeviceKey{}, err
	}
	if !found {
		return DeviceKey{}, fmt.Errorf("tenant %q: %w", tenant, ErrNotFound)
	}
	if dt.tenant.Status != StatusActive {
		return DeviceKey{}, fmt.Errorf("%w: tenant %q is suspended", ErrInvalid, tenant)
	}
	now := a.cfg.Now()
	var best DeviceKey
	for _, k := range dt.keys {
		if !k.Active(now) {
			continue
		}
		if best.ID == "" || preferForSigning(k, best) {
			best = k
		}
	}
	if best.ID == "" {
		return DeviceKey{}, fmt.Errorf("tenant %q has no active device key: %w", tenant, ErrNotFound)
	}
	return best, nil
}

// preferForSigning orders keys for minting: a key that will not retire
// beats one that will; then the newer key wins.
func preferForSigning(k, than DeviceKey) bool {
	if k.RetireAt.IsZero() != than.RetireAt.IsZero() {
		return k.RetireAt.IsZero()
	}
	if !k.CreatedAt.Equal(than.CreatedAt) {
		return k.CreatedAt.After(than.CreatedAt)
	}
	return k.ID > than.ID
}

// MintDeviceToken returns a WebSocket bearer token "<kid>.<sig>.<ts>" for
// the device, valid for TokenTTL. clientID and deviceID must be the
// Client-Id and Device-Id headers the device will send.
func (a *DeviceAuth) MintDeviceToken(ctx context.Context, tenant, clientID, deviceID string) (string, error) {
	if clientID == "" || deviceID == "" {
		return "", fmt.Errorf("%w: client id and device id are required", ErrInvalid)
	}
	k, err := a.signingKey(ctx, tenant)
	if err != nil {
		return "", err
	}
	return FormatDeviceToken(k.ID, k.Secret, clientID, deviceID, a.cfg.Now()), nil
}

// MintMQTTCredentials returns the MQTT username (naming the key) and
// password for the MQTT client id.
func (a *DeviceAuth) MintMQTTCredentials(ctx context.Context, tenant, clientID string) (username, password string, err error) {
	if clientID == "" || len(clientID) > maxClientIDLen {
		return "", "", fmt.Errorf("%w: client id must be 1-%d characters", ErrInvalid, maxClientIDLen)
	}
	k, err := a.signingKey(ctx, tenant)
	if err != nil {
		return "", "", err
	}
	username = FormatMQTTUsername(k.ID)
	return username, MQTTPassword(k.Secret, clientID, username), nil
}

// TenancyChanged drops what the change may have made stale.
func (a *DeviceAuth) TenancyChanged(c wire.TenancyChange) {
	switch c.Kind {
	case wire.ChangeDeviceKey:
		a.keys.drop(c.ID)
		a.tenants.drop(c.Tenant) // the tenant's key list
		// Rotation changes the retire time of the tenant's other keys.
		a.keys.dropWhere(func(_ string, k DeviceKey, found bool) bool { return found && k.Tenant == c.Tenant })
	case wire.ChangeAllowlist:
		a.tenants.drop(c.Tenant)
	case wire.ChangeTenant, wire.ChangeResync:
		a.tenants.drop(c.Tenant)
		a.keys.dropWhere(func(_ string, k DeviceKey, found bool) bool { return !found || k.Tenant == c.Tenant })
	}
}
