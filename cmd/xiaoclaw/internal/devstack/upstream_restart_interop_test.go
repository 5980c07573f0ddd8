//go:build interop

package devstack

// Upstream mode against the REAL OpenClaw gateway: what a user sees when
// the upstream restarts or refuses the credentials.

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/openclawref"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/shim/upstream"
)

// listedXiaozhi returns how many times node.list of the real gateway lists
// each xiaozhi node, and which of them are connected.
func (c refCLI) listedXiaozhi() (count map[string]int, connected map[string]bool, err error) {
	out, err := c.call("node.list", map[string]any{})
	if err != nil {
		return nil, nil, err
	}
	var res struct {
		Nodes []struct {
			NodeID    string `json:"nodeId"`
			Platform  string `json:"platform"`
			Connected bool   `json:"connected"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return nil, nil, err
	}
	count, connected = map[string]int{}, map[string]bool{}
	for _, n := range res.Nodes {
		if n.Platform == upstream.Platform {
			count[n.NodeID]++
			connected[n.NodeID] = connected[n.NodeID] || n.Connected
		}
	}
	return count, connected, nil
}

func TestInteropUpstreamGatewayRestartBringsEveryDeviceBack(t *testing.T) {
	const devices = 5
	bin, env := openclawref.Require(t)
	gw := startRefGateway(t, bin, env)
	cli := refCLI{bin: bin, env: env, gw: gw}
	home := startStack(t, Config{Upstream: upstream.Upstream{Name: "ref", URL: gw.url(), Token: refGatewayToken}})
	connectDevices(t, home, 0, devices, 31, nil)
	ids := cli.approveXiaozhi(t, devices)
	slices.Sort(ids)

	allBack := func() bool {
		st := home.Upstreams[0].Status()
		if len(st) != devices {
			return false
		}
		for _, s := range st {
			if s.State != upstream.StateOnline {
				return false
			}
		}
		count, connected, err := cli.listedXiaozhi()
		if err != nil || len(count) != devices {
			return false
		}
		for _, id := range ids {
			if count[id] != 1 || !connected[id] {
				return false
			}
		}
		return true
	}
	eventually.Within(t, time.Minute, "every device online and listed once before the restart", allBack)

	stopped := time.Now()
	gw.stop()
	gw.start()
	ready := time.Now()
	// Within 35 s of the restarted gateway being ready, every device is
	// back: online here, listed once and connected there, under the node
	// id it was approved with (no new pairing request, no duplicate).
	eventually.Within(t, 35*time.Second, "every device back after the gateway restart", allBack)
	t.Logf("gateway restart: %d devices back %s after the gateway was ready again (%s after it was stopped)",
		devices, time.Since(ready).Round(100*time.Millisecond), time.Since(stopped).Round(100*time.Millisecond))
	out, err := cli.run("nodes", "pending")
	if err != nil || strings.Contains(out, upstream.Platform) {
		t.Fatalf("pairing requests after the restart: %v\n%s", err, out)
	}
	for _, s := range home.Upstreams[0].Status() {
		if !slices.Contains(ids, s.DeviceID) {
			t.Fatalf("a link came back as another node: %+v (approved %v)", s, ids)
		}
	}
}

// dialCounter is a TCP proxy in front of the real gateway that counts the
// connections made through it.
type dialCounter struct {
	ln    net.Listener
	dials atomic.Int64
	wg    sync.WaitGroup
}

func newDialCounter(t *testing.T, target string) *dialCounter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &dialCounter{ln: ln}
	d.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			d.dials.Add(1)
			d.wg.Go(func() {
				defer c.Close()
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
				_, _ = io.Copy(c, up)
			})
		}
	})
	t.Cleanup(func() { _ = ln.Close() })
	return d
}

func (d *dialCounter) url() string { return "ws://" + d.ln.Addr().String() }

func TestInteropUpstreamWrongTokenShowsDisabledAndDoesNotSpin(t *testing.T) {
	const devices = 2
	bin, env := openclawref.Require(t)
	gw := startRefGateway(t, bin, env)
	proxy := newDialCounter(t, strings.TrimPrefix(gw.url(), "ws://"))
	// Short reconnect delays: a link that retried refused credentials like
	// a dropped connection would dial several times a second.
	home := startStack(t, Config{Upstream: upstream.Upstream{Name: "ref", URL: proxy.url(), Token: "not-the-token"},
		TuneUpstream: func(c *upstream.Config) {
			c.Timing.BackoffMin, c.Timing.BackoffMax = 100*time.Millisecond, time.Second
		}})
	connectDevices(t, home, 0, devices, 41, nil)

	nc, err := home.Connect("upstream-status")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// The status API (what `xiaoclaw upstream status` prints) says why.
	var sts []upstream.Status
	eventually.Within(t, time.Minute, "every link disabled in the status API", func() bool {
		sts, err = upstream.ReadStatus(context.Background(), nc)
		if err != nil || len(sts) != devices {
			return false
		}
		for _, s := range sts {
			if s.State != upstream.StateDisabled {
				return false
			}
		}
		return true
	})
	for _, s := range sts {
		if !strings.Contains(s.LastError, "token") || strings.Contains(s.LastError, "not-the-token") {
			t.Fatalf("status of a refused link: %+v", s)
		}
	}
	t.Logf("wrong token: %s %s", sts[0].State, sts[0].LastError)
	// So does xiaoclaw's node.list (what `xiaoclaw nodes` prints).
	local := operator(t, home.GatewayURL(0))
	eventually.Within(t, time.Minute, "node.list shows every link disabled", func() bool {
		raw, err := local.Call(context.Background(), "node.list", map[string]any{})
		if err != nil {
			t.Fatal(err)
		}
		var res struct {
			Nodes []upstreamLinks `json:"nodes"`
		}
		_ = json.Unmarshal(raw, &res)
		disabled := 0
		for _, n := range res.Nodes {
			if len(n.Upstreams) == 1 && n.Upstreams[0].Name == "ref" && n.Upstreams[0].State == wire.UpstreamDisabled &&
				strings.Contains(n.Upstreams[0].LastError, "token") {
				disabled++
			}
		}
		return disabled == devices
	})

	// It does not spin: over fifty of the shortest reconnect delays no link
	// dials again (it waits AuthRetry, minutes).
	before := proxy.dials.Load()
	window := 5 * time.Second
	time.Sleep(window) // counting dials over a window
	after := proxy.dials.Load()
	t.Logf("wrong token: %d dials for %d devices until disabled, %d more in the next %s", before, devices, after-before, window)
	if after != before {
		t.Fatalf("refused links dialed %d more times in %s", after-before, window)
	}
	if before > 2*devices {
		t.Fatalf("%d dials for %d devices before giving up", before, devices)
	}
}
