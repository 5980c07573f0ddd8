package shim_test

import (
	"context"
	"encoding/json"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/shim"
)

// fakeHub plays the heartbeats of devicehub "hub-1" (the hub the online
// helper names) and, when asked to resync, re-announces its one session.
type fakeHub struct {
	nc        *nats.Conn
	beating   atomic.Bool
	startedMs atomic.Int64
}

func (e *env) fakeHub(t *testing.T, startedMs int64, resync *wire.DeviceEvent) *fakeHub {
	t.Helper()
	h := &fakeHub{nc: connect(t, e.srv, "hub-1")}
	h.beating.Store(true)
	h.startedMs.Store(startedMs)
	if resync != nil {
		data, _ := json.Marshal(resync)
		if _, err := h.nc.Subscribe(wire.SubjectHubResync, func(*nats.Msg) {
			_ = h.nc.Publish(wire.DeviceState(resync.Tenant, resync.Device), data)
		}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			if h.beating.Load() {
				data, _ := json.Marshal(wire.HubHeartbeat{Hub: "hub-1", StartedMs: h.startedMs.Load(), IntervalMs: 50})
				_ = h.nc.Publish(wire.SubjectHubHeartbeat, data)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	if err := h.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return h
}

// awaitHeartbeats waits until n more hub heartbeats went by.
func (e *env) awaitHeartbeats(t *testing.T, n int) {
	t.Helper()
	ch := make(chan *nats.Msg, n)
	sub, err := e.nc.ChanSubscribe(wire.SubjectHubHeartbeat, ch)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	for range n {
		select {
		case <-ch:
		case <-time.After(waitFor):
			t.Fatal("no hub heartbeat")
		}
	}
}

func disconnectReason(t *testing.T, ev wire.NodeEventMsg) string {
	t.Helper()
	var p struct {
		Reason string `json:"reason"`
	}
	if err := json.Unmarshal(ev.Payload, &p); err != nil {
		t.Fatal(err)
	}
	return p.Reason
}

// A hub that falls silent loses its nodes (connected=false, one
// node.disconnected); heard again, it is asked to re-announce its sessions
// and they are connected again.
func TestSilentHubLosesItsNodesUntilHeardAgain(t *testing.T) {
	e := newEnv(t)
	on := online(tenant, device, "s1", 1000)
	hub := e.fakeHub(t, 500, &on)
	e.startShim(t, shim.Config{HubTimeout: 400 * time.Millisecond})
	events := e.events(t, tenant)
	e.publishEvent(t, on)
	e.waitRecord(t, tenant, nodeID, "connected", func(r wire.NodeRecord) bool { return r.Connected })

	e.awaitHeartbeats(t, 3) // the shim has heard the hub, too
	hub.beating.Store(false)
	e.waitRecord(t, tenant, nodeID, "disconnected", func(r wire.NodeRecord) bool { return !r.Connected && r.SessionID == "s1" })
	if r := disconnectReason(t, nextEvent(t, events, wire.EventNodeDisconnected)); !strings.Contains(r, "devicehub lost") {
		t.Fatalf("reason %q", r)
	}

	hub.beating.Store(true)
	e.waitRecord(t, tenant, nodeID, "connected again", func(r wire.NodeRecord) bool { return r.Connected && r.SessionID == "s1" })
	nextEvent(t, events, wire.EventNodeConnected)
}

// A hub heard with a start time after a session's start no longer holds
// that session (the process restarted under the same name): the record is
// released at once, without waiting for the timeout.
func TestRestartedHubReleasesOlderSessions(t *testing.T) {
	e := newEnv(t)
	hub := e.fakeHub(t, 500, nil)
	e.startShim(t, shim.Config{HubTimeout: time.Minute})
	events := e.events(t, tenant)
	e.publishEvent(t, online(tenant, device, "s1", 1000))
	e.waitRecord(t, tenant, nodeID, "connected", func(r wire.NodeRecord) bool { return r.Connected })

	e.awaitHeartbeats(t, 3)
	hub.startedMs.Store(2000)
	e.waitRecord(t, tenant, nodeID, "disconnected", func(r wire.NodeRecord) bool { return !r.Connected })
	if r := disconnectReason(t, nextEvent(t, events, wire.EventNodeDisconnected)); r != "devicehub restarted" {
		t.Fatalf("reason %q", r)
	}
}

// Records of a hub never heard from (one that died before this shim
// started, or one of a release without heartbeats) are probed on the
// device subject: a device nobody serves is released, a served one stays.
func TestUnknownHubRecordsAreProbed(t *testing.T) {
	e := newEnv(t)
	e.startShim(t, shim.Config{HubTimeout: 300 * time.Millisecond})
	const otherDevice = "a1b2c3d4e5f7"
	otherNode := wire.DeviceNodeID(otherDevice)
	for _, ev := range []wire.DeviceEvent{online(tenant, device, "s1", 1000), online(tenant, otherDevice, "s2", 1000)} {
		ev.Hub = "old-hub"
		e.publishEvent(t, ev)
	}
	served := e.fakeDevice(t, connect(t, e.srv, "old-hub"), tenant, device)
	e.waitRecord(t, tenant, nodeID, "connected", func(r wire.NodeRecord) bool { return r.Connected })
	e.waitRecord(t, tenant, otherNode, "released", func(r wire.NodeRecord) bool { return !r.Connected })
	eventually.Within(t, waitFor, "a probe of the served device", func() bool { return len(served.seen()) > 0 })
	if r, _ := e.record(t, tenant, nodeID); !r.Connected {
		t.Fatal("a device its hub still serves was released")
	}
}
