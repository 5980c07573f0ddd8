// Package hubs tells, from the devicehubs' heartbeats
// (wire.SubjectHubHeartbeat), whether the hub process that a node record
// names still holds its session.
//
// A record is stale when its owner has not been heard from for the timeout
// (the hub died without publishing offline events, or is cut off from
// NATS), or when its owner is heard from but started after the record's
// session did (the process that held the session is gone and a new one of
// the same name runs). A hub never heard from within the timeout of the
// tracker's start is Unknown: it died before this shim started, or it is
// of a release that sends no heartbeats; the caller asks NATS whether
// anyone still serves such a record's device.
package hubs

import (
	"sync"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// Tracker holds the last heartbeat of every hub. It is safe for concurrent
// use.
type Tracker struct {
	timeout time.Duration

	mu    sync.Mutex
	since time.Time // start, or the last Reset
	hubs  map[string]hub
}

type hub struct {
	seen      time.Time
	startedMs int64
	timeout   time.Duration
	lost      bool // declared gone; a heartbeat makes it Returned
}

// New returns a tracker that declares a hub gone after timeout without a
// heartbeat (or three of its announced intervals, if longer).
func New(timeout time.Duration, now time.Time) *Tracker {
	return &Tracker{timeout: timeout, since: now, hubs: map[string]hub{}}
}

// Observe records a heartbeat received at now. It reports whether the hub
// had been declared gone (its sessions, if it still holds any, must be
// announced again).
func (t *Tracker) Observe(hb wire.HubHeartbeat, now time.Time) (returned bool) {
	timeout := t.timeout
	if iv := 3 * time.Duration(hb.IntervalMs) * time.Millisecond; iv > timeout {
		timeout = iv
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	old, ok := t.hubs[hb.Hub]
	// The same process back (not a new one, whose sessions are all new):
	// it may still hold sessions whose records were released.
	returned = ok && old.lost && (old.startedMs == hb.StartedMs || old.startedMs == 0)
	startedMs := hb.StartedMs
	if ok && old.startedMs > startedMs {
		startedMs = old.startedMs // a late heartbeat of the previous process
	}
	t.hubs[hb.Hub] = hub{seen: now, startedMs: startedMs, timeout: timeout}
	return returned
}

// Reset restarts every hub's timeout at now: call it when this process's
// own NATS connection was down, so heartbeats it missed do not count.
func (t *Tracker) Reset(now time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.since = now
	for name, h := range t.hubs {
		h.seen = now
		t.hubs[name] = h
	}
}

// Verdict on a record's hub.
type Verdict int

const (
	Alive     Verdict = iota // the hub holding the session is alive
	Silent                   // no heartbeat for the timeout: the hub is gone or cut off
	Restarted                // the hub runs, but started after the session: the session is gone
	Unknown                  // never heard from: probe the device subject
)

// Check judges a connected record owned by owner whose session started at
// connectedAtMs (the hub's clock).
func (t *Tracker) Check(owner string, connectedAtMs int64, now time.Time) Verdict {
	t.mu.Lock()
	defer t.mu.Unlock()
	h, ok := t.hubs[owner]
	switch {
	case !ok && now.Sub(t.since) > t.timeout:
		return Unknown
	case !ok:
		return Alive // not heard from yet, within the grace after start
	case now.Sub(h.seen) > h.timeout:
		return Silent
	case connectedAtMs < h.startedMs:
		return Restarted
	}
	return Alive
}

// MarkLost notes that owner's records were released for its silence, so
// that its next heartbeat reports it returned.
func (t *Tracker) MarkLost(owner string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h, ok := t.hubs[owner]
	if !ok {
		h = hub{seen: t.since, timeout: t.timeout}
	}
	h.lost = true
	t.hubs[owner] = h
}
