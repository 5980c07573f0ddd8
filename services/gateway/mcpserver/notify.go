package mcpserver

import (
	"context"
	"encoding/json"
	"hash/fnv"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/registry"
)

// notifier turns registry changes into tools/list_changed: a node change
// that touches what a catalog shows (connected, display name, commands,
// tools) is collected per tenant for Config.NotifyDelay, then every session
// of the tenant whose scope holds a changed node is told once.
type notifier struct {
	s *Server

	mu      sync.Mutex
	prints  map[string]map[string]uint64 // tenant -> node -> catalog fingerprint
	pending map[string]map[string]bool   // tenant -> changed nodes awaiting the timer
}

func newNotifier(s *Server) *notifier {
	return &notifier{s: s, prints: map[string]map[string]uint64{}, pending: map[string]map[string]bool{}}
}

// fingerprint hashes what the catalogs show of a node; 0 for a node whose
// tools are not named (or a deleted node).
func fingerprint(n *registry.Node) uint64 {
	if !hasTools(n) {
		return 0
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(n.DisplayName))
	if n.Connected {
		_, _ = h.Write([]byte{1})
	} else {
		_, _ = h.Write([]byte{0})
	}
	for _, t := range n.Tools {
		_, _ = h.Write(t.Raw)
	}
	return h.Sum64() | 1
}

// NodeChanged is the registry's change callback (registry.ChangeFunc).
func (s *Server) NodeChanged(tenant, nodeID string, next *registry.Node) {
	nt := s.notify
	fp := fingerprint(next)
	nt.mu.Lock()
	prints := nt.prints[tenant]
	if prints == nil {
		prints = map[string]uint64{}
		nt.prints[tenant] = prints
	}
	if prints[nodeID] == fp {
		nt.mu.Unlock()
		return // a heartbeat or another change the catalogs do not show
	}
	if fp == 0 {
		delete(prints, nodeID)
	} else {
		prints[nodeID] = fp
	}
	s.catalogs.invalidate(tenant)
	p := nt.pending[tenant]
	if p == nil {
		p = map[string]bool{}
		nt.pending[tenant] = p
		time.AfterFunc(s.cfg.NotifyDelay, func() { nt.flush(tenant) })
	}
	p[nodeID] = true
	nt.mu.Unlock()
}

// idle reports whether no change awaits its notification.
func (nt *notifier) idle() bool {
	nt.mu.Lock()
	defer nt.mu.Unlock()
	return len(nt.pending) == 0
}

// flush tells the tenant's sessions about the collected changes.
func (nt *notifier) flush(tenant string) {
	nt.mu.Lock()
	changed := nt.pending[tenant]
	delete(nt.pending, tenant)
	nt.mu.Unlock()
	s := nt.s
	s.mu.Lock()
	sessions := make([]*session, 0, len(s.byTenant[tenant]))
	for sess := range s.byTenant[tenant] {
		sessions = append(sessions, sess)
	}
	s.mu.Unlock()
	groups := map[string]map[string]bool{}
	for _, sess := range sessions {
		if sess.hears(changed, groups) {
			sess.listChanged()
		}
	}
}

// hears reports whether a change of the given nodes touches the session's
// scope; groups caches group lookups across sessions of one flush.
func (sess *session) hears(changed map[string]bool, groups map[string]map[string]bool) bool {
	switch sess.scope.kind {
	case scopeNode:
		return changed[sess.scope.id]
	case scopeGroup:
		members, ok := groups[sess.scope.id]
		if !ok {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			m, _, err := sess.s.groupMembers(ctx, sess.principal.Tenant, sess.scope.id)
			cancel()
			if err != nil {
				return true // cannot tell: a spurious list_changed costs one tools/list
			}
			members = m
			groups[sess.scope.id] = m
		}
		for n := range changed {
			if members[n] {
				return true
			}
		}
		return false
	}
	return true
}

// listChangedTool is never listed or callable (the session's middleware
// answers tools/list and tools/call): adding it to the session's own SDK
// server is how the SDK is told to send notifications/tools/list_changed.
var listChangedTool = &mcp.Tool{Name: "xiaoclaw-list-changed", InputSchema: json.RawMessage(`{"type":"object"}`)}

func (sess *session) listChanged() {
	sess.server.AddTool(listChangedTool, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return toolError("not a tool"), nil
	})
}
