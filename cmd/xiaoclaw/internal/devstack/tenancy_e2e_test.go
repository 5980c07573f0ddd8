package devstack

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
)

// tenantFixture is a tenant with an operator token and a device key.
type tenantFixture struct {
	id    string
	token string // operator token (role operator)
	tokID string
}

func newTenant(t testing.TB, st *Stack, id string) tenantFixture {
	t.Helper()
	ctx := context.Background()
	m := st.Tenancy.Manager
	if _, err := m.CreateTenant(ctx, tenancy.TenantSpec{ID: id}); err != nil {
		t.Fatal(err)
	}
	tok, secret, err := m.IssueToken(ctx, id, tenancy.TokenSpec{Name: "ops", Role: "operator"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.CreateDeviceKey(ctx, id); err != nil {
		t.Fatal(err)
	}
	return tenantFixture{id: id, token: secret, tokID: tok.ID}
}

// tenantDevice connects a simulated device with a bearer token minted from
// the tenant's device key.
func tenantDevice(t testing.TB, st *Stack, tenant string, hub int, mac string) (*xzsim.Device, error) {
	t.Helper()
	cfg := xzsim.Config{URL: st.DeviceURL(hub), MAC: mac}
	d, err := xzsim.NewDevice(cfg)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := st.Tenancy.Devices.MintDeviceToken(context.Background(), tenant, d.ClientID(), mac)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Token = tok
	if d, err = xzsim.NewDevice(cfg); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := d.Connect(ctx); err != nil {
		return nil, err
	}
	t.Cleanup(func() { d.Close() })
	return d, nil
}

func dialAs(t testing.TB, url, token string, onEvent func(occlient.Event)) *occlient.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	c, err := occlient.Dial(ctx, occlient.Options{URL: url, Token: token, OnEvent: onEvent})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestTenantIsolation(t *testing.T) {
	st := startStack(t, Config{Hubs: 1, Shims: 1, Gateways: 1})
	a, b := newTenant(t, st, "acme"), newTenant(t, st, "bravo")
	devA, err := tenantDevice(t, st, a.id, 0, "02:0a:00:00:00:01")
	if err != nil {
		t.Fatal(err)
	}
	events := make(chan occlient.Event, 64)
	opA := dialAs(t, st.GatewayURL(0), a.token, func(e occlient.Event) { events <- e })
	opB := dialAs(t, st.GatewayURL(0), b.token, nil)
	waitNodes(t, opA, true, nodeID(devA))

	// B sees nothing of A's node: not listed, not describable, not invocable,
	// and the answers are those for a node that does not exist.
	if _, ok := listNodes(t, opB)[nodeID(devA)]; ok {
		t.Fatal("tenant B lists tenant A's node")
	}
	_, errDescribe := opB.Call(context.Background(), "node.describe", map[string]string{"nodeId": nodeID(devA)})
	_, errMissing := opB.Call(context.Background(), "node.describe", map[string]string{"nodeId": "xz-0a0000000999"})
	if errDescribe == nil || errMissing == nil || errDescribe.Error() != errMissing.Error() {
		t.Fatalf("describe of another tenant's node must look like a missing node: %v / %v", errDescribe, errMissing)
	}
	_, errInvoke := callTool(context.Background(), opB, nodeID(devA), "self.audio_speaker.set_volume", map[string]int{"volume": 5}, time.Second)
	_, errInvokeMissing := callTool(context.Background(), opB, "xz-0a0000000999", "self.audio_speaker.set_volume", map[string]int{"volume": 5}, time.Second)
	if errInvoke == nil || errInvokeMissing == nil || errInvoke.Error() != errInvokeMissing.Error() || devA.Volume() == 5 {
		t.Fatalf("invoke of another tenant's node must look like a missing node: %v / %v", errInvoke, errInvokeMissing)
	}

	// Device credentials are bound to their tenant and device: a token
	// minted for one device does not admit another, and a forged one fails.
	stolen, err := st.Tenancy.Devices.MintDeviceToken(context.Background(), a.id, "c1", "02:0a:00:00:00:01")
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []xzsim.Config{
		{URL: st.DeviceURL(0), MAC: "02:0b:00:00:00:01", ClientID: "c1", Token: stolen},
		{URL: st.DeviceURL(0), MAC: "02:0b:00:00:00:02", Token: "kid_x.forged.1"},
	} {
		d, _ := xzsim.NewDevice(cfg)
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		err := d.Connect(ctx)
		cancel()
		if err == nil {
			d.Close()
			t.Fatalf("device %s connected with a token not minted for it", cfg.MAC)
		}
	}

	// Events of A's nodes reach A's operators only.
	devA.Drop()
	waitNodes(t, opA, false, nodeID(devA))
	deadline := time.After(waitLimit)
	for {
		select {
		case e := <-events:
			if strings.Contains(string(e.Payload), nodeID(devA)) {
				return
			}
		case <-deadline:
			t.Fatal("tenant A's operator got no event for its own node")
		}
	}
}

func TestPolicyThroughGateway(t *testing.T) {
	st := startStack(t, Config{Gateways: 3})
	a := newTenant(t, st, "acme")
	dev, err := tenantDevice(t, st, a.id, 0, "02:0c:00:00:00:01")
	if err != nil {
		t.Fatal(err)
	}
	var ops []*occlient.Client
	for i := range 3 {
		ops = append(ops, dialAs(t, st.GatewayURL(i), a.token, nil))
	}
	node := nodeID(dev)
	waitNodes(t, ops[0], true, node)
	ctx := context.Background()
	if _, err := callTool(ctx, ops[0], node, "self.audio_speaker.set_volume", map[string]int{"volume": 70}, 5*time.Second); err != nil {
		t.Fatalf("allowed by default: %v", err)
	}

	// One rule: set_volume only up to 60. It must reach all three gateway
	// replicas within a second.
	rule, err := st.Tenancy.Manager.AddRule(ctx, tenancy.Rule{Tenant: a.id, Effect: "deny", Subject: "*", Object: "xz-*",
		Action: "mcp.tools.call:self.audio_speaker.set_volume", When: "volume>60"})
	if err != nil {
		t.Fatal(err)
	}
	added := time.Now()
	for i, op := range ops {
		for {
			_, err := callTool(ctx, op, node, "self.audio_speaker.set_volume", map[string]int{"volume": 80}, 5*time.Second)
			if err != nil && strings.Contains(err.Error(), rule.ID) {
				break
			}
			if time.Since(added) > time.Second {
				t.Fatalf("gateway %d: the deny rule did not apply within 1s (last: %v)", i, err)
			}
		}
	}
	// Calls that raced the rule may have gone through; from here on none may.
	if _, err := callTool(ctx, ops[0], node, "self.audio_speaker.set_volume", map[string]int{"volume": 50}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	var ge *occlient.Error
	_, err = callTool(ctx, ops[1], node, "self.audio_speaker.set_volume", map[string]int{"volume": 80}, 5*time.Second)
	if !errors.As(err, &ge) || !strings.Contains(string(ge.Details), rule.ID) {
		t.Fatalf("denial must name the rule in details: %v", err)
	}
	if dev.Volume() != 50 {
		t.Fatalf("a denied call reached the device: volume %d", dev.Volume())
	}
	if _, err := callTool(ctx, ops[2], node, "self.audio_speaker.set_volume", map[string]int{"volume": 40}, 5*time.Second); err != nil || dev.Volume() != 40 {
		t.Fatalf("volume 40 is below the predicate and must pass: %v", err)
	}

	// A tool denied outright disappears from the listing for that principal.
	if _, err := st.Tenancy.Manager.AddRule(ctx, tenancy.Rule{Tenant: a.id, Effect: "deny", Subject: a.tokID, Object: "*",
		Action: "mcp.tools.call:self.screen.set_theme"}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(waitLimit)
	for {
		raw, err := ops[0].Call(ctx, "node.describe", map[string]string{"nodeId": node})
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			Tools []struct{ Name string } `json:"tools"`
		}
		_ = json.Unmarshal(raw, &d)
		hidden := len(d.Tools) > 0
		for _, tl := range d.Tools {
			if tl.Name == "self.screen.set_theme" {
				hidden = false
			}
		}
		if hidden {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("denied tool still listed: %s", raw)
		}
		time.Sleep(20 * time.Millisecond) // polling until the rule applies
	}
}

func TestRevocationClosesLiveConnections(t *testing.T) {
	st := startStack(t, Config{Gateways: 2})
	a := newTenant(t, st, "acme")
	c0 := dialAs(t, st.GatewayURL(0), a.token, nil)
	c1 := dialAs(t, st.GatewayURL(1), a.token, nil)
	if _, err := st.Tenancy.Manager.RevokeToken(context.Background(), a.id, a.tokID); err != nil {
		t.Fatal(err)
	}
	revoked := time.Now()
	for i, c := range []*occlient.Client{c0, c1} {
		select {
		case <-c.Done():
		case <-time.After(time.Second - time.Since(revoked)):
			t.Fatalf("gateway %d kept a revoked token's connection open for over 1s", i)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if _, err := occlient.Dial(ctx, occlient.Options{URL: st.GatewayURL(0), Token: a.token}); err == nil {
		t.Fatal("a revoked token connected again")
	}
}
