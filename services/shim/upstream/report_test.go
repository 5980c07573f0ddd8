package upstream

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// metricValue scrapes reg for the sample of name with the given labels;
// -1 when there is none.
func metricValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// A link the upstream refuses shows as disabled in the links gauge, and the
// tenant's node events say so once, not once per refused retry; when the
// upstream takes the token again, both say online.
func TestLinkStatesReachMetricsAndNodeEvents(t *testing.T) {
	srv := startNATS(t)
	gw := newFakeGateway(t)
	var refusing atomic.Bool
	refusing.Store(true)
	gw.refuse = func(int, connectParams) *gwError {
		if refusing.Load() {
			return &gwError{Code: "INVALID_REQUEST", Message: "unauthorized: gateway token mismatch",
				Details: map[string]any{"code": "AUTH_TOKEN_MISMATCH"}}
		}
		return nil
	}
	nc := connectNATS(t, srv, "w")
	const node = "xz-aabbccddeeff"
	putDevice(t, nc, wire.NodeRecord{NodeID: node, Tenant: "acme", Kind: wire.NodeKindXiaoZhi, Connected: true})
	events := make(chan wire.NodeEventMsg, 64)
	if _, err := nc.Subscribe(wire.NodeEvent("acme"), func(m *nats.Msg) {
		var ev wire.NodeEventMsg
		_ = json.Unmarshal(m.Data, &ev)
		events <- ev
	}); err != nil {
		t.Fatal(err)
	}

	reg := prometheus.NewRegistry()
	timing := fastTiming
	timing.AuthRetry = 20 * time.Millisecond
	svc, err := New(Config{Instance: "w", LeaseTTL: 3 * time.Second, Invoker: &fakeInvoker{}, Timing: timing,
		Registerer: reg, Upstreams: []Upstream{{Name: "home", Tenant: "acme", URL: gw.url(), Token: linkToken}}},
		nc, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	links := func(state State) float64 {
		return metricValue(t, reg, telemetry.MetricUpstreamLinks,
			map[string]string{"tenant": "acme", "upstream": "home", "state": string(state)})
	}
	waitCond(t, "refused four times", func() bool { return gw.connectCount() >= 4 })
	waitCond(t, "gauge says disabled", func() bool { return links(StateDisabled) == 1 })
	if got := metricValue(t, reg, telemetry.MetricUpstreamChanges,
		map[string]string{"tenant": "acme", "upstream": "home", "state": string(StateDisabled)}); got < 3 {
		t.Fatalf("transitions into disabled: %v, want one per refusal", got)
	}
	// A marker from the same connection arrives after every event
	// published before it.
	if err := nc.Publish(wire.NodeEvent("acme"), []byte(`{"nodeId":"marker","event":"marker"}`)); err != nil {
		t.Fatal(err)
	}
	var got []wire.UpstreamLink
	for ev := range events {
		if ev.Event == "marker" {
			break
		}
		if ev.Event != wire.EventNodeUpstream || ev.NodeID != node {
			t.Fatalf("unexpected node event %+v", ev)
		}
		var l wire.UpstreamLink
		if err := json.Unmarshal(ev.Payload, &l); err != nil {
			t.Fatal(err)
		}
		got = append(got, l)
	}
	if len(got) != 2 || got[0].State != wire.UpstreamConnecting || got[1].State != wire.UpstreamDisabled ||
		got[1].Upstream != "home" || got[1].LastError == "" {
		t.Fatalf("node.upstream events %+v, want connecting then disabled once", got)
	}

	refusing.Store(false)
	waitCond(t, "gauge says online", func() bool { return links(StateOnline) == 1 && links(StateDisabled) == 0 })
	for ev := range events {
		var l wire.UpstreamLink
		_ = json.Unmarshal(ev.Payload, &l)
		if l.State == wire.UpstreamOnline {
			if l.LastError != "" {
				t.Fatalf("online with an error: %+v", l)
			}
			break
		}
		if l.State != wire.UpstreamConnecting { // the retry that succeeded is not told
			t.Fatalf("node.upstream %+v before online", l)
		}
	}

	// The device leaves: the link is no longer counted.
	putDevice(t, nc, wire.NodeRecord{NodeID: node, Tenant: "acme", Kind: wire.NodeKindXiaoZhi, Connected: false})
	waitCond(t, "gauge empty", func() bool { return links(StateOnline) == 0 })
}
