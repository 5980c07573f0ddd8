package nodes

import (
	"context"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// Session names the session a connected record holds.
type Session struct {
	Tenant, NodeID string
	Device         string // canonical device id
	Owner          string // the devicehub instance
	SessionID      string
	ConnectedAtMs  int64
}

// Connected calls fn for every connected node in the cache. fn must not
// call back into the registry.
func (r *Registry) Connected(fn func(Session)) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for tenant, m := range r.nodes {
		for id, n := range m {
			if rec := &n.Record; rec.Connected {
				fn(Session{Tenant: tenant, NodeID: id, Device: rec.Device, Owner: rec.Owner, SessionID: rec.SessionID, ConnectedAtMs: rec.ConnectedAtMs})
			}
		}
	}
}

// Release marks a node disconnected if its record still holds session s
// (same hub, same session), and then publishes node.disconnected with
// reason. Replicas racing on one record write it once; only the writer
// publishes. It reports whether it changed the record.
func (r *Registry) Release(ctx context.Context, s Session, reason string) (bool, error) {
	now := time.Now().UnixMilli()
	_, _, out, err := r.update(ctx, wire.NodeKey(s.Tenant, s.NodeID), func(old *wire.NodeRecord) (wire.NodeRecord, Outcome) {
		if old == nil || !old.Connected || old.Owner != s.Owner || old.SessionID != s.SessionID {
			return wire.NodeRecord{}, Stale
		}
		rec := *old
		rec.Connected = false
		return rec, Applied
	})
	if err != nil || out != Applied {
		return false, err
	}
	r.Publish(s.Tenant, wire.NodeEventMsg{NodeID: s.NodeID, Event: wire.EventNodeDisconnected, Payload: disconnectedPayload(reason, now), TsMs: now})
	return true, nil
}
