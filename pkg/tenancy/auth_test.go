package tenancy_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/deviceauth"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy/tenancytest"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// clock is a test clock the tests move by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 11, 1, 12, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// countingStore counts the lookups that authentication makes.
type countingStore struct {
	tenancy.Store
	tokenLoads, keyLoads, tenantLoads atomic.Int64
	fail                              atomic.Bool
}

var errDown = errors.New("database down")

func (s *countingStore) Token(ctx context.Context, id string) (tenancy.Token, error) {
	s.tokenLoads.Add(1)
	if s.fail.Load() {
		return tenancy.Token{}, errDown
	}
	return s.Store.Token(ctx, id)
}

func (s *countingStore) DeviceKey(ctx context.Context, id string) (tenancy.DeviceKey, error) {
	s.keyLoads.Add(1)
	if s.fail.Load() {
		return tenancy.DeviceKey{}, errDown
	}
	return s.Store.DeviceKey(ctx, id)
}

func (s *countingStore) Tenant(ctx context.Context, id string) (tenancy.Tenant, error) {
	s.tenantLoads.Add(1)
	if s.fail.Load() {
		return tenancy.Tenant{}, errDown
	}
	return s.Store.Tenant(ctx, id)
}

func acceptRule(*tenancy.Rule) error { return nil }

type fixture struct {
	store *countingStore
	mgr   *tenancy.Manager
	clock *clock
	ops   *tenancy.OperatorAuth
	devs  *tenancy.DeviceAuth
}

// newFixture wires a manager and both authenticators on one SQLite store;
// the manager's notifications go straight to the authenticators.
func newFixture(t testing.TB, legacyTenant string) *fixture {
	t.Helper()
	f := &fixture{store: &countingStore{Store: tenancytest.SQLite(t)}, clock: newClock()}
	f.ops = tenancy.NewOperatorAuth(f.store, tenancy.CacheConfig{Now: f.clock.Now}, quiet)
	var err error
	f.devs, err = tenancy.NewDeviceAuth(f.store, tenancy.DeviceAuthConfig{CacheConfig: tenancy.CacheConfig{Now: f.clock.Now},
		LegacyTenant: legacyTenant}, quiet)
	if err != nil {
		t.Fatal(err)
	}
	f.mgr, err = tenancy.NewManager(tenancy.ManagerConfig{Store: f.store, CheckRule: acceptRule, Now: f.clock.Now, Log: quiet,
		Notify: func(_ context.Context, c wire.TenancyChange) error {
			f.ops.TenancyChanged(c)
			f.devs.TenancyChanged(c)
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) tenant(t *testing.T, id string) {
	t.Helper()
	if _, err := f.mgr.CreateTenant(context.Background(), tenancy.TenantSpec{ID: id}); err != nil {
		t.Fatal(err)
	}
}

func (f *fixture) key(t *testing.T, tenant string) tenancy.DeviceKey {
	t.Helper()
	k, err := f.mgr.CreateDeviceKey(context.Background(), tenant)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestOperatorTokenLifecycle(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "")
	f.tenant(t, "acme")
	rec, secret, err := f.mgr.IssueToken(ctx, "acme", tenancy.TokenSpec{Name: "ci", Role: access.RoleOperator, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// Stored hashed: the record holds the SHA-256 of the token, never the token.
	stored, _ := f.store.Store.Token(ctx, rec.ID)
	sum := sha256.Sum256([]byte(secret))
	if stored.SecretHash != hex.EncodeToString(sum[:]) || strings.Contains(stored.SecretHash, secret) {
		t.Fatalf("stored hash %q is not the SHA-256 of the token", stored.SecretHash)
	}
	if !strings.HasPrefix(secret, "xco_"+strings.TrimPrefix(rec.ID, "tok_")+"_") {
		t.Fatalf("token %q does not carry its id %s", secret, rec.ID)
	}
	p, err := f.ops.AuthenticateOperator(ctx, secret)
	want := access.Principal{Tenant: "acme", ID: rec.ID, Name: "ci", Role: access.RoleOperator}
	if err != nil || p != want {
		t.Fatalf("authenticate = %+v, %v; want %+v", p, err, want)
	}
	// The same id with another secret fails.
	forged := secret[:len(secret)-1] + "a"
	if strings.HasSuffix(secret, "a") {
		forged = secret[:len(secret)-1] + "b"
	}
	if _, err := f.ops.AuthenticateOperator(ctx, forged); !errors.Is(err, access.ErrUnauthenticated) {
		t.Fatalf("forged secret: %v", err)
	}
	for _, bad := range []string{"", "xco_", "Bearer " + secret, secret + "x", "tok_" + secret[4:]} {
		if _, err := f.ops.AuthenticateOperator(ctx, bad); !errors.Is(err, access.ErrUnauthenticated) {
			t.Fatalf("malformed token %q: %v", bad, err)
		}
	}
	if err := f.ops.Recheck(ctx, p); err != nil {
		t.Fatalf("recheck of a good principal: %v", err)
	}

	// Expiry.
	f.clock.Add(time.Hour)
	if _, err := f.ops.AuthenticateOperator(ctx, secret); !errors.Is(err, access.ErrUnauthenticated) {
		t.Fatalf("expired token: %v", err)
	}
	if err := f.ops.Recheck(ctx, p); !errors.Is(err, access.ErrUnauthenticated) {
		t.Fatalf("recheck of an expired token: %v", err)
	}

	// Revocation.
	_, secret2, _ := f.mgr.IssueToken(ctx, "acme", tenancy.TokenSpec{Role: access.RoleAdmin})
	p2, err := f.ops.AuthenticateOperator(ctx, secret2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.mgr.RevokeToken(ctx, "acme", p2.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ops.AuthenticateOperator(ctx, secret2); !errors.Is(err, access.ErrUnauthenticated) {
		t.Fatalf("revoked token: %v", err)
	}
	if err := f.ops.Recheck(ctx, p2); !errors.Is(err, access.ErrUnauthenticated) {
		t.Fatalf("recheck of a revoked token: %v", err)
	}

	// Suspension cuts every token and even a static principal of the tenant.
	_, secret3, _ := f.mgr.IssueToken(ctx, "acme", tenancy.TokenSpec{Role: access.RoleViewer})
	if _, err := f.ops.AuthenticateOperator(ctx, secret3); err != nil {
		t.Fatal(err)
	}
	if _, err := f.mgr.SuspendTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ops.AuthenticateOperator(ctx, secret3); !errors.Is(err, access.ErrUnauthenticated) {
		t.Fatalf("token of a suspended tenant: %v", err)
	}
	static := access.Principal{Tenant: "acme", ID: "dev-operator", Role: access.RoleOperator}
	if err := f.ops.Recheck(ctx, static); !errors.Is(err, access.ErrUnauthenticated) {
		t.Fatalf("recheck of a static principal of a suspended tenant: %v", err)
	}
	if _, err := f.mgr.ResumeTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.ops.AuthenticateOperator(ctx, secret3); err != nil {
		t.Fatalf("token after resume: %v", err)
	}
}

func TestOperatorAuthNoStoreRoundTripAfterFirst(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "")
	f.tenant(t, "acme")
	_, secret, _ := f.mgr.IssueToken(ctx, "acme", tenancy.TokenSpec{Role: access.RoleOperator})
	for range 100 {
		if _, err := f.ops.AuthenticateOperator(ctx, secret); err != nil {
			t.Fatal(err)
		}
	}
	if n := f.store.tokenLoads.Load(); n != 1 {
		t.Fatalf("100 authentications made %d token lookups, want 1", n)
	}
	// Unknown ids are remembered too, until a token with that id appears.
	unknown := "xco_aaaaaaaaaaaaaaaa_" + strings.Repeat("a", 52)
	for range 10 {
		if _, err := f.ops.AuthenticateOperator(ctx, unknown); !errors.Is(err, access.ErrUnauthenticated) {
			t.Fatal(err)
		}
	}
	if n := f.store.tokenLoads.Load(); n != 2 {
		t.Fatalf("10 attempts with an unknown id made %d lookups, want 1", n-1)
	}
	// A store failure is not an authentication failure.
	f.store.fail.Store(true)
	other := "xco_bbbbbbbbbbbbbbbb_" + strings.Repeat("b", 52)
	if _, err := f.ops.AuthenticateOperator(ctx, other); err == nil || errors.Is(err, access.ErrUnauthenticated) {
		t.Fatalf("store down: got %v, want a non-authentication error", err)
	}
	// ...and is not cached: once the store is back, the same token works.
	f.store.fail.Store(false)
	if _, err := f.ops.AuthenticateOperator(ctx, secret); err != nil {
		t.Fatal(err)
	}
}

func TestDeviceTokenWebSocket(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "")
	f.tenant(t, "acme")
	f.tenant(t, "beta")
	ka := f.key(t, "acme")
	kb := f.key(t, "beta")
	const client, device = "3b1c1e6e-0000-4000-8000-000000000001", "AA:BB:CC:DD:EE:FF"
	tok, err := f.devs.MintDeviceToken(ctx, "acme", client, device)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tok, ka.ID+".") {
		t.Fatalf("token %q does not name key %s", tok, ka.ID)
	}
	creds := deviceauth.Credentials{Transport: wire.TransportWebSocket, Token: tok, ClientID: client, DeviceID: device}
	if tenant, err := f.devs.AuthenticateDevice(ctx, creds); err != nil || tenant != "acme" {
		t.Fatalf("authenticate = %q, %v", tenant, err)
	}
	bad := func(name string, c deviceauth.Credentials) {
		t.Helper()
		if tenant, err := f.devs.AuthenticateDevice(ctx, c); !errors.Is(err, deviceauth.ErrUnauthenticated) {
			t.Fatalf("%s: got %q, %v; want ErrUnauthenticated", name, tenant, err)
		}
	}
	other := creds
	other.DeviceID = "AA:BB:CC:DD:EE:00"
	bad("token presented by another device", other)
	other = creds
	other.ClientID = "someone-else"
	bad("token presented with another client id", other)

	// Cross-tenant: acme's signature under beta's key id does not verify,
	// and a token of beta's key authenticates as beta, never acme.
	parts := strings.SplitN(tok, ".", 2)
	other = creds
	other.Token = kb.ID + "." + parts[1]
	bad("acme's signature under beta's key id", other)
	other.Token = tenancy.FormatDeviceToken(kb.ID, ka.Secret, client, device, f.clock.Now())
	bad("acme's secret under beta's key id", other)
	other.Token = tenancy.FormatDeviceToken(kb.ID, kb.Secret, client, device, f.clock.Now())
	if tenant, err := f.devs.AuthenticateDevice(ctx, other); err != nil || tenant != "beta" {
		t.Fatalf("beta's token: %q, %v", tenant, err)
	}

	// Without a legacy tenant, the key-less form is refused.
	other.Token = tenancy.FormatDeviceToken("", ka.Secret, client, device, f.clock.Now())
	bad("key-less token without a legacy tenant", other)

	// Time window: 30 days by default, 5 minutes of skew.
	other = creds
	other.Token = tenancy.FormatDeviceToken(ka.ID, ka.Secret, client, device, f.clock.Now().Add(10*time.Minute))
	bad("token minted in the future", other)
	other.Token = tenancy.FormatDeviceToken(ka.ID, ka.Secret, client, device, f.clock.Now().Add(2*time.Minute))
	if _, err := f.devs.AuthenticateDevice(ctx, other); err != nil {
		t.Fatalf("token within the clock skew: %v", err)
	}
	f.clock.Add(30 * 24 * time.Hour)
	bad("expired token", creds)
	bad("garbage", deviceauth.Credentials{Token: "not-a-token", ClientID: client, DeviceID: device})
}

func TestDeviceKeyRotationOverlap(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "")
	f.tenant(t, "acme")
	f.key(t, "acme")
	const client, device = "c1", "a1b2c3d4e5f6"
	oldTok, _ := f.devs.MintDeviceToken(ctx, "acme", client, device)
	oldUser, oldPass, _ := f.devs.MintMQTTCredentials(ctx, "acme", "GID_x@@@a1_b2_c3_d4_e5_f6@@@u1")

	fresh, all, err := f.mgr.RotateDeviceKey(ctx, "acme", time.Hour)
	if err != nil || len(all) != 2 {
		t.Fatalf("rotate = %+v, %v", all, err)
	}
	newTok, _ := f.devs.MintDeviceToken(ctx, "acme", client, device)
	if !strings.HasPrefix(newTok, fresh.ID+".") {
		t.Fatalf("after rotation tokens must be minted with the new key, got %q", newTok)
	}
	ws := func(tok string) error {
		_, err := f.devs.AuthenticateDevice(ctx, deviceauth.Credentials{Transport: wire.TransportWebSocket, Token: tok, ClientID: client, DeviceID: device})
		return err
	}
	mqtt := func(u, p string) error {
		_, err := f.devs.AuthenticateDevice(ctx, deviceauth.Credentials{Transport: wire.TransportMQTT,
			ClientID: "GID_x@@@a1_b2_c3_d4_e5_f6@@@u1", Username: u, Password: p})
		return err
	}
	if err := ws(oldTok); err != nil {
		t.Fatalf("old key during the overlap: %v", err)
	}
	if err := mqtt(oldUser, oldPass); err != nil {
		t.Fatalf("old MQTT credentials during the overlap: %v", err)
	}
	f.clock.Add(time.Hour - time.Millisecond)
	if err := ws(oldTok); err != nil {
		t.Fatalf("old key just before its retire time: %v", err)
	}
	f.clock.Add(time.Millisecond)
	if err := ws(oldTok); !errors.Is(err, deviceauth.ErrUnauthenticated) {
		t.Fatalf("old key after its retire time: %v", err)
	}
	if err := mqtt(oldUser, oldPass); !errors.Is(err, deviceauth.ErrUnauthenticated) {
		t.Fatalf("old MQTT credentials after retire: %v", err)
	}
	if err := ws(newTok); err != nil {
		t.Fatalf("new key: %v", err)
	}
	if _, _, err := f.mgr.RotateDeviceKey(ctx, "acme", -time.Second); !errors.Is(err, tenancy.ErrInvalid) {
		t.Fatalf("negative overlap: %v", err)
	}
}

func TestLegacyTokenFormat(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "legacy")
	f.tenant(t, "legacy")
	f.tenant(t, "acme")
	kl := f.key(t, "legacy")
	ka := f.key(t, "acme")
	const client, device = "c1", "aa:bb:cc:dd:ee:ff"
	// The xiaozhi-esp32-server form: <sig>.<ts> with the same signature.
	tok := tenancy.FormatDeviceToken("", kl.Secret, client, device, f.clock.Now())
	if strings.Count(tok, ".") != 1 {
		t.Fatalf("legacy token %q", tok)
	}
	c := deviceauth.Credentials{Transport: wire.TransportWebSocket, Token: tok, ClientID: client, DeviceID: device}
	if tenant, err := f.devs.AuthenticateDevice(ctx, c); err != nil || tenant != "legacy" {
		t.Fatalf("legacy token: %q, %v", tenant, err)
	}
	c.Token = tenancy.FormatDeviceToken("", ka.Secret, client, device, f.clock.Now())
	if _, err := f.devs.AuthenticateDevice(ctx, c); !errors.Is(err, deviceauth.ErrUnauthenticated) {
		t.Fatalf("key-less token signed by another tenant's key: %v", err)
	}
	// The MQTT gateway convention: username is base64 JSON without a kid.
	user := base64.StdEncoding.EncodeToString([]byte(`{"ip":"10.0.0.7"}`))
	const cid = "GID_test@@@aa_bb_cc_dd_ee_ff@@@uuid"
	m := deviceauth.Credentials{Transport: wire.TransportMQTT, ClientID: cid, Username: user, Password: tenancy.MQTTPassword(kl.Secret, cid, user)}
	if tenant, err := f.devs.AuthenticateDevice(ctx, m); err != nil || tenant != "legacy" {
		t.Fatalf("legacy MQTT credentials: %q, %v", tenant, err)
	}
}

func TestMQTTCredentials(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "")
	f.tenant(t, "acme")
	f.tenant(t, "beta")
	f.key(t, "acme")
	kb := f.key(t, "beta")
	const cid = "GID_test@@@aa_bb_cc_dd_ee_ff@@@uuid"
	user, pass, err := f.devs.MintMQTTCredentials(ctx, "acme", cid)
	if err != nil {
		t.Fatal(err)
	}
	c := deviceauth.Credentials{Transport: wire.TransportMQTT, ClientID: cid, Username: user, Password: pass}
	if tenant, err := f.devs.AuthenticateDevice(ctx, c); err != nil || tenant != "acme" {
		t.Fatalf("mqtt: %q, %v", tenant, err)
	}
	for name, mod := range map[string]func(*deviceauth.Credentials){
		"other client id": func(c *deviceauth.Credentials) { c.ClientID = "GID_test@@@aa_bb_cc_dd_ee_00@@@uuid" },
		"other password":  func(c *deviceauth.Credentials) { c.Password = tenancy.MQTTPassword("guess", cid, user) },
		"beta's kid, acme's password": func(c *deviceauth.Credentials) {
			c.Username = tenancy.FormatMQTTUsername(kb.ID)
		},
		"not base64 username": func(c *deviceauth.Credentials) { c.Username = "%%%" },
		"empty password":      func(c *deviceauth.Credentials) { c.Password = "" },
	} {
		cc := c
		mod(&cc)
		if _, err := f.devs.AuthenticateDevice(ctx, cc); !errors.Is(err, deviceauth.ErrUnauthenticated) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, _, err := f.devs.MintMQTTCredentials(ctx, "ghost", cid); !errors.Is(err, tenancy.ErrNotFound) {
		t.Fatalf("mint for an unknown tenant: %v", err)
	}
}

func TestDeviceAllowlist(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "")
	f.tenant(t, "acme")
	f.key(t, "acme")
	if _, err := f.mgr.SetAllowlist(ctx, "acme", true, []string{"AA:BB:CC:DD:EE:FF"}); err != nil {
		t.Fatal(err)
	}
	ws := func(device string) error {
		tok, err := f.devs.MintDeviceToken(ctx, "acme", "c1", device)
		if err != nil {
			return err
		}
		_, err = f.devs.AuthenticateDevice(ctx, deviceauth.Credentials{Transport: wire.TransportWebSocket, Token: tok, ClientID: "c1", DeviceID: device})
		return err
	}
	if err := ws("aa:bb:cc:dd:ee:ff"); err != nil {
		t.Fatalf("listed device (other spelling): %v", err)
	}
	if err := ws("11:22:33:44:55:66"); !errors.Is(err, deviceauth.ErrUnauthenticated) {
		t.Fatalf("unlisted device: %v", err)
	}
	// Over MQTT the device id comes from the client id.
	user, pass, _ := f.devs.MintMQTTCredentials(ctx, "acme", "GID_g@@@aa_bb_cc_dd_ee_ff@@@u")
	if _, err := f.devs.AuthenticateDevice(ctx, deviceauth.Credentials{Transport: wire.TransportMQTT,
		ClientID: "GID_g@@@aa_bb_cc_dd_ee_ff@@@u", Username: user, Password: pass}); err != nil {
		t.Fatalf("listed device over MQTT: %v", err)
	}
	user, pass, _ = f.devs.MintMQTTCredentials(ctx, "acme", "GID_g@@@11_22_33_44_55_66@@@u")
	if _, err := f.devs.AuthenticateDevice(ctx, deviceauth.Credentials{Transport: wire.TransportMQTT,
		ClientID: "GID_g@@@11_22_33_44_55_66@@@u", Username: user, Password: pass}); !errors.Is(err, deviceauth.ErrUnauthenticated) {
		t.Fatalf("unlisted device over MQTT: %v", err)
	}
	if err := f.devs.RecheckDevice(ctx, "acme", "112233445566"); !errors.Is(err, deviceauth.ErrUnauthenticated) {
		t.Fatalf("recheck unlisted: %v", err)
	}
	// Disabling the list admits everyone again.
	if _, err := f.mgr.SetAllowlist(ctx, "acme", false, nil); err != nil {
		t.Fatal(err)
	}
	if err := ws("11:22:33:44:55:66"); err != nil {
		t.Fatalf("with the allowlist off: %v", err)
	}
	if _, err := f.mgr.SetAllowlist(ctx, "acme", true, []string{"not a device!"}); !errors.Is(err, tenancy.ErrInvalid) {
		t.Fatalf("bad device id: %v", err)
	}
	if on, list, _ := f.store.Allowlist(ctx, "acme"); on || len(list) != 0 {
		t.Fatalf("rejected input changed the allowlist: %v %v", on, list)
	}
	// Suspension refuses devices too.
	if _, err := f.mgr.SuspendTenant(ctx, "acme"); err != nil {
		t.Fatal(err)
	}
	if err := ws("11:22:33:44:55:66"); err == nil {
		t.Fatal("device of a suspended tenant authenticated")
	}
}

func TestDeviceAuthCachesAcrossAStorm(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "")
	f.tenant(t, "acme")
	f.key(t, "acme")
	tok, _ := f.devs.MintDeviceToken(ctx, "acme", "c", "d1")
	f.store.keyLoads.Store(0)
	f.store.tenantLoads.Store(0)
	var wg sync.WaitGroup
	var failures atomic.Int64
	for range 200 {
		wg.Go(func() {
			if _, err := f.devs.AuthenticateDevice(ctx, deviceauth.Credentials{Token: tok, ClientID: "c", DeviceID: "d1"}); err != nil {
				failures.Add(1)
			}
		})
	}
	wg.Wait()
	if failures.Load() != 0 {
		t.Fatalf("%d of 200 failed", failures.Load())
	}
	if k, tn := f.store.keyLoads.Load(), f.store.tenantLoads.Load(); k > 1 || tn > 0 {
		// The tenant was loaded when the token was minted.
		t.Fatalf("200 concurrent connects made %d key and %d tenant lookups", k, tn)
	}
}

func TestChains(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "")
	f.tenant(t, "acme")
	_, secret, _ := f.mgr.IssueToken(ctx, "acme", tenancy.TokenSpec{Role: access.RoleOperator})
	static := access.StaticTokens{"dev-token": {Tenant: "dev", ID: "dev-operator", Role: access.RoleOperator}}
	chain := tenancy.OperatorChain{static, f.ops}
	if p, err := chain.AuthenticateOperator(ctx, "dev-token"); err != nil || p.Tenant != "dev" {
		t.Fatalf("static: %+v %v", p, err)
	}
	if p, err := chain.AuthenticateOperator(ctx, secret); err != nil || p.Tenant != "acme" {
		t.Fatalf("store token: %+v %v", p, err)
	}
	if _, err := chain.AuthenticateOperator(ctx, "nope"); !errors.Is(err, access.ErrUnauthenticated) {
		t.Fatalf("unknown: %v", err)
	}
	f.store.fail.Store(true)
	if _, err := chain.AuthenticateOperator(ctx, "xco_cccccccccccccccc_"+strings.Repeat("c", 52)); err == nil || errors.Is(err, access.ErrUnauthenticated) {
		t.Fatalf("store down must surface: %v", err)
	}
	if p, err := chain.AuthenticateOperator(ctx, "dev-token"); err != nil || p.Tenant != "dev" {
		t.Fatalf("static token while the store is down: %+v %v", p, err)
	}
	f.store.fail.Store(false)

	f.key(t, "acme")
	dtok, _ := f.devs.MintDeviceToken(ctx, "acme", "c", "d")
	dchain := tenancy.DeviceChain{deviceauth.StaticTokens{"dev-device-token": "dev"}, f.devs}
	if tn, err := dchain.AuthenticateDevice(ctx, deviceauth.Credentials{Token: "dev-device-token"}); err != nil || tn != "dev" {
		t.Fatalf("static device token: %q %v", tn, err)
	}
	if tn, err := dchain.AuthenticateDevice(ctx, deviceauth.Credentials{Token: dtok, ClientID: "c", DeviceID: "d"}); err != nil || tn != "acme" {
		t.Fatalf("signed device token: %q %v", tn, err)
	}
	_, err := dchain.AuthenticateDevice(ctx, deviceauth.Credentials{Token: "junk"})
	if !errors.Is(err, deviceauth.ErrUnauthenticated) || err == deviceauth.ErrUnauthenticated {
		t.Fatalf("a refusal should carry the most specific reason: %v", err)
	}
}

func TestManagerRejectsBadInputWithoutChanges(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "")
	f.tenant(t, "acme")
	before := version(t, f.store, "acme")
	for name, call := range map[string]func() error{
		"tenant id": func() error { _, err := f.mgr.CreateTenant(ctx, tenancy.TenantSpec{ID: "Bad.Tenant"}); return err },
		"default effect": func() error {
			_, err := f.mgr.CreateTenant(ctx, tenancy.TenantSpec{ID: "x", DefaultEffect: "maybe"})
			return err
		},
		"role": func() error { _, _, err := f.mgr.IssueToken(ctx, "acme", tenancy.TokenSpec{Role: "root"}); return err },
		"ttl": func() error {
			_, _, err := f.mgr.IssueToken(ctx, "acme", tenancy.TokenSpec{Role: "admin", TTL: -time.Hour})
			return err
		},
		"name": func() error {
			_, _, err := f.mgr.IssueToken(ctx, "acme", tenancy.TokenSpec{Role: "admin", Name: "a\nb"})
			return err
		},
		"group":      func() error { return f.mgr.SetGroup(ctx, "acme", "bad group", nil) },
		"group node": func() error { return f.mgr.SetGroup(ctx, "acme", "g", []string{"bad.node"}) },
		"rule effect": func() error {
			_, err := f.mgr.AddRule(ctx, tenancy.Rule{Tenant: "acme", Effect: "permit", Subject: "*", Object: "*", Action: "*"})
			return err
		},
		"negative limit": func() error {
			n := -1
			_, err := f.mgr.UpdateTenant(ctx, "acme", tenancy.TenantUpdate{MaxInflight: &n})
			return err
		},
		"limit too large": func() error {
			ok, n := 10, wire.MaxInflightLimit+1
			_, err := f.mgr.UpdateTenant(ctx, "acme", tenancy.TenantUpdate{MaxInflight: &ok, MaxInflightPerDevice: &n})
			return err
		},
	} {
		if err := call(); !errors.Is(err, tenancy.ErrInvalid) {
			t.Errorf("%s: got %v, want ErrInvalid", name, err)
		}
	}
	if v := version(t, f.store, "acme"); v != before {
		t.Fatalf("rejected input changed tenant acme (version %d -> %d)", before, v)
	}
	if l, _ := f.store.Tenants(ctx); len(l) != 1 {
		t.Fatalf("rejected input created tenants: %+v", l)
	}
	if _, err := f.mgr.RevokeToken(ctx, "acme", "tok_nope"); !errors.Is(err, tenancy.ErrNotFound) {
		t.Fatalf("revoke of a malformed id: %v", err)
	}
}

// The gateway reads a tenant's limits through the operator cache; a change
// reaches it through the change notification.
func TestInflightLimitsFollowChanges(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, "")
	f.tenant(t, "acme")
	if l, err := f.ops.InflightLimits(ctx, "acme"); err != nil || l != (wire.InflightLimits{}) {
		t.Fatalf("new tenant limits = %+v, %v; want the defaults", l, err)
	}
	n, d := 200, 4
	if _, err := f.mgr.UpdateTenant(ctx, "acme", tenancy.TenantUpdate{MaxInflight: &n, MaxInflightPerDevice: &d}); err != nil {
		t.Fatal(err)
	}
	if l, err := f.ops.InflightLimits(ctx, "acme"); err != nil || l != (wire.InflightLimits{Tenant: 200, Device: 4}) {
		t.Fatalf("limits after update = %+v, %v", l, err)
	}
	zero := 0
	if _, err := f.mgr.UpdateTenant(ctx, "acme", tenancy.TenantUpdate{MaxInflight: &zero}); err != nil {
		t.Fatal(err)
	}
	if l, err := f.ops.InflightLimits(ctx, "acme"); err != nil || l != (wire.InflightLimits{Device: 4}) {
		t.Fatalf("limits after reset to the default = %+v, %v", l, err)
	}
	if l, err := f.ops.InflightLimits(ctx, "nope"); err != nil || l != (wire.InflightLimits{}) {
		t.Fatalf("unknown tenant limits = %+v, %v", l, err)
	}
}
