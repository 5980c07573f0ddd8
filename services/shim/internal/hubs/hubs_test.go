package hubs

import (
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

func TestVerdicts(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tr := New(15*time.Second, t0)
	if v := tr.Check("hub-a", 1, t0.Add(10*time.Second)); v != Alive {
		t.Fatalf("unknown hub within the grace after start: %v", v)
	}
	if v := tr.Check("hub-a", 1, t0.Add(16*time.Second)); v != Unknown {
		t.Fatalf("unknown hub after the grace: %v", v)
	}
	hb := wire.HubHeartbeat{Hub: "hub-b", StartedMs: 5000, IntervalMs: 5000}
	if tr.Observe(hb, t0) {
		t.Fatal("first heartbeat reported a return")
	}
	if v := tr.Check("hub-b", 6000, t0.Add(14*time.Second)); v != Alive {
		t.Fatalf("heard hub: %v", v)
	}
	if v := tr.Check("hub-b", 4000, t0.Add(time.Second)); v != Restarted {
		t.Fatalf("session older than its hub's process: %v", v)
	}
	if v := tr.Check("hub-b", 6000, t0.Add(16*time.Second)); v != Silent {
		t.Fatalf("silent hub: %v", v)
	}
	tr.MarkLost("hub-b")
	if !tr.Observe(hb, t0.Add(20*time.Second)) {
		t.Fatal("the same process heard again is not reported returned")
	}
	if tr.Observe(hb, t0.Add(21*time.Second)) {
		t.Fatal("a return is reported twice")
	}
	tr.MarkLost("hub-b")
	if tr.Observe(wire.HubHeartbeat{Hub: "hub-b", StartedMs: 9000, IntervalMs: 5000}, t0.Add(40*time.Second)) {
		t.Fatal("a new process (no old sessions) is reported returned")
	}
	// A slow heartbeat interval stretches that hub's timeout.
	tr.Observe(wire.HubHeartbeat{Hub: "hub-c", StartedMs: 1, IntervalMs: 10000}, t0)
	if v := tr.Check("hub-c", 2, t0.Add(25*time.Second)); v != Alive {
		t.Fatalf("hub with a 10 s interval after 25 s: %v", v)
	}
	// Missed heartbeats while this replica was cut off do not count.
	tr.Reset(t0.Add(60 * time.Second))
	if v := tr.Check("hub-c", 2, t0.Add(70*time.Second)); v != Alive {
		t.Fatalf("after Reset: %v", v)
	}
}
