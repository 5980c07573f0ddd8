package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/protocol"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/registry"
)

// nodeHost is the state of a stock OpenClaw node host (role node) held by
// this replica: its registry entry, its NATS invoke subscription and the
// invokes it has not answered yet.
type nodeHost struct {
	c      *conn
	tenant string
	nodeID string
	key    string
	regRev atomic.Uint64 // revision of this session's registry record
	// registered is closed once the registry write of attachNodeHost has
	// returned, whether or not it succeeded: until then regRev is 0. Only
	// onInvoke waits on it, so only a subscribed session closes it.
	registered chan struct{}
	sub        *nats.Subscription

	mu      sync.Mutex
	pending map[string]*pendingInvoke
	closed  bool
}

// pendingInvoke is an invoke forwarded to the node host and not answered.
type pendingInvoke struct {
	msg     *nats.Msg
	command string
	timer   *time.Timer
}

// attachNodeHost registers a node host after its handshake: it subscribes
// the node's invoke subject, writes the registry record (connected, owned
// by this instance) and announces node.connected. A previous session of the
// same node held here is closed; one held elsewhere closes itself when it
// sees the new record.
func (s *Service) attachNodeHost(c *conn, p *protocol.ConnectParams) error {
	tenant := c.principal.Tenant
	h := &nodeHost{c: c, tenant: tenant, nodeID: c.nodeID, key: wire.NodeKey(tenant, c.nodeID),
		pending: map[string]*pendingInvoke{}, registered: make(chan struct{})}
	now := time.Now()
	cl := p.Client
	rec := wire.NodeRecord{
		NodeID:          c.nodeID,
		Tenant:          tenant,
		Kind:            wire.NodeKindOpenClaw,
		DisplayName:     protocol.Str(cl.DisplayName),
		Platform:        protocol.Str(cl.Platform),
		DeviceFamily:    protocol.Str(cl.DeviceFamily),
		ModelIdentifier: protocol.Str(cl.ModelIdentifier),
		Version:         protocol.Str(cl.Version),
		ClientID:        protocol.Str(cl.ID),
		ClientMode:      protocol.Str(cl.Mode),
		RemoteIP:        c.remoteIP,
		Transport:       wire.TransportWebSocket,
		Caps:            cleanList(p.Caps),
		Commands:        cleanList(p.Commands),
		Permissions:     p.Permissions,
		PathEnv:         protocol.Str(p.PathEnv),
		Connected:       true,
		ConnectedAtMs:   now.UnixMilli(),
		LastSeenMs:      now.UnixMilli(),
		Owner:           s.cfg.Instance,
		SessionID:       c.id,
	}
	c.nodeHost = h

	s.mu.Lock()
	old := s.nodeHosts[h.key]
	s.nodeHosts[h.key] = c
	s.mu.Unlock()
	if old != nil && old != c {
		old.closeWith(protocol.ClosePolicyViolation, protocol.ReasonReplaced)
	}

	sub, err := s.nc.Subscribe(wire.OpenClawNodeInvoke(tenant, c.nodeID), h.onInvoke)
	if err != nil {
		s.forgetNodeHost(c)
		return err
	}
	h.sub = sub
	ctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
	defer cancel()
	rev, err := s.reg.Put(ctx, rec)
	if err == nil {
		h.regRev.Store(rev)
	}
	close(h.registered)
	if err != nil {
		_ = sub.Unsubscribe()
		s.forgetNodeHost(c)
		return err
	}
	// A newer session's record may have reached the watcher while this
	// Put was in flight; onRegistryChange skipped it then (no revision yet
	// to compare), so compare now. Either this check or that callback,
	// which runs after the watcher's copy is updated, sees both revisions.
	s.closeIfReplaced(c, s.reg.Get(tenant, c.nodeID))
	s.publishNodeEvent(tenant, c.nodeID, wire.EventNodeConnected, nil)
	s.log.Info("node host connected", "tenant", tenant, "node", c.nodeID, "name", rec.DisplayName, "remote", c.remoteIP)
	return nil
}

func (s *Service) forgetNodeHost(c *conn) {
	s.mu.Lock()
	if s.nodeHosts[c.nodeHost.key] == c {
		delete(s.nodeHosts, c.nodeHost.key)
	}
	s.mu.Unlock()
}

// detachNodeHost releases a node host whose socket ended: pending invokes
// fail with OpenClaw's "node disconnected (<command>)", the record is marked
// disconnected unless a newer session took it over.
func (s *Service) detachNodeHost(c *conn) {
	h := c.nodeHost
	if h.sub != nil {
		_ = h.sub.Unsubscribe()
	}
	h.mu.Lock()
	h.closed = true
	pending := h.pending
	h.pending = nil
	h.mu.Unlock()
	for _, p := range pending {
		p.timer.Stop()
		respondFault(p.msg, wire.FaultDisconnected, "node disconnected ("+p.command+")")
	}
	s.forgetNodeHost(c)
	if h.regRev.Load() == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	changed, err := s.reg.MarkDisconnected(ctx, h.tenant, h.nodeID, c.id, time.Now())
	if err != nil {
		s.log.Warn("mark node host disconnected", "tenant", h.tenant, "node", h.nodeID, "err", err)
	}
	if changed {
		s.publishNodeEvent(h.tenant, h.nodeID, wire.EventNodeDisconnected, nil)
	}
	s.log.Info("node host disconnected", "tenant", h.tenant, "node", h.nodeID, "pending", len(pending))
}

// onRegistryChange closes a node host held here when another session of
// the same node registered after it (on any replica).
func (s *Service) onRegistryChange(tenant, nodeID string, next *registry.Node) {
	if next == nil || next.Kind != wire.NodeKindOpenClaw || !next.Connected {
		return
	}
	s.mu.RLock()
	c := s.nodeHosts[wire.NodeKey(tenant, nodeID)]
	s.mu.RUnlock()
	if c != nil {
		s.closeIfReplaced(c, next)
	}
}

// closeIfReplaced closes node host c when next is a connected record of
// another session written after c's own. Before c's record is written
// (revision 0) nothing is decided: attachNodeHost checks again after.
func (s *Service) closeIfReplaced(c *conn, next *registry.Node) {
	if next == nil || next.Kind != wire.NodeKindOpenClaw || !next.Connected || next.SessionID == c.id {
		return
	}
	if rev := c.nodeHost.regRev.Load(); rev != 0 && next.Revision > rev {
		c.closeWith(protocol.ClosePolicyViolation, protocol.ReasonReplaced)
	}
}

// current reports whether this session still is the node's registered one.
func (h *nodeHost) current() bool {
	n := h.c.s.reg.Get(h.tenant, h.nodeID)
	return n == nil || n.SessionID == h.c.id || n.Revision <= h.regRev.Load()
}

// onInvoke forwards an invoke from NATS to the node host as a
// node.invoke.request event and parks the reply until the node answers, the
// deadline passes or the socket ends. It never blocks on the node host.
func (h *nodeHost) onInvoke(m *nats.Msg) {
	s := h.c.s
	// Another replica may route an invoke here as soon as it sees this
	// session's record, before the write has returned here: until then
	// current cannot tell an older session's record from a newer one's,
	// and guessing "newer" drops the invoke unanswered. Waiting holds up
	// this node's subscription only, for at most the write's timeout.
	<-h.registered
	if !h.current() {
		return // a newer session of this node answers
	}
	var req wire.InvokeRequest
	if err := json.Unmarshal(m.Data, &req); err != nil || req.Command == "" || req.NodeID != h.nodeID {
		respondFault(m, wire.FaultInvalidRequest, "malformed invoke request")
		return
	}
	deadline := wire.Deadline(m.Header, s.cfg.MaxInvokeTimeout)
	id := newUUID()
	p := &pendingInvoke{msg: m, command: req.Command}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		respondFault(m, wire.FaultDisconnected, "node disconnected ("+req.Command+")")
		return
	}
	h.pending[id] = p
	p.timer = time.AfterFunc(time.Until(deadline), func() {
		h.resolve(id, false, nil, wire.FaultTimeout, "node invoke timed out")
	})
	h.mu.Unlock()

	timeoutMs := max(time.Until(deadline).Milliseconds(), 1)
	b := make([]byte, 0, 160+len(req.Params)*2+len(req.IdempotencyKey))
	b = append(b, `{"id":`...)
	b = protocol.AppendString(b, id)
	b = append(b, `,"nodeId":`...)
	b = protocol.AppendString(b, h.nodeID)
	b = append(b, `,"command":`...)
	b = protocol.AppendString(b, req.Command)
	b = append(b, `,"paramsJSON":`...)
	if len(req.Params) > 0 {
		b = protocol.AppendStringBytes(b, req.Params)
	} else {
		b = append(b, "null"...) // as OpenClaw sends absent params
	}
	b = append(b, `,"timeoutMs":`...)
	b = strconv.AppendInt(b, timeoutMs, 10)
	if req.IdempotencyKey != "" {
		b = append(b, `,"idempotencyKey":`...)
		b = protocol.AppendString(b, req.IdempotencyKey)
	}
	b = append(b, '}')
	// Targeted events carry no seq.
	frame := protocol.AppendEvent(make([]byte, 0, len(b)+64), protocol.EventNodeInvokeRequest, b, protocol.NoSeq)
	if !h.c.send(frame) {
		h.resolve(id, false, nil, wire.FaultUnavailable, "failed to send invoke to node")
	}
}

// resolve answers a pending invoke; it reports false for an unknown or
// already answered id.
func (h *nodeHost) resolve(id string, ok bool, payload json.RawMessage, code, message string) bool {
	h.mu.Lock()
	p := h.pending[id]
	delete(h.pending, id)
	h.mu.Unlock()
	if p == nil {
		return false
	}
	p.timer.Stop()
	if !ok {
		respondFault(p.msg, code, message)
		return true
	}
	b := make([]byte, 0, 24+len(payload))
	b = append(b, `{"ok":true`...)
	if len(payload) > 0 {
		b = append(b, `,"payload":`...)
		b = append(b, payload...)
	}
	b = append(b, '}')
	if err := p.msg.Respond(b); errors.Is(err, nats.ErrMaxPayload) {
		respondFault(p.msg, wire.FaultTooLarge, "node result too large for the bus")
	}
	return true
}

// respondFault answers a NATS request with a failed wire.InvokeReply.
func respondFault(m *nats.Msg, code, message string) {
	if m.Reply == "" {
		return
	}
	b := protocol.AppendString([]byte(`{"ok":false,"error":{"code":`), code)
	b = append(b, `,"message":`...)
	b = protocol.AppendString(b, message)
	b = append(b, "}}"...)
	r := &nats.Msg{Subject: m.Reply, Data: b, Header: nats.Header{}}
	if code != "" {
		r.Header.Set(wire.HeaderFault, code)
	}
	_ = m.RespondMsg(r)
}

func (c *conn) handleNodeInvokeResult(req protocol.Request) {
	r, perr := protocol.ParseNodeInvokeResult(req.Params)
	if perr != nil {
		c.respondError(req.ID, perr)
		return
	}
	if r.NodeID != c.nodeID {
		c.respondError(req.ID, protocol.NodeIDMismatch())
		return
	}
	var found bool
	if r.OK {
		found = c.nodeHost.resolve(r.ID, true, r.Payload, "", "")
	} else {
		code, msg := "", "node invoke failed"
		if r.Error != nil {
			code = strings.TrimSpace(r.Error.Code)
			if m := strings.TrimSpace(r.Error.Message); m != "" {
				msg = m
			}
		}
		found = c.nodeHost.resolve(r.ID, false, nil, code, msg)
	}
	if found {
		c.respond(req.ID, []byte(`{"ok":true}`))
	} else {
		c.respond(req.ID, []byte(`{"ok":true,"ignored":true}`))
	}
}

// handleNodeEventFromHost publishes a node host's event on the tenant's
// node.event subject; every gateway (this one too) fans it out.
func (c *conn) handleNodeEventFromHost(req protocol.Request) {
	event, payload, perr := protocol.ParseNodeEvent(req.Params)
	if perr != nil {
		c.respondError(req.ID, perr)
		return
	}
	c.s.publishNodeEvent(c.principal.Tenant, c.nodeID, event, payload)
	c.respond(req.ID, []byte(`{"ok":true}`))
}

func (c *conn) handleSkillsBins(req protocol.Request) {
	c.respond(req.ID, []byte(`{"bins":[]}`))
}

// handleNodeSurfaceUpdate acknowledges the surface reports of current node
// hosts (skills, plugin tools, runner inventory); xiaoclaw keeps none of
// them, and an acknowledgement stops the node host from retrying.
func (c *conn) handleNodeSurfaceUpdate(req protocol.Request) {
	b := protocol.AppendString([]byte(`{"nodeId":`), c.nodeID)
	switch req.Method {
	case protocol.MethodNodeSkillsUpdate:
		b = append(b, `,"skills":[]`...)
	case protocol.MethodNodePluginToolsUpdate:
		b = append(b, `,"tools":[]`...)
	}
	c.respond(req.ID, append(b, '}'))
}

// cleanList trims, drops empty entries and de-duplicates, keeping order.
func cleanList(in []string) []string {
	out := make([]string, 0, len(in))
	seen := make(map[string]struct{}, len(in))
	for _, s := range in {
		s = strings.TrimSpace(s)
		if _, dup := seen[s]; s == "" || dup {
			continue
		}
		seen[s] = struct{}{}
		out = append(out, s)
	}
	return out
}
