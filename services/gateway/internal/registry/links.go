package registry

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// Links is the watched copy of the upstream links' leases
// (wire.BucketUpstreamLeases): per node, its links to upstream OpenClaw
// gateways as the shim workers holding them last wrote them, so node.list
// shows why a device is or is not on a tenant's own gateway without a KV
// read per request.
//
// The shims create the bucket: until one did, Run looks for it every
// retry interval. An entry whose holder died expires without a delete
// marker reaching the watch, so an entry older than the bucket's TTL is
// not served (its holder refreshes it every third of the TTL, so a clock
// skew between NATS and the gateway of up to two thirds of it is harmless).
type Links struct {
	js    jetstream.JetStream
	log   *slog.Logger
	retry time.Duration

	mu    sync.RWMutex
	ttl   time.Duration
	nodes map[string]map[string]linkEntry // node key (tenant.node) -> upstream -> link
}

type linkEntry struct {
	link    wire.UpstreamLink
	written time.Time
}

// NewLinks returns an empty copy; Run fills it. retry is how often Run
// looks for the bucket while there is none (0: 2 s).
func NewLinks(js jetstream.JetStream, log *slog.Logger, retry time.Duration) *Links {
	if retry <= 0 {
		retry = 2 * time.Second
	}
	return &Links{js: js, log: log, retry: retry, nodes: map[string]map[string]linkEntry{}}
}

// Run watches the bucket until ctx is done; it never fails: without the
// bucket, or after its watch ended, it tries again.
func (l *Links) Run(ctx context.Context) error {
	for {
		err := l.watch(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			l.log.Warn("upstream links watch", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(l.retry):
		}
	}
}

// watch follows the bucket until its watch ends.
func (l *Links) watch(ctx context.Context) error {
	kv, err := l.js.KeyValue(ctx, wire.BucketUpstreamLeases)
	if err != nil {
		return err
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return err
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	l.mu.Lock()
	l.ttl = st.TTL()
	l.nodes = map[string]map[string]linkEntry{} // the watch replays every entry
	l.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watch ended")
			}
			if e != nil {
				l.apply(e)
			}
		}
	}
}

func (l *Links) apply(e jetstream.KeyValueEntry) {
	parts := strings.SplitN(e.Key(), ".", 3)
	if len(parts) != 3 {
		return
	}
	tenant, upstream, nodeID := parts[0], parts[1], parts[2]
	nodeKey := wire.NodeKey(tenant, nodeID)
	l.mu.Lock()
	defer l.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		l.drop(nodeKey, upstream)
		return
	}
	var link wire.UpstreamLink
	if err := json.Unmarshal(e.Value(), &link); err != nil || link.Tenant != tenant || link.Upstream != upstream ||
		link.NodeID != nodeID || link.State == "" {
		l.log.Debug("upstream links: ignoring malformed entry", "key", e.Key(), "err", err)
		l.drop(nodeKey, upstream)
		return
	}
	link.Tenant = "" // known from the node
	ups := l.nodes[nodeKey]
	if ups == nil {
		ups = map[string]linkEntry{}
		l.nodes[nodeKey] = ups
	}
	ups[upstream] = linkEntry{link: link, written: e.Created()}
}

// drop forgets a link; l.mu held.
func (l *Links) drop(nodeKey, upstream string) {
	if ups := l.nodes[nodeKey]; ups != nil {
		delete(ups, upstream)
		if len(ups) == 0 {
			delete(l.nodes, nodeKey)
		}
	}
}

// Of returns a node's live links, by upstream name.
func (l *Links) Of(tenant, nodeID string) []wire.UpstreamLink {
	l.mu.RLock()
	ups := l.nodes[wire.NodeKey(tenant, nodeID)]
	if len(ups) == 0 {
		l.mu.RUnlock()
		return nil
	}
	now := time.Now()
	out := make([]wire.UpstreamLink, 0, len(ups))
	for _, e := range ups {
		if l.ttl > 0 && now.Sub(e.written) > l.ttl {
			continue // its holder stopped refreshing it: expired in the bucket
		}
		out = append(out, e.link)
	}
	l.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Upstream < out[j].Upstream })
	return out
}
