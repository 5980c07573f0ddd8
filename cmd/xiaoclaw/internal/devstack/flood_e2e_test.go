package devstack

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/devicehub"
)

// nodeEventsByNode counts an operator's node events by node and event name.
type nodeEventsByNode struct {
	mu sync.Mutex
	n  map[string]int // nodeId + " " + event
}

func (c *nodeEventsByNode) on(ev occlient.Event) {
	if ev.Event != "node.event" {
		return
	}
	var p struct {
		NodeID string `json:"nodeId"`
		Event  string `json:"event"`
	}
	if json.Unmarshal(ev.Payload, &p) != nil {
		return
	}
	c.mu.Lock()
	c.n[p.NodeID+" "+p.Event]++
	c.mu.Unlock()
}

func (c *nodeEventsByNode) count(node, event string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[node+" "+event]
}

// One device floods 8 KB notifications: the hub passes only its rate, the
// drops are counted, and meanwhile another device's notification and
// another tenant's presence still reach their operators.
func TestNotificationFloodIsContained(t *testing.T) {
	const rate, burst, flood = 10, 20, 3000
	reg := prometheus.NewRegistry()
	st := startStack(t, Config{Registerer: reg, TuneHub: func(c *devicehub.Config) { c.NotifyRate, c.NotifyBurst = rate, burst }})
	bravo := newTenant(t, st, "bravo")
	devs := connectDevices(t, st, 0, 2, 21, nil)
	flooder, quiet := devs[0], devs[1]
	devEvents := &nodeEventsByNode{n: map[string]int{}}
	bravoEvents := &nodeEventsByNode{n: map[string]int{}}
	op := dialAs(t, st.GatewayURL(0), testOperatorToken, devEvents.on)
	dialAs(t, st.GatewayURL(0), bravo.token, bravoEvents.on)
	waitNodes(t, op, true, nodeID(flooder), nodeID(quiet))

	params := json.RawMessage(`{"blob":"` + strings.Repeat("x", 8<<10) + `"}`)
	start := time.Now()
	flooding := make(chan error, 1)
	go func() {
		for range flood {
			if err := flooder.Notify(context.Background(), "notifications/flood", params); err != nil {
				flooding <- err
				return
			}
		}
		flooding <- nil
	}()

	// While it floods: another tenant's device comes online, and the quiet
	// device sends one notification.
	bravoDev, err := tenantDevice(t, st, bravo.id, 0, "aa:bb:cc:0b:0b:01")
	if err != nil {
		t.Fatal(err)
	}
	if err := quiet.Notify(context.Background(), "notifications/state_changed", json.RawMessage(`{"newState":"idle"}`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		return bravoEvents.count(nodeID(bravoDev), wire.EventNodeConnected) == 1 &&
			devEvents.count(nodeID(quiet), wire.EventMCPNotification) == 1
	})
	if err := <-flooding; err != nil {
		t.Fatalf("flood: %v", err)
	}
	dropped := func() float64 { return counterValue(t, reg, devicehub.MetricNotificationsDropped, "tenant", DevTenant) }
	passed := func() int { return devEvents.count(nodeID(flooder), wire.EventMCPNotification) }
	waitFor(t, func() bool { return int(dropped())+passed() == flood })
	elapsed := time.Since(start)
	if n := passed(); n < burst || float64(n) > burst+rate*elapsed.Seconds()+1 {
		t.Fatalf("%d of %d flood notifications reached the operator in %s (rate %d/s, burst %d)", n, flood, elapsed, rate, burst)
	}
	t.Logf("flood: %d passed, %.0f dropped in %s", passed(), dropped(), elapsed)
}

// counterValue reads one labelled series of a counter from reg.
func counterValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}
