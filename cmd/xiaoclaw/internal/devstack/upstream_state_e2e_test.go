package devstack

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
	"github.com/xiaoclaw/xiaoclaw/pkg/ops"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/shim/upstream"
)

// upstreamLinks is a node of node.list with its upstream links.
type upstreamLinks struct {
	NodeID    string `json:"nodeId"`
	Upstreams []struct {
		Name      string `json:"name"`
		State     string `json:"state"`
		LastError string `json:"lastError"`
	} `json:"upstreams"`
}

// An upstream that refuses the tenant's token keeps the device off it; the
// tenant's operators are told so by a node.upstream event, and node.list
// shows the link disabled with the upstream's refusal, as do the
// shim's metrics.
func TestOperatorsSeeWhyADeviceIsNotUpstream(t *testing.T) {
	up := startStack(t, Config{})
	reg := telemetry.NewRegistry()
	metrics, err := ops.NewServer(ops.Config{Gatherer: reg}, nil)
	if err != nil {
		t.Fatal(err)
	}
	home := startStack(t, Config{Registerer: reg, Ops: metrics.Handler(),
		Upstream: upstream.Upstream{Name: "lab", URL: up.GatewayURL(0), Token: "not-the-token"}})
	events := make(chan occlient.Event, 256)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	op, err := occlient.Dial(ctx, occlient.Options{URL: home.GatewayURL(0), Token: testOperatorToken,
		OnEvent: func(e occlient.Event) {
			select {
			case events <- e:
			default:
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	dev := connectDevices(t, home, 0, 1, 11, nil)[0]
	node := nodeID(dev)

	var states []string
	for disabled := false; !disabled; {
		select {
		case <-ctx.Done():
			t.Fatalf("no node.upstream event saying disabled within %s; saw %v", waitLimit, states)
		case e := <-events:
			if e.Event != "node.event" {
				continue
			}
			var ev struct {
				NodeID  string            `json:"nodeId"`
				Event   string            `json:"event"`
				Payload wire.UpstreamLink `json:"payload"`
			}
			if json.Unmarshal(e.Payload, &ev) != nil || ev.Event != wire.EventNodeUpstream {
				continue
			}
			if ev.NodeID != node || ev.Payload.Upstream != "lab" {
				t.Fatalf("node.upstream %s", e.Payload)
			}
			states = append(states, ev.Payload.State)
			disabled = ev.Payload.State == wire.UpstreamDisabled && ev.Payload.LastError != ""
		}
	}
	if states[0] != wire.UpstreamConnecting {
		t.Fatalf("node.upstream states %v, want connecting first", states)
	}
	const gauge = `xiaoclaw_upstream_links{state="disabled",tenant="` + DevTenant + `",upstream="lab"} 1` + "\n"
	if body := httpGet(t, "http://"+home.Gateways[0].Addr()+"/metrics"); !strings.Contains(body, gauge) {
		t.Fatalf("/metrics lacks %q", gauge)
	}

	// node.list follows the lease bucket through the gateway's watch.
	eventually.Within(t, waitLimit, "node.list shows the link disabled", func() bool {
		raw, err := op.Call(ctx, "node.list", map[string]any{})
		if err != nil {
			t.Fatal(err)
		}
		var res struct {
			Nodes []upstreamLinks `json:"nodes"`
		}
		if err := json.Unmarshal(raw, &res); err != nil {
			t.Fatal(err)
		}
		return len(res.Nodes) == 1 && len(res.Nodes[0].Upstreams) == 1 && res.Nodes[0].Upstreams[0].Name == "lab" &&
			res.Nodes[0].Upstreams[0].State == wire.UpstreamDisabled && res.Nodes[0].Upstreams[0].LastError != ""
	})
}
