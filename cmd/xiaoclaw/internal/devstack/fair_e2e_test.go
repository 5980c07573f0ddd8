package devstack

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
	"github.com/xiaoclaw/xiaoclaw/services/shim"
)

// silentTenant is a tenant whose devices hold every tool call until the
// test ends, with operators ready to flood them.
type silentTenant struct {
	tenantFixture
	devices []*xzsim.Device
	nodes   []string
	ops     []*occlient.Client
}

func newSilentTenant(t testing.TB, st *Stack, id string, devices, conns int) *silentTenant {
	t.Helper()
	s := &silentTenant{tenantFixture: newTenant(t, st, id)}
	for i := range devices {
		d, err := tenantDevice(t, st, id, 0, fmt.Sprintf("02:0f:00:00:%02x:%02x", len(id), i))
		if err != nil {
			t.Fatal(err)
		}
		release := d.Hold()
		t.Cleanup(release)
		s.devices = append(s.devices, d)
		s.nodes = append(s.nodes, nodeID(d))
	}
	for range conns {
		s.ops = append(s.ops, dialAs(t, st.GatewayURL(0), s.token, nil))
	}
	waitNodes(t, s.ops[0], true, s.nodes...)
	return s
}

// held is how many of the tenant's calls its devices hold now.
func (s *silentTenant) held() int {
	n := 0
	for _, d := range s.devices {
		n += d.Held()
	}
	return n
}

// refusedCount reads xiaoclaw_invokes_refused_total{service="shim",tenant,limit}.
func refusedCount(t testing.TB, reg *prometheus.Registry, tenant, limit string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != telemetry.MetricInvokesRefused {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l[telemetry.LabelService] == telemetry.LabelShim && l[telemetry.LabelTenant] == tenant && l[telemetry.LabelLimit] == limit {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// One tenant floods silent devices with far more calls than a shim replica
// has room for; the other tenant's calls all succeed, the flood beyond the
// tenant's limit (set through the manager, as the admin API does) is
// refused at once with RATE_LIMITED and a retry hint, and the refusals are
// counted per tenant. Without per-tenant shares the flood filled the
// replica and the other tenant's calls failed with BUSY.
func TestTenantFloodDoesNotStarveOthers(t *testing.T) {
	reg := prometheus.NewRegistry()
	st := startStack(t, Config{Registerer: reg, TuneShim: func(c *shim.Config) { c.MaxInFlight = 60 }})
	ctx := context.Background()
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait) // the flood's calls end when the devices release them (cleanups run last first)
	flood := newSilentTenant(t, st, "flood", 4, 4)
	limit := 10
	if _, err := st.Tenancy.Manager.UpdateTenant(ctx, "flood", tenancy.TenantUpdate{MaxInflight: &limit}); err != nil {
		t.Fatal(err)
	}
	quiet := newTenant(t, st, "quiet")
	dev, err := tenantDevice(t, st, quiet.id, 0, "02:0e:00:00:00:01")
	if err != nil {
		t.Fatal(err)
	}
	opQuiet := dialAs(t, st.GatewayURL(0), quiet.token, nil)
	waitNodes(t, opQuiet, true, nodeID(dev))

	const calls = 200
	var mu sync.Mutex
	var refused []error
	for i := range calls {
		wg.Go(func() {
			_, err := callTool(ctx, flood.ops[i%len(flood.ops)], flood.nodes[i%len(flood.nodes)], "self.get_device_status", map[string]any{}, 60*time.Second)
			mu.Lock()
			refused = append(refused, err)
			mu.Unlock()
		})
	}
	waitFor(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(refused)+flood.held() >= calls
	})

	failed := 0
	var first error
	for range 20 {
		if _, err := callTool(ctx, opQuiet, nodeID(dev), "self.get_device_status", map[string]any{}, 5*time.Second); err != nil {
			failed++
			first = cmpOr(first, err)
		}
	}
	if failed > 0 {
		t.Fatalf("%d of 20 calls of the other tenant failed while the flood was in flight; first: %v", failed, first)
	}

	mu.Lock()
	got := append([]error(nil), refused...)
	mu.Unlock()
	if held := flood.held(); held != limit || len(got) != calls-limit {
		t.Fatalf("devices hold %d calls and %d were answered; want %d held (the limit) and %d refused", held, len(got), limit, calls-limit)
	}
	for _, err := range got {
		var ge *occlient.Error
		if !errors.As(err, &ge) || nodeErrorCode(t, err) != "RATE_LIMITED" || !ge.Retryable || ge.RetryAfterMs != 1000 ||
			!strings.Contains(string(ge.Details), `"limit":"tenant","max":10,"retryAfterMs":1000`) {
			t.Fatalf("refusal = %#v", err)
		}
	}
	if n := refusedCount(t, reg, "flood", "tenant"); n != calls-float64(limit) {
		t.Errorf("refusals counted for the flooding tenant = %v, want %d", n, calls-limit)
	}
	if n := refusedCount(t, reg, "quiet", "tenant"); n != 0 {
		t.Errorf("refusals counted for the other tenant = %v", n)
	}
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
