// Package activation binds XiaoZhi devices to tenants with the 6-digit codes
// they show: the devicehub's OTA endpoint issues a code for an unknown
// device, an operator binds it to a tenant through the admin API, and every
// hub then knows the device's tenant. Codes live in a JetStream KV bucket
// (wire.BucketActivation) so hubs and gateways share them; an in-memory
// store serves a single process.
package activation

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// Record is a device waiting for an operator to bind it to a tenant
// (Code set), or a device bound to one (Tenant set).
type Record struct {
	Device    string    `json:"device"`              // canonical device id
	DeviceRaw string    `json:"deviceRaw,omitempty"` // Device-Id as sent
	ClientID  string    `json:"clientId,omitempty"`
	Code      string    `json:"code,omitempty"` // 6 digits while pending
	Challenge string    `json:"challenge,omitempty"`
	Tenant    string    `json:"tenant,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
	ExpiresAt time.Time `json:"expiresAt,omitzero"` // of the code
	BoundAt   time.Time `json:"boundAt,omitzero"`
}

// Bound reports whether the device belongs to a tenant.
func (a Record) Bound() bool { return a.Tenant != "" }

// ErrNotFound: no pending activation has that code (unknown or
// expired), or the device has none.
var ErrNotFound = errors.New("no pending activation with that code")

// Store binds devices to tenants with activation codes. The OTA
// endpoint asks TenantOf for every device and Request for unknown ones; an
// operator binds a code with Bind (the admin API: `xiaoclaw device
// activate CODE --tenant T`). Implementations are safe for concurrent use.
type Store interface {
	// TenantOf returns the tenant the device (canonical id) is bound to,
	// or "" when it is bound to none.
	TenantOf(ctx context.Context, device string) (string, error)
	// Lookup returns the device's activation, bound or pending with a
	// valid code; ErrNotFound otherwise.
	Lookup(ctx context.Context, device string) (Record, error)
	// Request returns the device's activation: the bound one, the pending
	// one while its code is valid, else a new pending one with a fresh
	// code and challenge.
	Request(ctx context.Context, device, deviceRaw, clientID string) (Record, error)
	// Pending returns the pending activation of code, or
	// ErrNotFound.
	Pending(ctx context.Context, code string) (Record, error)
	// Bind binds the device waiting under code to tenant and returns the
	// bound activation; the code is used up. ErrNotFound when
	// no valid code matches.
	Bind(ctx context.Context, code, tenant string) (Record, error)
}

// Config tunes the Store implementations.
type Config struct {
	// CodeTTL is how long a code stays valid; default 1 h. A device asks
	// again at its next OTA request and gets a new one.
	CodeTTL time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
}

func (c *Config) setDefaults() {
	if c.CodeTTL <= 0 {
		c.CodeTTL = time.Hour
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// NewMemory keeps activations in this process: enough for one
// hub (xiaoclaw dev). Use NewKV to share them across hubs and
// the gateway's admin API.
func NewMemory(cfg Config) Store {
	cfg.setDefaults()
	return &activations{cfg: cfg, store: &memoryKV{m: map[string]memoryEntry{}}}
}

// NewKV keeps activations in the JetStream KV bucket
// wire.BucketActivation (created if missing), so that every hub and the
// admin API of another process see the same codes and bindings.
func NewKV(ctx context.Context, js jetstream.JetStream, cfg Config) (Store, error) {
	cfg.setDefaults()
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      wire.BucketActivation,
		Description: "xiaoclaw device activations: device.<id> -> record, code.<code> -> device",
		History:     1,
		Storage:     jetstream.FileStorage,
	})
	if err != nil {
		return nil, fmt.Errorf("activation bucket %s: %w", wire.BucketActivation, err)
	}
	return &activations{cfg: cfg, store: natsKV{kv}}, nil
}

// activations implements Store over a compare-and-set key-value store.
type activations struct {
	cfg   Config
	store casStore
}

func deviceKeyOf(device string) string { return "device." + device }
func codeKeyOf(code string) string     { return "code." + code }

func (a *activations) get(ctx context.Context, device string) (Record, uint64, error) {
	raw, rev, err := a.store.get(ctx, deviceKeyOf(device))
	if err != nil {
		return Record{}, 0, err
	}
	var act Record
	if err := json.Unmarshal(raw, &act); err != nil {
		return Record{}, 0, fmt.Errorf("activation record of %s: %w", device, err)
	}
	return act, rev, nil
}

func (a *activations) TenantOf(ctx context.Context, device string) (string, error) {
	act, _, err := a.get(ctx, device)
	if errors.Is(err, errNoKey) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return act.Tenant, nil
}

func (a *activations) Lookup(ctx context.Context, device string) (Record, error) {
	act, _, err := a.get(ctx, device)
	if errors.Is(err, errNoKey) || err == nil && !act.Bound() && !a.cfg.Now().Before(act.ExpiresAt) {
		return Record{}, ErrNotFound
	}
	return act, err
}

func (a *activations) Request(ctx context.Context, device, deviceRaw, clientID string) (Record, error) {
	if c, err := wire.CanonicalDevice(device); err != nil || c != device {
		return Record{}, fmt.Errorf("device %q is not a canonical device id", device)
	}
	for attempt := 0; attempt < 5; attempt++ {
		now := a.cfg.Now()
		old, rev, err := a.get(ctx, device)
		switch {
		case err == nil && (old.Bound() || now.Before(old.ExpiresAt)):
			return old, nil
		case err != nil && !errors.Is(err, errNoKey):
			return Record{}, err
		}
		act := Record{Device: device, DeviceRaw: deviceRaw, ClientID: clientID, Challenge: randomHex(16),
			CreatedAt: now, ExpiresAt: now.Add(a.cfg.CodeTTL)}
		if act.Code, err = a.reserveCode(ctx, device); err != nil {
			return Record{}, err
		}
		data, _ := json.Marshal(act)
		if rev == 0 {
			_, err = a.store.create(ctx, deviceKeyOf(device), data)
		} else {
			_, err = a.store.update(ctx, deviceKeyOf(device), data, rev)
		}
		if errors.Is(err, errConflict) {
			_ = a.store.delete(ctx, codeKeyOf(act.Code)) // another hub was faster; use its record
			continue
		}
		if err != nil {
			_ = a.store.delete(ctx, codeKeyOf(act.Code))
			return Record{}, err
		}
		if rev != 0 && old.Code != "" {
			_ = a.store.delete(ctx, codeKeyOf(old.Code)) // the expired code
		}
		return act, nil
	}
	return Record{}, errors.New("activation record keeps changing; try again")
}

// reserveCode claims an unused 6-digit code for device.
func (a *activations) reserveCode(ctx context.Context, device string) (string, error) {
	for range 20 {
		var b [4]byte
		_, _ = rand.Read(b[:])
		code := fmt.Sprintf("%06d", binary.BigEndian.Uint32(b[:])%1000000)
		_, err := a.store.create(ctx, codeKeyOf(code), []byte(device))
		if err == nil {
			return code, nil
		}
		if !errors.Is(err, errConflict) {
			return "", err
		}
		// The code is taken; a stale one (its device moved on) is freed here.
		if a.staleCode(ctx, code) {
			_ = a.store.delete(ctx, codeKeyOf(code))
		}
	}
	return "", errors.New("no free activation code found")
}

// staleCode reports whether code no longer belongs to a pending activation.
func (a *activations) staleCode(ctx context.Context, code string) bool {
	_, err := a.Pending(ctx, code)
	return errors.Is(err, ErrNotFound)
}

func (a *activations) Pending(ctx context.Context, code string) (Record, error) {
	act, _, err := a.pending(ctx, code)
	return act, err
}

func (a *activations) pending(ctx context.Context, code string) (Record, uint64, error) {
	if !validCode(code) {
		return Record{}, 0, ErrNotFound
	}
	device, _, err := a.store.get(ctx, codeKeyOf(code))
	if errors.Is(err, errNoKey) {
		return Record{}, 0, ErrNotFound
	}
	if err != nil {
		return Record{}, 0, err
	}
	act, rev, err := a.get(ctx, string(device))
	if errors.Is(err, errNoKey) {
		return Record{}, 0, ErrNotFound
	}
	if err != nil {
		return Record{}, 0, err
	}
	if act.Bound() || act.Code != code || !a.cfg.Now().Before(act.ExpiresAt) {
		return Record{}, 0, ErrNotFound
	}
	return act, rev, nil
}

func (a *activations) Bind(ctx context.Context, code, tenant string) (Record, error) {
	if err := wire.ValidTenant(tenant); err != nil {
		return Record{}, err
	}
	act, rev, err := a.pending(ctx, code)
	if err != nil {
		return Record{}, err
	}
	act.Tenant, act.Code, act.Challenge, act.ExpiresAt, act.BoundAt = tenant, "", "", time.Time{}, a.cfg.Now()
	data, _ := json.Marshal(act)
	if _, err := a.store.update(ctx, deviceKeyOf(act.Device), data, rev); err != nil {
		if errors.Is(err, errConflict) {
			return Record{}, ErrNotFound // bound or renewed meanwhile
		}
		return Record{}, err
	}
	_ = a.store.delete(ctx, codeKeyOf(code))
	return act, nil
}

func validCode(code string) bool {
	if len(code) != 6 {
		return false
	}
	for i := 0; i < len(code); i++ {
		if code[i] < '0' || code[i] > '9' {
			return false
		}
	}
	return true
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// casStore is the little a key-value store needs for activations.
type casStore interface {
	get(ctx context.Context, key string) ([]byte, uint64, error)                    // errNoKey
	create(ctx context.Context, key string, val []byte) (uint64, error)             // errConflict if present
	update(ctx context.Context, key string, val []byte, rev uint64) (uint64, error) // errConflict if rev is stale
	delete(ctx context.Context, key string) error
}

var (
	errNoKey    = errors.New("no such key")
	errConflict = errors.New("key changed concurrently")
)

type memoryEntry struct {
	val []byte
	rev uint64
}

type memoryKV struct {
	mu  sync.Mutex
	m   map[string]memoryEntry
	rev uint64
}

func (m *memoryKV) get(_ context.Context, key string) ([]byte, uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.m[key]
	if !ok {
		return nil, 0, errNoKey
	}
	return e.val, e.rev, nil
}

func (m *memoryKV) create(_ context.Context, key string, val []byte) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.m[key]; ok {
		return 0, errConflict
	}
	m.rev++
	m.m[key] = memoryEntry{val, m.rev}
	return m.rev, nil
}

func (m *memoryKV) update(_ context.Context, key string, val []byte, rev uint64) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.m[key]; !ok || e.rev != rev {
		return 0, errConflict
	}
	m.rev++
	m.m[key] = memoryEntry{val, m.rev}
	return m.rev, nil
}

func (m *memoryKV) delete(_ context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, key)
	return nil
}

type natsKV struct{ kv jetstream.KeyValue }

func (n natsKV) get(ctx context.Context, key string) ([]byte, uint64, error) {
	e, err := n.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, errNoKey
	}
	if err != nil {
		return nil, 0, err
	}
	return e.Value(), e.Revision(), nil
}

func (n natsKV) create(ctx context.Context, key string, val []byte) (uint64, error) {
	rev, err := n.kv.Create(ctx, key, val)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, errConflict
	}
	return rev, err
}

func (n natsKV) update(ctx context.Context, key string, val []byte, rev uint64) (uint64, error) {
	r, err := n.kv.Update(ctx, key, val, rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return 0, errConflict
	}
	return r, err
}

func (n natsKV) delete(ctx context.Context, key string) error {
	err := n.kv.Delete(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil
	}
	return err
}
