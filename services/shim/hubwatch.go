package shim

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/shim/internal/hubs"
	"github.com/xiaoclaw/xiaoclaw/services/shim/internal/nodes"
)

// DefaultHubTimeout is how long a devicehub may stay silent before its
// devices are marked disconnected: three heartbeats at the hubs' default
// interval of 5 s. With the check every hubCheckEvery, a node whose hub
// died reads connected=false within about 16 s.
const DefaultHubTimeout = 15 * time.Second

// hubCheckEvery is how often the registry cache is checked against the
// hubs' heartbeats.
const hubCheckEvery = time.Second

// hubWatch keeps the registry's presence true when events are missing.
// It releases the sessions of devicehubs that died without a word: it
// follows every hub's heartbeats (each shim replica hears them all) and
// marks the connected records of a silent or restarted hub disconnected.
// And when the lifecycle subscription dropped events (a slow consumer), it
// asks the hubs to re-announce their sessions.
type hubWatch struct {
	s          *Service
	tracker    *hubs.Tracker // nil: no heartbeat check (HubTimeout < 0)
	sub        *nats.Subscription
	reconnects uint64

	lifecycle *nats.Subscription
	dropped   int

	probed map[string]time.Time // node key -> last probe, for records of Unknown hubs
}

func (s *Service) startHubWatch(lifecycle *nats.Subscription) (*hubWatch, error) {
	w := &hubWatch{s: s, reconnects: s.nc.Stats().Reconnects, lifecycle: lifecycle, probed: map[string]time.Time{}}
	if s.cfg.HubTimeout < 0 {
		return w, nil
	}
	w.tracker = hubs.New(s.cfg.HubTimeout, time.Now())
	sub, err := s.nc.Subscribe(wire.SubjectHubHeartbeat, w.onHeartbeat)
	if err != nil {
		return nil, err
	}
	w.sub = sub
	return w, nil
}

func (w *hubWatch) onHeartbeat(m *nats.Msg) {
	var hb wire.HubHeartbeat
	if json.Unmarshal(m.Data, &hb) != nil || hb.Hub == "" {
		return
	}
	if w.tracker.Observe(hb, time.Now()) {
		// A hub declared gone is back with its sessions: have them announced.
		w.s.log.Info("devicehub heard again; asking hubs to re-announce their sessions", "hub", hb.Hub)
		if err := w.s.nc.Publish(wire.SubjectHubResync, nil); err != nil {
			w.s.log.Warn("could not ask hubs to resync", "err", err)
		}
	}
}

// run checks the registry every hubCheckEvery until ctx ends.
func (w *hubWatch) run(ctx context.Context) {
	t := time.NewTicker(hubCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if w.sub != nil {
				_ = w.sub.Unsubscribe()
			}
			return
		case <-t.C:
			w.checkLifecycle()
			if w.tracker != nil {
				w.check(ctx)
			}
		}
	}
}

// checkLifecycle asks the hubs to re-announce their sessions after the
// lifecycle subscription dropped events: online and tools events come
// again; a lost offline event is made up for by the heartbeat check (a
// gone hub) or the first call to the device (no responders).
func (w *hubWatch) checkLifecycle() {
	n, err := w.lifecycle.Dropped()
	if err != nil || n <= w.dropped {
		return
	}
	w.s.log.Warn("device lifecycle events dropped (slow consumer); asking hubs to re-announce their sessions", "dropped", n-w.dropped)
	w.dropped = n
	if err := w.s.nc.Publish(wire.SubjectHubResync, nil); err != nil {
		w.s.log.Warn("could not ask hubs to resync", "err", err)
	}
}

// check releases every connected record whose hub is gone.
func (w *hubWatch) check(ctx context.Context) {
	now := time.Now()
	// Heartbeats missed while this replica was cut off from NATS say
	// nothing about the hubs.
	if !w.s.nc.IsConnected() {
		return
	}
	if n := w.s.nc.Stats().Reconnects; n != w.reconnects {
		w.reconnects = n
		w.tracker.Reset(now)
		return
	}
	type stale struct {
		sess    nodes.Session
		verdict hubs.Verdict
	}
	var gone []stale
	probed := make(map[string]time.Time, len(w.probed))
	w.s.reg.Connected(func(sess nodes.Session) {
		v := w.tracker.Check(sess.Owner, sess.ConnectedAtMs, now)
		if v == hubs.Unknown {
			// Probe each such record once per timeout, not every check.
			key := wire.NodeKey(sess.Tenant, sess.NodeID)
			if last, ok := w.probed[key]; ok && now.Sub(last) < w.s.cfg.HubTimeout {
				probed[key] = last
				return
			}
			probed[key] = now
		}
		if v != hubs.Alive {
			gone = append(gone, stale{sess, v})
		}
	})
	w.probed = probed
	var mu sync.Mutex
	lost := map[string]int{}
	// A dead hub may have held thousands of sessions: release them with a
	// few writers at once (each is a KV read and a compare-and-set).
	work := make(chan stale)
	var wg sync.WaitGroup
	for range min(releaseWriters, len(gone)) {
		wg.Go(func() {
			for g := range work {
				if reason, applied := w.release(ctx, g.sess, g.verdict); applied {
					mu.Lock()
					lost[g.sess.Owner+" ("+reason+")"]++
					mu.Unlock()
				}
			}
		})
	}
	for _, g := range gone {
		if ctx.Err() != nil {
			break
		}
		work <- g
	}
	close(work)
	wg.Wait()
	for hub, n := range lost {
		w.s.log.Warn("marked the devices of a devicehub disconnected", "hub", hub, "devices", n)
	}
}

// releaseWriters is how many records one check releases at once.
const releaseWriters = 8

// release marks one record of a gone hub disconnected; for a hub never
// heard from only after a probe found nobody serving the device.
func (w *hubWatch) release(ctx context.Context, sess nodes.Session, v hubs.Verdict) (string, bool) {
	var reason string
	switch v {
	case hubs.Restarted:
		reason = "devicehub restarted"
	case hubs.Unknown:
		if w.served(ctx, sess) {
			return "", false
		}
		reason = "devicehub unreachable"
	default:
		reason = "devicehub lost"
		w.tracker.MarkLost(sess.Owner)
	}
	ctx, cancel := context.WithTimeout(ctx, registryTimeout)
	defer cancel()
	applied, err := w.s.reg.Release(ctx, sess, reason)
	if err != nil {
		w.s.log.Warn("could not release a session of a lost devicehub", "tenant", sess.Tenant, "node", sess.NodeID, "hub", sess.Owner, "err", err)
		return "", false
	}
	return reason, applied
}

// probeTimeout bounds the probe of one device subject.
const probeTimeout = 2 * time.Second

// served asks NATS whether any devicehub serves the device of a record
// whose hub never sent a heartbeat. The probe is a request the hub refuses
// (INVALID_REQUEST) without passing it to the device; only "no responders"
// means nobody holds the session.
func (w *hubWatch) served(ctx context.Context, sess nodes.Session) bool {
	if sess.Device == "" {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	_, err := w.s.nc.RequestWithContext(ctx, wire.DeviceRPC(sess.Tenant, sess.Device), []byte(`{}`))
	return !errors.Is(err, nats.ErrNoResponders)
}
