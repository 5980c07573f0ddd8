package activation_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/activation"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed/natsembedtest"
)

// TestActivationsShared: a code issued by one hub's Activations is bound
// through another instance on its own NATS connection (the gateway's admin
// API), and every instance then knows the device's tenant.
func TestActivationsSharedThroughNATSKV(t *testing.T) {
	ns := natsembedtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	now := time.Now()
	clock := func() time.Time { return now }
	open := func(name string) activation.Store {
		nc := natsembedtest.Connect(t, ns, name)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		a, err := activation.NewKV(ctx, js, activation.Config{CodeTTL: time.Minute, Now: clock})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	hubA, admin := open("hub-a"), open("admin")

	act, err := hubA.Request(ctx, "aabbccddee01", "aa:bb:cc:dd:ee:01", "u-1")
	if err != nil || len(act.Code) != 6 || act.Challenge == "" || act.Bound() {
		t.Fatalf("request: %+v %v", act, err)
	}
	// Asking again while the code is valid returns the same code.
	if again, err := hubA.Request(ctx, "aabbccddee01", "aa:bb:cc:dd:ee:01", "u-1"); err != nil || again.Code != act.Code {
		t.Fatalf("second request: %+v %v", again, err)
	}
	if p, err := admin.Pending(ctx, act.Code); err != nil || p.Device != "aabbccddee01" {
		t.Fatalf("pending seen by the admin: %+v %v", p, err)
	}
	if _, err := admin.Bind(ctx, act.Code, "Not-A-Tenant"); err == nil {
		t.Fatal("invalid tenant accepted")
	}
	bound, err := admin.Bind(ctx, act.Code, "acme")
	if err != nil || bound.Tenant != "acme" || bound.Code != "" {
		t.Fatalf("bind: %+v %v", bound, err)
	}
	if tenant, err := hubA.TenantOf(ctx, "aabbccddee01"); err != nil || tenant != "acme" {
		t.Fatalf("tenant seen by the hub: %q %v", tenant, err)
	}
	if _, err := admin.Bind(ctx, act.Code, "acme"); !errors.Is(err, activation.ErrNotFound) {
		t.Fatalf("code reused: %v", err)
	}

	// An expired code cannot be bound; the next request gets a new one.
	other, err := hubA.Request(ctx, "aabbccddee02", "", "")
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(2 * time.Minute)
	if _, err := admin.Bind(ctx, other.Code, "acme"); !errors.Is(err, activation.ErrNotFound) {
		t.Fatalf("expired code bound: %v", err)
	}
	if _, err := hubA.Lookup(ctx, "aabbccddee02"); !errors.Is(err, activation.ErrNotFound) {
		t.Fatalf("expired activation still pending: %v", err)
	}
	renewed, err := hubA.Request(ctx, "aabbccddee02", "", "")
	if err != nil || renewed.Code == "" || renewed.ExpiresAt.Before(now) {
		t.Fatalf("renewed: %+v %v", renewed, err)
	}
	if tenant, _ := admin.TenantOf(ctx, "aabbccddee02"); tenant != "" {
		t.Fatalf("unbound device has tenant %q", tenant)
	}
}
