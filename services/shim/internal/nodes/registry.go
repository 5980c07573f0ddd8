package nodes

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/shim/internal/catalog"
)

// Node is a cached registry entry.
type Node struct {
	Record   wire.NodeRecord
	Revision uint64
	Catalog  *catalog.Catalog
}

// Outcome of applying a device event.
type Outcome int

const (
	Applied   Outcome = iota // the record changed
	Unchanged                // the event agreed with the record
	Stale                    // the event belongs to an older or ended session
	Parked                   // the event waits for its session to reach the record
)

func (o Outcome) String() string {
	return [...]string{"applied", "unchanged", "stale", "parked"}[o]
}

// Registry reads and writes node records.
type Registry struct {
	kv      jetstream.KeyValue
	nc      *nats.Conn
	log     *slog.Logger
	schemas *catalog.Schemas

	mu    sync.RWMutex
	nodes map[string]map[string]*Node // tenant -> node id -> node

	parkMu   sync.Mutex
	parked   map[string][]Pending // key + "\x00" + session
	nParked  int
	maxPark  int
	parkTTL  time.Duration
	resubmit func(Pending)

	unreachableMu sync.Mutex
	unreachable   map[string]struct{} // keys with a MarkUnreachable under way
}

// Pending is a device event waiting for its session to reach the record.
type Pending struct {
	Event    *wire.DeviceEvent
	Deadline time.Time
}

// Options of a Registry.
type Options struct {
	// ParkTTL is how long an event may wait for its session (default 10 s).
	ParkTTL time.Duration
	// MaxParked bounds the waiting events (default 10000); more are dropped.
	MaxParked int
	// Resubmit runs a parked event again once its session is on record. It
	// must not block (hand the event to a worker).
	Resubmit func(Pending)
}

// Open creates the node registry bucket if it does not exist yet
// (wire.NodesBucketConfig) and returns a registry on it. Nothing is cached until Watch
// runs.
func Open(ctx context.Context, nc *nats.Conn, log *slog.Logger, schemas *catalog.Schemas, opts Options) (*Registry, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("nodes: jetstream: %w", err)
	}
	kv, err := wire.OpenBucket(ctx, js, wire.NodesBucketConfig())
	if err != nil {
		return nil, fmt.Errorf("nodes: bucket %s: %w", wire.BucketNodes, err)
	}
	if opts.ParkTTL <= 0 {
		opts.ParkTTL = 10 * time.Second
	}
	if opts.MaxParked <= 0 {
		opts.MaxParked = 10000
	}
	if opts.Resubmit == nil {
		opts.Resubmit = func(Pending) {}
	}
	return &Registry{
		kv: kv, nc: nc, log: log, schemas: schemas,
		nodes:       map[string]map[string]*Node{},
		parked:      map[string][]Pending{},
		maxPark:     opts.MaxParked,
		parkTTL:     opts.ParkTTL,
		resubmit:    opts.Resubmit,
		unreachable: map[string]struct{}{},
	}, nil
}

// Watch feeds the cache from the bucket until ctx is done. loaded is closed
// once every existing record is in the cache.
func (r *Registry) Watch(ctx context.Context, loaded chan<- struct{}) error {
	w, err := r.kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("nodes: watch: %w", err)
	}
	defer func() { _ = w.Stop() }()
	initial := true
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return nil
			}
			if e == nil {
				if initial {
					initial = false
					close(loaded)
				}
				continue
			}
			r.observe(e)
		}
	}
}

// observe updates the cache from one KV entry.
func (r *Registry) observe(e jetstream.KeyValueEntry) {
	tenant, node, ok := splitKey(e.Key())
	if !ok {
		return
	}
	if e.Operation() != jetstream.KeyValuePut {
		r.mu.Lock()
		if m := r.nodes[tenant]; m != nil {
			if old := m[node]; old != nil && old.Revision < e.Revision() {
				delete(m, node)
			}
		}
		r.mu.Unlock()
		return
	}
	var rec wire.NodeRecord
	if err := json.Unmarshal(e.Value(), &rec); err != nil {
		r.log.Warn("node record is not valid JSON", "key", e.Key(), "err", err)
		return
	}
	if rec.Kind != wire.NodeKindXiaoZhi {
		return // gateway-held OpenClaw nodes are not the shim's
	}
	r.store(tenant, node, rec, e.Revision())
	if rec.Connected {
		r.wake(e.Key(), rec.SessionID)
	}
}

// store puts a record into the cache unless the cache already holds a newer
// revision; a catalog with unchanged bytes keeps its compiled schemas.
func (r *Registry) store(tenant, node string, rec wire.NodeRecord, rev uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.nodes[tenant]
	if m == nil {
		m = map[string]*Node{}
		r.nodes[tenant] = m
	}
	old := m[node]
	if old != nil && old.Revision >= rev {
		return
	}
	n := &Node{Record: rec, Revision: rev}
	if old != nil && toolsEqual(old.Record.Tools, rec.Tools) {
		n.Catalog = old.Catalog
	} else {
		n.Catalog = catalog.New(rec.Tools, r.schemas)
	}
	m[node] = n
}

// Lookup returns a node from the cache; it costs no NATS round trip.
func (r *Registry) Lookup(tenant, nodeID string) (*Node, bool) {
	r.mu.RLock()
	n, ok := r.nodes[tenant][nodeID]
	r.mu.RUnlock()
	return n, ok
}

// Fetch reads a node from the bucket (for a cache miss) and caches it.
func (r *Registry) Fetch(ctx context.Context, tenant, nodeID string) (*Node, bool, error) {
	if wire.ValidTenant(tenant) != nil || wire.ValidNodeID(nodeID) != nil {
		return nil, false, nil
	}
	e, err := r.kv.Get(ctx, wire.NodeKey(tenant, nodeID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("nodes: get %s: %w", nodeID, err)
	}
	r.observe(e)
	n, ok := r.Lookup(tenant, nodeID)
	return n, ok, nil
}

// Len is the number of cached nodes.
func (r *Registry) Len() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	n := 0
	for _, m := range r.nodes {
		n += len(m)
	}
	return n
}

func splitKey(key string) (tenant, node string, ok bool) {
	for i := 0; i < len(key); i++ {
		if key[i] == '.' {
			return key[:i], key[i+1:], i > 0 && i < len(key)-1
		}
	}
	return "", "", false
}

// maxCASAttempts bounds retries when replicas race on one record.
const maxCASAttempts = 16

// update runs a compare-and-set loop on one record. change returns the new
// record and an outcome; only Applied is written.
func (r *Registry) update(ctx context.Context, key string, change func(old *wire.NodeRecord) (wire.NodeRecord, Outcome)) (old *wire.NodeRecord, rec wire.NodeRecord, out Outcome, err error) {
	for range maxCASAttempts {
		var rev uint64
		var cur []byte
		old = nil
		e, err := r.kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return nil, rec, 0, fmt.Errorf("nodes: get %s: %w", key, err)
		default:
			rev, cur = e.Revision(), e.Value()
			var o wire.NodeRecord
			if json.Unmarshal(cur, &o) == nil {
				old = &o
			}
		}
		rec, out = change(old)
		if out != Applied {
			return old, rec, out, nil
		}
		data, err := json.Marshal(rec)
		if err != nil {
			return old, rec, 0, fmt.Errorf("nodes: encode %s: %w", key, err)
		}
		if bytes.Equal(data, cur) {
			return old, rec, Unchanged, nil
		}
		if rev == 0 {
			_, err = r.kv.Create(ctx, key, data)
		} else {
			_, err = r.kv.Update(ctx, key, data, rev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue // another replica wrote first: read again
		}
		if err != nil {
			return old, rec, 0, fmt.Errorf("nodes: write %s: %w", key, err)
		}
		return old, rec, Applied, nil
	}
	return nil, rec, 0, fmt.Errorf("nodes: %s: gave up after %d conflicting writes", key, maxCASAttempts)
}

// ApplyEvent applies a validated online, tools or offline event (tenant and
// device are canonical and match the subject) and publishes the node events
// its change implies. A tools or offline event for a session the record does
// not hold yet is parked.
func (r *Registry) ApplyEvent(ctx context.Context, p Pending) (Outcome, error) {
	ev := p.Event
	key := wire.NodeKey(ev.Tenant, wire.DeviceNodeID(ev.Device))
	var parkable bool
	old, rec, out, err := r.update(ctx, key, func(old *wire.NodeRecord) (wire.NodeRecord, Outcome) {
		var rec wire.NodeRecord
		var ok bool
		switch ev.Kind {
		case wire.DeviceOnline:
			rec, ok = applyOnline(old, ev)
		case wire.DeviceConnecting:
			rec, ok = applyConnecting(old, ev)
		case wire.DeviceTools:
			rec, ok = applyTools(old, ev)
		case wire.DeviceOffline:
			rec, ok = applyOffline(old, ev)
		}
		if ok {
			return rec, Applied
		}
		parkable = ev.Kind != wire.DeviceOnline && ev.Kind != wire.DeviceConnecting && (old == nil || old.SessionID != ev.SessionID)
		return rec, Stale
	})
	if err != nil {
		return 0, err
	}
	switch out {
	case Applied:
		r.publishChange(old, &rec, ev)
	case Stale:
		if parkable && r.park(key, p) {
			return Parked, nil
		}
	}
	return out, nil
}

// publishChange announces what an applied event changed.
func (r *Registry) publishChange(old, rec *wire.NodeRecord, ev *wire.DeviceEvent) {
	now := time.Now().UnixMilli()
	switch ev.Kind {
	case wire.DeviceOnline, wire.DeviceConnecting, wire.DeviceTools:
		if ev.Kind != wire.DeviceTools && (old == nil || !old.Connected || old.SessionID != rec.SessionID) {
			r.Publish(rec.Tenant, wire.NodeEventMsg{NodeID: rec.NodeID, Event: wire.EventNodeConnected, Payload: connectedPayload(rec), TsMs: now})
		}
		if old != nil && rec.ToolsVersion != old.ToolsVersion {
			r.publishToolsChanged(old, rec, now)
		}
	case wire.DeviceOffline:
		r.Publish(rec.Tenant, wire.NodeEventMsg{NodeID: rec.NodeID, Event: wire.EventNodeDisconnected, Payload: disconnectedPayload(ev.Reason, ev.AtMs), TsMs: now})
	}
}

// MarkUnreachable records that a device did not answer on its subject (NATS
// had no responders): the record becomes disconnected if it still names the
// same hub and session. Concurrent calls for one node collapse into one.
func (r *Registry) MarkUnreachable(ctx context.Context, tenant, nodeID, owner, session string) {
	key := wire.NodeKey(tenant, nodeID)
	r.unreachableMu.Lock()
	if _, busy := r.unreachable[key]; busy {
		r.unreachableMu.Unlock()
		return
	}
	r.unreachable[key] = struct{}{}
	r.unreachableMu.Unlock()
	defer func() {
		r.unreachableMu.Lock()
		delete(r.unreachable, key)
		r.unreachableMu.Unlock()
	}()
	now := time.Now().UnixMilli()
	_, _, out, err := r.update(ctx, key, func(old *wire.NodeRecord) (wire.NodeRecord, Outcome) {
		if old == nil || !old.Connected || old.Owner != owner || old.SessionID != session {
			return wire.NodeRecord{}, Stale
		}
		rec := *old
		rec.Connected = false
		return rec, Applied
	})
	if err != nil {
		r.log.Warn("could not mark node unreachable", "tenant", tenant, "node", nodeID, "err", err)
		return
	}
	if out == Applied {
		r.log.Info("node unreachable, marked disconnected", "tenant", tenant, "node", nodeID, "hub", owner)
		r.Publish(tenant, wire.NodeEventMsg{NodeID: nodeID, Event: wire.EventNodeDisconnected, Payload: disconnectedPayload("unreachable", now), TsMs: now})
	}
}

// Publish sends a node event to the tenant's gateways.
func (r *Registry) Publish(tenant string, ev wire.NodeEventMsg) {
	data, err := json.Marshal(ev)
	if err != nil {
		r.log.Error("encode node event", "err", err)
		return
	}
	msg := &nats.Msg{Subject: wire.NodeEvent(tenant), Header: nats.Header{wire.HeaderTenant: []string{tenant}}, Data: data}
	if err := r.nc.PublishMsg(msg); err != nil {
		r.log.Warn("publish node event", "tenant", tenant, "event", ev.Event, "err", err)
	}
}

func connectedPayload(rec *wire.NodeRecord) json.RawMessage {
	b, _ := json.Marshal(struct {
		DisplayName   string `json:"displayName,omitempty"`
		Platform      string `json:"platform,omitempty"`
		Transport     string `json:"transport,omitempty"`
		RemoteIP      string `json:"remoteIp,omitempty"`
		ConnectedAtMs int64  `json:"connectedAtMs"`
		ToolsVersion  uint64 `json:"toolsVersion,omitempty"`
		ToolsStale    bool   `json:"toolsStale,omitempty"`
	}{rec.DisplayName, rec.Platform, rec.Transport, rec.RemoteIP, rec.ConnectedAtMs, rec.ToolsVersion, rec.ToolsStale})
	return b
}

func disconnectedPayload(reason string, atMs int64) json.RawMessage {
	b, _ := json.Marshal(struct {
		Reason           string `json:"reason,omitempty"`
		DisconnectedAtMs int64  `json:"disconnectedAtMs"`
	}{reason, atMs})
	return b
}

func (r *Registry) toolsPayload(tools json.RawMessage) json.RawMessage {
	names := catalog.New(tools, r.schemas).Names()
	if names == nil {
		names = []string{}
	}
	b, _ := json.Marshal(struct {
		Tools []string `json:"tools"`
	}{names})
	return b
}

// park keeps an event until its session reaches the record; false when the
// event is past its deadline or too many events wait.
func (r *Registry) park(key string, p Pending) bool {
	now := time.Now()
	if p.Deadline.IsZero() {
		p.Deadline = now.Add(r.parkTTL)
	}
	if now.After(p.Deadline) {
		return false
	}
	pk := key + "\x00" + p.Event.SessionID
	r.parkMu.Lock()
	if r.nParked >= r.maxPark {
		r.sweepLocked(now)
	}
	if r.nParked >= r.maxPark {
		r.parkMu.Unlock()
		return false
	}
	r.parked[pk] = append(r.parked[pk], p)
	r.nParked++
	r.parkMu.Unlock()
	// The session may have reached the cache between the read and the park.
	tenant, node, _ := splitKey(key)
	if n, ok := r.Lookup(tenant, node); ok && n.Record.Connected && n.Record.SessionID == p.Event.SessionID {
		r.wake(key, p.Event.SessionID)
	}
	return true
}

// wake resubmits the events parked for a session now on record.
func (r *Registry) wake(key, session string) {
	r.parkMu.Lock()
	if r.nParked == 0 {
		r.parkMu.Unlock()
		return
	}
	pk := key + "\x00" + session
	ps := r.parked[pk]
	delete(r.parked, pk)
	r.nParked -= len(ps)
	r.parkMu.Unlock()
	for _, p := range ps {
		r.resubmit(p)
	}
}

// Sweep drops parked events past their deadline.
func (r *Registry) Sweep() {
	r.parkMu.Lock()
	r.sweepLocked(time.Now())
	r.parkMu.Unlock()
}

func (r *Registry) sweepLocked(now time.Time) {
	for k, ps := range r.parked {
		kept := ps[:0]
		for _, p := range ps {
			if now.Before(p.Deadline) {
				kept = append(kept, p)
			} else {
				r.log.Debug("dropped device event whose session never reached the record", "kind", p.Event.Kind, "tenant", p.Event.Tenant, "device", p.Event.Device, "session", p.Event.SessionID)
			}
		}
		r.nParked -= len(ps) - len(kept)
		if len(kept) == 0 {
			delete(r.parked, k)
		} else {
			r.parked[k] = kept
		}
	}
}

// ParkedLen is the number of parked events.
func (r *Registry) ParkedLen() int {
	r.parkMu.Lock()
	defer r.parkMu.Unlock()
	return r.nParked
}
