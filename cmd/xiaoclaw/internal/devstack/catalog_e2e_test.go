package devstack

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
)

// catalogNode is a node as node.list shows its catalog.
type catalogNode struct {
	Connected    bool   `json:"connected"`
	ToolsVersion uint64 `json:"toolsVersion"`
	ToolsStale   bool   `json:"toolsStale"`
	Tools        []struct {
		Name string `json:"name"`
	} `json:"tools"`
}

func (n catalogNode) names() []string {
	var s []string
	for _, t := range n.Tools {
		s = append(s, t.Name)
	}
	return s
}

// waitCatalog polls node.list until node satisfies ok.
func waitCatalog(t *testing.T, op *occlient.Client, node string, what string, ok func(catalogNode) bool) catalogNode {
	t.Helper()
	var last catalogNode
	if !eventually.Until(waitLimit, func() bool {
		raw, err := op.Call(context.Background(), "node.list", map[string]any{})
		if err != nil {
			t.Fatalf("node.list: %v", err)
		}
		var res struct {
			Nodes []struct {
				NodeID string `json:"nodeId"`
				catalogNode
			} `json:"nodes"`
		}
		if err := json.Unmarshal(raw, &res); err != nil {
			t.Fatal(err)
		}
		for _, n := range res.Nodes {
			if n.NodeID == node {
				last = n.catalogNode
				if ok(last) {
					return true
				}
			}
		}
		return false
	}) {
		t.Fatalf("node %s not %s within %s; listed: %+v", node, what, waitLimit, last)
	}
	return last
}

// A node that reconnects is listed at once with its last catalog, marked
// stale, while its device has not answered tools/list yet; fresh once it
// has. A catalog change while connected reaches operators as
// node.tools.changed with the added and removed tools and a higher version.
func TestCatalogAcrossReconnectAndChange(t *testing.T) {
	st := startStack(t, Config{Hubs: 1, Shims: 1, Gateways: 1})
	events := make(chan occlient.Event, 64)
	op := dialAs(t, st.GatewayURL(0), testOperatorToken, func(e occlient.Event) {
		select {
		case events <- e:
		default:
		}
	})
	d, err := xzsim.NewDevice(xzsim.Config{URL: st.DeviceURL(0), Token: testDeviceToken, MAC: "02:ca:00:00:00:01", ExtraTools: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := d.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	node := nodeID(d)
	first := waitCatalog(t, op, node, "listed with its tools", func(n catalogNode) bool {
		return n.Connected && !n.ToolsStale && slices.Contains(n.names(), "self.sim.extra_0002")
	})
	if first.ToolsVersion == 0 {
		t.Fatalf("catalog without a version: %+v", first)
	}

	// Reconnect with a device slow to list its tools.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	waitNodes(t, op, false, node)
	release := d.HoldToolsList()
	defer release()
	if err := d.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	cached := waitCatalog(t, op, node, "connected", func(n catalogNode) bool { return n.Connected })
	if !cached.ToolsStale || !slices.Equal(cached.names(), first.names()) || cached.ToolsVersion != first.ToolsVersion {
		t.Fatalf("reconnected node before tools/list answered: %+v, want the cached catalog %v (version %d) marked stale",
			cached, first.names(), first.ToolsVersion)
	}
	if d.Requests("tools/list") < 2 {
		t.Fatal("the device was not asked for its tools again")
	}
	release()
	fresh := waitCatalog(t, op, node, "fresh", func(n catalogNode) bool { return n.Connected && !n.ToolsStale })
	if fresh.ToolsVersion != first.ToolsVersion {
		t.Fatalf("the same catalog counted a new version: %d, was %d", fresh.ToolsVersion, first.ToolsVersion)
	}

	// The catalog changes while the device is connected.
	for len(events) > 0 {
		<-events
	}
	d.SetExtraTools(3) // adds extra_0003
	if err := d.Notify(ctx, "notifications/tools/list_changed", nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(waitLimit)
	for {
		select {
		case e := <-events:
			var ev struct {
				NodeID  string `json:"nodeId"`
				Event   string `json:"event"`
				Payload struct {
					Added, Removed []string
					Version        uint64
				} `json:"payload"`
			}
			if e.Event != "node.event" || json.Unmarshal(e.Payload, &ev) != nil || ev.NodeID != node || ev.Event != wire.EventNodeToolsChanged {
				continue
			}
			if !slices.Equal(ev.Payload.Added, []string{"self.sim.extra_0003"}) || len(ev.Payload.Removed) != 0 || ev.Payload.Version != first.ToolsVersion+1 {
				t.Fatalf("node.tools.changed = %s, want extra_0003 added at version %d", e.Payload, first.ToolsVersion+1)
			}
			listed := waitCatalog(t, op, node, "at the new version", func(n catalogNode) bool { return n.ToolsVersion == ev.Payload.Version })
			if !slices.Contains(listed.names(), "self.sim.extra_0003") {
				t.Fatalf("node.list at version %d lacks the new tool: %v", listed.ToolsVersion, listed.names())
			}
			return
		case <-deadline:
			t.Fatal("no node.tools.changed event")
		}
	}
}
