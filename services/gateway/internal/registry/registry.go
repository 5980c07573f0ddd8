// Package registry is the gateway's view of the node registry (the
// JetStream KV bucket wire.BucketNodes): an in-memory copy fed by a KV
// watcher, so node.invoke and node.list never wait for a KV round trip, plus
// the writes a gateway makes for the OpenClaw node hosts it holds. Links is
// the same kind of copy of the upstream links' leases
// (wire.BucketUpstreamLeases), which node.list shows per node.
package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// Node is one registry entry as the gateway serves it. It is immutable once
// published: an update replaces the pointer, so readers need no lock.
type Node struct {
	wire.NodeRecord
	Revision uint64
	// Commands and Caps are de-duplicated and sorted, as node.list shows them.
	Commands []string
	Caps     []string
	// Tools is the MCP tool catalog, one raw object per tool.
	Tools []Tool

	commands map[string]struct{}
	sortKey  string
}

// Tool is one MCP tool of a node's catalog.
type Tool struct {
	Name string
	Raw  json.RawMessage
}

// HasCommand reports whether the node declares command.
func (n *Node) HasCommand(command string) bool {
	_, ok := n.commands[command]
	return ok
}

// HasCap reports whether the node declares capability c.
func (n *Node) HasCap(c string) bool {
	_, ok := slices.BinarySearch(n.Caps, c)
	return ok
}

// NewNode prepares a record for serving as the watcher does; for callers
// that hold records of their own (tests, benchmarks).
func NewNode(rec wire.NodeRecord, rev uint64) *Node { return newNode(rec, rev) }

// newNode prepares a record for serving.
func newNode(rec wire.NodeRecord, rev uint64) *Node {
	n := &Node{NodeRecord: rec, Revision: rev}
	n.Commands = dedupSorted(rec.Commands)
	n.Caps = dedupSorted(rec.Caps)
	n.commands = make(map[string]struct{}, len(n.Commands))
	for _, c := range n.Commands {
		n.commands[c] = struct{}{}
	}
	if len(rec.Tools) > 0 {
		var raws []json.RawMessage
		if json.Unmarshal(rec.Tools, &raws) == nil {
			for _, raw := range raws {
				var t struct {
					Name string `json:"name"`
				}
				if json.Unmarshal(raw, &t) == nil && t.Name != "" {
					n.Tools = append(n.Tools, Tool{Name: t.Name, Raw: raw})
				}
			}
		}
	}
	name := rec.DisplayName
	if name == "" {
		name = rec.NodeID
	}
	n.sortKey = strings.ToLower(name)
	return n
}

func dedupSorted(in []string) []string {
	out := make([]string, 0, len(in))
	for _, s := range in {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// ChangeFunc is told about every change the watcher applies; next is nil
// when the node was deleted.
type ChangeFunc func(tenant, nodeID string, next *Node)

// Registry is the watched copy of the node registry.
type Registry struct {
	kv  jetstream.KeyValue
	log *slog.Logger

	mu       sync.RWMutex
	tenants  map[string]map[string]*Node
	onChange []ChangeFunc

	ready     chan struct{}
	readyOnce sync.Once
}

// Open binds the registry bucket, creating it when no service has yet.
func Open(ctx context.Context, js jetstream.JetStream, log *slog.Logger) (*Registry, error) {
	kv, err := wire.OpenBucket(ctx, js, wire.NodesBucketConfig())
	if err != nil {
		return nil, fmt.Errorf("node registry: %w", err)
	}
	return &Registry{kv: kv, log: log, tenants: map[string]map[string]*Node{}, ready: make(chan struct{})}, nil
}

// OnChange registers fn; call it before Run.
func (r *Registry) OnChange(fn ChangeFunc) { r.onChange = append(r.onChange, fn) }

// Ready is closed once the watcher has delivered every existing entry.
func (r *Registry) Ready() <-chan struct{} { return r.ready }

// Run watches the bucket until ctx is done.
func (r *Registry) Run(ctx context.Context) error {
	w, err := r.kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("node registry watch: %w", err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return errors.New("node registry watch ended")
			}
			if e == nil {
				r.readyOnce.Do(func() { close(r.ready) })
				continue
			}
			r.apply(e)
		}
	}
}

func (r *Registry) apply(e jetstream.KeyValueEntry) {
	tenant, nodeID, ok := strings.Cut(e.Key(), ".")
	if !ok || wire.ValidTenant(tenant) != nil || wire.ValidNodeID(nodeID) != nil {
		r.log.Warn("node registry: ignoring malformed key", "key", e.Key())
		return
	}
	var next *Node
	if e.Operation() == jetstream.KeyValuePut {
		var rec wire.NodeRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			r.log.Warn("node registry: ignoring undecodable record", "key", e.Key(), "err", err)
			return
		}
		if rec.Tenant != tenant || rec.NodeID != nodeID {
			// The key decides isolation; a record that disagrees is not served.
			r.log.Warn("node registry: record does not match its key", "key", e.Key(), "tenant", rec.Tenant, "node", rec.NodeID)
			return
		}
		next = newNode(rec, e.Revision())
	}
	r.mu.Lock()
	nodes := r.tenants[tenant]
	if next != nil {
		if nodes == nil {
			nodes = map[string]*Node{}
			r.tenants[tenant] = nodes
		}
		nodes[nodeID] = next
	} else if nodes != nil {
		delete(nodes, nodeID)
		if len(nodes) == 0 {
			delete(r.tenants, tenant)
		}
	}
	r.mu.Unlock()
	for _, fn := range r.onChange {
		fn(tenant, nodeID, next)
	}
}

// Get returns a tenant's node, or nil.
func (r *Registry) Get(tenant, nodeID string) *Node {
	r.mu.RLock()
	n := r.tenants[tenant][nodeID]
	r.mu.RUnlock()
	return n
}

// List returns a tenant's nodes: connected first, then by display name.
func (r *Registry) List(tenant string) []*Node {
	r.mu.RLock()
	out := make([]*Node, 0, len(r.tenants[tenant]))
	for _, n := range r.tenants[tenant] {
		out = append(out, n)
	}
	r.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Connected != b.Connected {
			return a.Connected
		}
		if a.sortKey != b.sortKey {
			return a.sortKey < b.sortKey
		}
		return a.NodeID < b.NodeID
	})
	return out
}

// Count returns the number of nodes the registry holds.
func (r *Registry) Count() int {
	r.mu.RLock()
	defer r.mu.RUnlock()
	n := 0
	for _, nodes := range r.tenants {
		n += len(nodes)
	}
	return n
}

// Put writes a record (the gateway's own OpenClaw node hosts).
func (r *Registry) Put(ctx context.Context, rec wire.NodeRecord) (uint64, error) {
	if err := wire.ValidTenant(rec.Tenant); err != nil {
		return 0, err
	}
	if err := wire.ValidNodeID(rec.NodeID); err != nil {
		return 0, err
	}
	b, err := json.Marshal(rec)
	if err != nil {
		return 0, err
	}
	return r.kv.Put(ctx, wire.NodeKey(rec.Tenant, rec.NodeID), b)
}

// MarkDisconnected sets connected=false on a node's record, but only while
// the record still names sessionID: a newer session of the same node, on
// this or another gateway, is left alone. It reports whether it changed
// the record.
func (r *Registry) MarkDisconnected(ctx context.Context, tenant, nodeID, sessionID string, at time.Time) (bool, error) {
	key := wire.NodeKey(tenant, nodeID)
	for attempt := 0; attempt < 5; attempt++ {
		e, err := r.kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		var rec wire.NodeRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			return false, err
		}
		if rec.SessionID != sessionID || !rec.Connected {
			return false, nil
		}
		rec.Connected = false
		rec.LastSeenMs = at.UnixMilli()
		b, err := json.Marshal(rec)
		if err != nil {
			return false, err
		}
		if _, err = r.kv.Update(ctx, key, b, e.Revision()); err == nil {
			return true, nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) && !errors.Is(err, jetstream.ErrKeyExists) {
			return false, err
		}
	}
	return false, errors.New("node registry: record kept changing")
}

// Owned returns the connected nodes of the given kind whose record names
// owner, e.g. to release what a crashed predecessor of this instance held.
func (r *Registry) Owned(owner, kind string) []*Node {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []*Node
	for _, nodes := range r.tenants {
		for _, n := range nodes {
			if n.Owner == owner && n.Kind == kind && n.Connected {
				out = append(out, n)
			}
		}
	}
	return out
}
