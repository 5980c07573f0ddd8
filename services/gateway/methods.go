package gateway

import (
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/toolcall"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/protocol"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/registry"
)

// methodRole says which role may call a method.
type methodRole uint8

const (
	roleAny methodRole = iota
	roleOperator
	roleNode
)

type method struct {
	role   methodRole
	scope  string // operator scope required, "" for none
	handle func(c *conn, req protocol.Request)
}

// methods is the dispatch table. As in OpenClaw, node-role methods are
// closed to operators and everything else to nodes; health is open to all.
var methods = map[string]method{
	protocol.MethodHealth:                    {roleAny, "", (*conn).handleHealth},
	protocol.MethodNodeList:                  {roleOperator, protocol.ScopeRead, (*conn).handleNodeList},
	protocol.MethodNodeDescribe:              {roleOperator, protocol.ScopeRead, (*conn).handleNodeDescribe},
	protocol.MethodNodePairList:              {roleOperator, protocol.ScopePairing, (*conn).handleNodePairList},
	protocol.MethodNodeInvoke:                {roleOperator, protocol.ScopeWrite, (*conn).handleNodeInvoke},
	protocol.MethodNodeInvokeResult:          {roleNode, "", (*conn).handleNodeInvokeResult},
	protocol.MethodNodeEvent:                 {roleNode, "", (*conn).handleNodeEventFromHost},
	protocol.MethodSkillsBins:                {roleNode, "", (*conn).handleSkillsBins},
	protocol.MethodNodeSkillsUpdate:          {roleNode, "", (*conn).handleNodeSurfaceUpdate},
	protocol.MethodNodePluginToolsUpdate:     {roleNode, "", (*conn).handleNodeSurfaceUpdate},
	protocol.MethodNodeRunnerInventoryUpdate: {roleNode, "", (*conn).handleNodeSurfaceUpdate},
}

// offLoop lists the methods handled on a goroutine of their own
// (conn.goHandle) rather than on the read loop: they ask the Authorizer,
// which may load a tenant's policy from its store. node.invoke hands itself
// over after its local checks.
var offLoop = map[string]bool{
	protocol.MethodNodeList: true, protocol.MethodNodeDescribe: true, protocol.MethodNodePairList: true,
}

// methodNames and eventNames are advertised in hello-ok.features.
var (
	methodNames = []string{
		protocol.MethodHealth, protocol.MethodNodeList, protocol.MethodNodeDescribe, protocol.MethodNodePairList, protocol.MethodNodeInvoke,
		protocol.MethodNodeInvokeResult, protocol.MethodNodeEvent, protocol.MethodSkillsBins,
		protocol.MethodNodeSkillsUpdate, protocol.MethodNodePluginToolsUpdate, protocol.MethodNodeRunnerInventoryUpdate,
	}
	eventNames = []string{
		protocol.EventConnectChallenge, protocol.EventTick, protocol.EventShutdown,
		protocol.EventNodeEvent, protocol.EventNodeInvokeRequest,
	}
)

// maxUnauthorizedStreak is how many unauthorized-role calls in a row a
// connection may make before it is closed, as in OpenClaw.
const maxUnauthorizedStreak = 10

// handleFrame handles one frame from the client.
func (c *conn) handleFrame(data []byte) {
	req, ferr := protocol.ParseRequest(data)
	if !c.helloDone.Load() {
		switch {
		case ferr != nil:
			c.closeWith(protocol.ClosePolicyViolation, "invalid request frame")
		case req.Method != protocol.MethodConnect:
			const msg = "invalid handshake: first request must be connect"
			c.failHandshake(req.ID, protocol.InvalidRequest(msg), protocol.ClosePolicyViolation, msg)
		default:
			c.handleConnect(req)
		}
		return
	}
	if ferr != nil {
		id := ferr.ID
		if id == "" {
			id = "invalid"
		}
		c.respondError(id, protocol.InvalidFrame(ferr.Msg))
		return
	}
	if req.Method == protocol.MethodConnect {
		c.respondError(req.ID, protocol.ConnectOnlyFirst())
		return
	}
	m, known := methods[req.Method]
	switch {
	case known && m.role == roleNode && c.role != protocol.RoleNode,
		c.role == protocol.RoleNode && (!known || m.role == roleOperator):
		c.respondError(req.ID, protocol.UnauthorizedRole(c.role))
		c.unauthorizedStreak++
		if c.unauthorizedStreak > maxUnauthorizedStreak {
			c.closeWith(protocol.ClosePolicyViolation, protocol.ReasonRepeatedUnauthorized)
		}
		return
	case !known:
		c.respondError(req.ID, protocol.UnknownMethod(req.Method))
		return
	}
	c.unauthorizedStreak = 0
	if m.role == roleOperator && !c.scopes.allows(m.scope) {
		c.respondError(req.ID, protocol.MissingScope(c.protocol, m.scope))
		return
	}
	if c.s.draining.Load() && req.Method == protocol.MethodNodeInvoke {
		c.respondError(req.ID, protocol.Unavailable("gateway shutting down; retry on another replica", true))
		return
	}
	if offLoop[req.Method] {
		c.goHandle(m.handle, req)
		return
	}
	m.handle(c, req)
}

func (c *conn) handleHealth(req protocol.Request) {
	b := append([]byte(`{"ok":true,"ts":`), strconv.FormatInt(time.Now().UnixMilli(), 10)...)
	b = append(b, `,"durationMs":0,"gateway":{"instance":`...)
	b = protocol.AppendString(b, c.s.cfg.Instance)
	b = append(b, `,"nodes":`...)
	b = strconv.AppendInt(b, int64(c.s.reg.Count()), 10)
	b = append(b, `,"natsConnected":`...)
	b = strconv.AppendBool(b, c.s.nc.IsConnected())
	c.respond(req.ID, append(b, `}}`...))
}

func (c *conn) handleNodeList(req protocol.Request) {
	if err := protocol.DecodeParams(protocol.MethodNodeList, req.Params, &struct{}{}); err != nil {
		c.respondError(req.ID, err)
		return
	}
	b := append([]byte(`{"ts":`), strconv.FormatInt(time.Now().UnixMilli(), 10)...)
	b = append(b, `,"nodes":[`...)
	for i, n := range c.s.reg.List(c.principal.Tenant) {
		if i > 0 {
			b = append(b, ',')
		}
		b = c.appendNode(b, n, true)
	}
	c.respond(req.ID, append(b, "]}"...))
}

// handleNodePairList answers node.pair.list, which the stock CLI's
// `openclaw nodes list` calls first. xiaoclaw has no pairing step (the
// tenant's credentials and policy admit nodes), so nothing is pending and
// every node of the tenant is paired.
func (c *conn) handleNodePairList(req protocol.Request) {
	if err := protocol.DecodeParams(protocol.MethodNodePairList, req.Params, &struct{}{}); err != nil {
		c.respondError(req.ID, err)
		return
	}
	b := append([]byte(`{"pending":[],"paired":[`), nil...)
	for i, n := range c.s.reg.List(c.principal.Tenant) {
		if i > 0 {
			b = append(b, ',')
		}
		b = c.appendNode(b, n, true)
	}
	c.respond(req.ID, append(b, "]}"...))
}

func (c *conn) handleNodeDescribe(req protocol.Request) {
	nodeID, perr := protocol.ParseNodeDescribe(req.Params)
	if perr != nil {
		c.respondError(req.ID, perr)
		return
	}
	n := c.s.reg.Get(c.principal.Tenant, nodeID)
	if n == nil {
		c.respondError(req.ID, protocol.UnknownNodeID())
		return
	}
	b := append([]byte(`{"ts":`), strconv.FormatInt(time.Now().UnixMilli(), 10)...)
	b = append(b, ',')
	b = c.appendNode(b, n, false)
	c.respond(req.ID, b)
}

// appendNode appends a node as OpenClaw's NodeListNode; with open it starts
// the object, otherwise it continues one already begun. MCP nodes also get
// their tool catalog, without the tools the caller may not call.
func (c *conn) appendNode(b []byte, n *registry.Node, open bool) []byte {
	if open {
		b = append(b, '{')
	}
	b = append(b, `"nodeId":`...)
	b = protocol.AppendString(b, n.NodeID)
	for _, f := range [...]struct{ key, v string }{
		{"displayName", n.DisplayName}, {"platform", n.Platform}, {"version", n.Version},
		{"clientId", n.ClientID}, {"clientMode", n.ClientMode}, {"remoteIp", n.RemoteIP},
		{"deviceFamily", n.DeviceFamily}, {"modelIdentifier", n.ModelIdentifier}, {"pathEnv", n.PathEnv},
		{"transport", n.Transport},
	} {
		if f.v != "" {
			b = append(b, `,"`...)
			b = append(b, f.key...)
			b = append(b, `":`...)
			b = protocol.AppendString(b, f.v)
		}
	}
	b = appendStrings(append(b, `,"caps":`...), n.Caps)
	b = appendStrings(append(b, `,"commands":`...), n.Commands)
	if len(n.Permissions) > 0 {
		b = append(b, `,"permissions":{`...)
		for i, k := range slices.Sorted(maps.Keys(n.Permissions)) {
			if i > 0 {
				b = append(b, ',')
			}
			b = protocol.AppendString(b, k)
			b = append(b, ':')
			b = strconv.AppendBool(b, n.Permissions[k])
		}
		b = append(b, '}')
	}
	if len(n.Tools) > 0 {
		b = append(b, `,"tools":[`...)
		first := true
		for _, t := range n.Tools {
			if !c.toolVisible(n, t.Name) {
				continue
			}
			if !first {
				b = append(b, ',')
			}
			first = false
			b = append(b, t.Raw...)
		}
		b = append(b, ']')
	}
	if n.ToolsVersion > 0 {
		b = append(b, `,"toolsVersion":`...)
		b = strconv.AppendUint(b, n.ToolsVersion, 10)
	}
	if n.ToolsStale {
		b = append(b, `,"toolsStale":true`...)
	}
	if n.Kind != "" {
		b = append(b, `,"kind":`...)
		b = protocol.AppendString(b, n.Kind)
	}
	b = append(b, `,"paired":true,"connected":`...)
	b = strconv.AppendBool(b, n.Connected)
	if n.Connected && n.ConnectedAtMs > 0 {
		b = append(b, `,"connectedAtMs":`...)
		b = strconv.AppendInt(b, n.ConnectedAtMs, 10)
	}
	if n.LastSeenMs > 0 {
		b = append(b, `,"lastSeenMs":`...)
		b = strconv.AppendInt(b, n.LastSeenMs, 10)
	}
	if c.s.links != nil {
		b = appendUpstreams(b, c.s.links.Of(n.Tenant, n.NodeID))
	}
	return append(b, '}')
}

// appendUpstreams appends a node's links to upstream OpenClaw gateways
// (docs/openclaw.md, "Link states"): why it is or is not on each.
func appendUpstreams(b []byte, links []wire.UpstreamLink) []byte {
	if len(links) == 0 {
		return b
	}
	b = append(b, `,"upstreams":[`...)
	for i, l := range links {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"name":`...)
		b = protocol.AppendString(b, l.Upstream)
		b = append(b, `,"state":`...)
		b = protocol.AppendString(b, l.State)
		if l.LastError != "" {
			b = append(b, `,"lastError":`...)
			b = protocol.AppendString(b, l.LastError)
		}
		if l.RequestID != "" {
			b = append(b, `,"requestId":`...)
			b = protocol.AppendString(b, l.RequestID)
		}
		if l.SinceMs > 0 {
			b = append(b, `,"sinceMs":`...)
			b = strconv.AppendInt(b, l.SinceMs, 10)
		}
		b = append(b, '}')
	}
	return append(b, ']')
}

// toolVisible asks the policy whether the caller may call a tool; a tool it
// may not call is left out of the catalog it sees.
func (c *conn) toolVisible(n *registry.Node, tool string) bool {
	d := c.s.cfg.Authorizer.Authorize(c.ctx, access.Request{
		Principal: c.principal, NodeID: n.NodeID, Command: toolcall.CommandCall, Tool: tool,
	})
	return d.Allowed
}

func appendStrings(b []byte, ss []string) []byte {
	b = append(b, '[')
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = protocol.AppendString(b, s)
	}
	return append(b, ']')
}

// nodeEventPayload encodes the node.event payload operators receive.
func nodeEventPayload(ev *wire.NodeEventMsg) []byte {
	b := append(make([]byte, 0, 64+len(ev.Payload)), `{"nodeId":`...)
	b = protocol.AppendString(b, ev.NodeID)
	b = append(b, `,"event":`...)
	b = protocol.AppendString(b, ev.Event)
	if len(ev.Payload) > 0 {
		b = append(b, `,"payload":`...)
		b = append(b, ev.Payload...)
	}
	b = append(b, `,"ts":`...)
	b = strconv.AppendInt(b, ev.TsMs, 10)
	return append(b, '}')
}
