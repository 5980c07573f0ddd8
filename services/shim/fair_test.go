package shim_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry/telemetrytest"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/shim"
)

var statusCall = json.RawMessage(`{"name":"self.get_device_status"}`)

// silentDevices brings n boards of tenant online whose answers wait until
// the test ends: every call to them stays in flight.
func (e *env) silentDevices(t *testing.T, tenant string, n int) ([]string, []*fakeDevice) {
	t.Helper()
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	var nodes []string
	var fakes []*fakeDevice
	for i := range n {
		dev := fmt.Sprintf("a0000000%04x", i)
		e.publishEvent(t, online(tenant, dev, "s1", 1000))
		node := "xz-" + dev
		e.waitRecord(t, tenant, node, "connected", func(r wire.NodeRecord) bool { return r.Connected })
		d := e.fakeDevice(t, e.nc, tenant, dev)
		d.hold = hold
		nodes = append(nodes, node)
		fakes = append(fakes, d)
	}
	return nodes, fakes
}

// invokeWith sends node.invoke with extra headers; it reports failures
// instead of stopping the test, for goroutines.
func (e *env) invokeWith(tenant, node string, h nats.Header, timeout time.Duration) (wire.InvokeReply, error) {
	data, _ := json.Marshal(wire.InvokeRequest{NodeID: node, Command: "mcp.tools.call", Params: statusCall})
	msg := &nats.Msg{Subject: wire.NodeInvoke(tenant), Header: nats.Header{}, Data: data}
	for k, v := range h {
		msg.Header[k] = v
	}
	msg.Header.Set(wire.HeaderTimeout, strconv.FormatInt(timeout.Milliseconds(), 10))
	reply, err := e.nc.RequestMsg(msg, timeout+2*time.Second)
	if err != nil {
		return wire.InvokeReply{}, err
	}
	var r wire.InvokeReply
	if err := json.Unmarshal(reply.Data, &r); err != nil {
		return wire.InvokeReply{}, fmt.Errorf("InvokeReply %q: %w", reply.Data, err)
	}
	return r, nil
}

// flood starts calls to nodes (round robin) that wait up to a minute, and
// returns once every call either was answered or reached a device. The
// answers so far are returned; the others stay in flight.
func (e *env) flood(t *testing.T, tenant string, nodes []string, h nats.Header, calls int, devices []*fakeDevice) []wire.InvokeReply {
	t.Helper()
	var mu sync.Mutex
	var replies []wire.InvokeReply
	for i := range calls {
		go func() {
			r, err := e.invokeWith(tenant, nodes[i%len(nodes)], h, time.Minute)
			if err != nil {
				r = wire.InvokeReply{Error: &wire.Fault{Code: "REQUEST", Message: err.Error()}}
			}
			mu.Lock()
			replies = append(replies, r)
			mu.Unlock()
		}()
	}
	var seen, done int
	if !eventually.Until(waitFor, func() bool {
		seen = 0
		for _, d := range devices {
			seen += len(d.seen())
		}
		mu.Lock()
		done = len(replies)
		mu.Unlock()
		return seen+done >= calls
	}) {
		t.Fatalf("of %d calls, %d reached a device and %d were answered", calls, seen, done)
	}
	mu.Lock()
	defer mu.Unlock()
	return append([]wire.InvokeReply(nil), replies...)
}

// wantRefusal checks a reply is the typed refusal of a limit.
func wantRefusal(t *testing.T, r wire.InvokeReply, code, limit string, max int) {
	t.Helper()
	if r.OK || r.Error == nil || r.Error.Code != code {
		t.Fatalf("reply = %+v, want %s", r.Error, code)
	}
	var d wire.LimitDetails
	if err := json.Unmarshal(r.Error.Details, &d); err != nil {
		t.Fatalf("details %s: %v", r.Error.Details, err)
	}
	if d != (wire.LimitDetails{Limit: limit, Max: max, RetryAfterMs: 1000}) {
		t.Fatalf("details = %+v, want limit %s max %d retryAfterMs 1000", d, limit, max)
	}
}

// A tenant whose calls all hang on silent devices takes its share of the
// replica and no more: the other tenant's calls keep succeeding. (Without
// per-tenant shares, the flood filled the replica and every call of the
// other tenant failed with BUSY.)
func TestTenantFloodDoesNotStarveOthers(t *testing.T) {
	e := newEnv(t)
	reg := prometheus.NewRegistry()
	// 40 slots; a tenant's default share is a tenth of them.
	e.startShim(t, shim.Config{MaxInFlight: 40, Registerer: reg})
	nodes, fakes := e.silentDevices(t, "flood", 8)
	e.publishEvent(t, online("quiet", device, "s1", 1000))
	e.waitRecord(t, "quiet", nodeID, "connected", func(r wire.NodeRecord) bool { return r.Connected })
	e.fakeDevice(t, e.nc, "quiet", device)

	replies := e.flood(t, "flood", nodes, nil, 100, fakes)
	failed := 0
	for range 20 {
		r, err := e.invokeWith("quiet", nodeID, nil, 5*time.Second)
		if err != nil || !r.OK {
			failed++
		}
	}
	if failed > 0 {
		t.Fatalf("%d of 20 calls of the other tenant failed while the flood was in flight", failed)
	}
	if len(replies) != 96 {
		t.Fatalf("%d of 100 flood calls answered at once, want 96 (4 in flight)", len(replies))
	}
	for _, r := range replies {
		wantRefusal(t, r, wire.FaultRateLimited, wire.LimitTenant, 4)
	}
	if n := telemetrytest.MetricValue(t, reg, telemetry.MetricInvokesRefused, telemetry.LabelService, telemetry.LabelShim, telemetry.LabelTenant, "flood", telemetry.LabelLimit, wire.LimitTenant); n != 96 {
		t.Errorf("refusals counted for the flooding tenant = %v, want 96", n)
	}
	if n := telemetrytest.MetricValue(t, reg, telemetry.MetricInvokesRefused, telemetry.LabelService, telemetry.LabelShim, telemetry.LabelTenant, "quiet", telemetry.LabelLimit, wire.LimitTenant); n != 0 {
		t.Errorf("refusals counted for the other tenant = %v, want 0", n)
	}
}

// The tenant record's limits travel in a header and replace the defaults:
// per tenant (RATE_LIMITED) and per device (BUSY).
func TestTenantLimitsFromHeader(t *testing.T) {
	e := newEnv(t)
	reg := prometheus.NewRegistry()
	e.startShim(t, shim.Config{Registerer: reg})
	nodes, fakes := e.silentDevices(t, tenant, 3)
	h := nats.Header{}
	wire.SetInflightLimits(h, wire.InflightLimits{Tenant: 5, Device: 2})

	// Five calls to one device: two reach it, three are refused for the device.
	replies := e.flood(t, tenant, nodes[:1], h, 5, fakes)
	if len(replies) != 3 {
		t.Fatalf("%d calls answered at once, want 3", len(replies))
	}
	for _, r := range replies {
		wantRefusal(t, r, wire.FaultBusy, wire.LimitDevice, 2)
	}
	// Two more to each of the other devices: three fit in the tenant's five.
	replies = e.flood(t, tenant, nodes[1:], h, 4, fakes[1:])
	if len(replies) != 1 {
		t.Fatalf("%d calls answered at once, want 1", len(replies))
	}
	wantRefusal(t, replies[0], wire.FaultRateLimited, wire.LimitTenant, 5)
	if n := telemetrytest.MetricValue(t, reg, telemetry.MetricInvokesRefused, telemetry.LabelService, telemetry.LabelShim, telemetry.LabelTenant, tenant, telemetry.LabelLimit, wire.LimitDevice); n != 3 {
		t.Errorf("device refusals counted = %v, want 3", n)
	}
	if n := telemetrytest.MetricValue(t, reg, telemetry.MetricInvokesRefused, telemetry.LabelService, telemetry.LabelShim, telemetry.LabelTenant, tenant, telemetry.LabelLimit, wire.LimitTenant); n != 1 {
		t.Errorf("tenant refusals counted = %v, want 1", n)
	}

	// A malformed header is refused and takes no slot.
	bad := nats.Header{}
	bad.Set(wire.HeaderInflightLimits, "-1,2")
	r, err := e.invokeWith(tenant, nodes[2], bad, time.Second)
	if err != nil || r.OK || r.Error.Code != wire.FaultInvalidRequest {
		t.Fatalf("malformed limits: %+v, %v", r.Error, err)
	}
	// Without the header the defaults (1000 per tenant, 32 per device) apply.
	replies = e.flood(t, tenant, nodes[2:], nil, 3, fakes[2:])
	if len(replies) != 0 {
		t.Fatalf("default limits refused calls: %+v", replies[0].Error)
	}
}
