package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/toolcall"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/registry"
)

// session is one MCP session: a principal, a scope and its own SDK server
// (through which it hears list_changed). It was opened on this replica (the
// SDK's handler serves it) or restored from its record (restored: its own
// transport serves it).
type session struct {
	s         *Server
	id        string
	principal access.Principal
	scope     scope
	server    *mcp.Server
	ss        *mcp.ServerSession // set at register, under s.mu
	inflight  atomic.Int64       // tools/call in progress

	// Its record in the shared bucket (nil record: not shared).
	key       string
	record    []byte
	rev       atomic.Uint64 // the record's revision this replica last wrote or read
	refreshed atomic.Int64  // unix ns of the last refresh

	restored  bool
	transport *mcp.StreamableServerTransport // restored only
	idleMu    sync.Mutex
	inUse     int         // requests in progress, restored only
	idle      *time.Timer // closes an idle restored copy
}

func (s *Server) newSession(p access.Principal, sc scope) *session {
	sess := &session{s: s, id: newID(), principal: p, scope: sc}
	sess.key = recordKey(p, sess.id)
	sess.server = s.newSDKServer(sess)
	return sess
}

// register makes an initialized session reachable by its id and by its
// tenant's change notifications, until it ends. It returns the session
// registered under the id: sess, or one registered before (a repeated
// initialize, a concurrent restore).
func (s *Server) register(sess *session, ss *mcp.ServerSession) *session {
	s.mu.Lock()
	if other, ok := s.sessions[sess.id]; ok {
		s.mu.Unlock()
		return other
	}
	sess.ss = ss
	s.sessions[sess.id] = sess
	set := s.byTenant[sess.principal.Tenant]
	if set == nil {
		set = map[*session]struct{}{}
		s.byTenant[sess.principal.Tenant] = set
	}
	set[sess] = struct{}{}
	s.mu.Unlock()
	go func() {
		_ = ss.Wait()
		if sess.idle != nil {
			sess.idle.Stop()
		}
		s.unregister(sess)
	}()
	return sess
}

// unregister makes a session unreachable here (idempotent).
func (s *Server) unregister(sess *session) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sessions[sess.id] == sess {
		delete(s.sessions, sess.id)
	}
	if set := s.byTenant[sess.principal.Tenant]; set != nil {
		delete(set, sess)
		if len(set) == 0 {
			delete(s.byTenant, sess.principal.Tenant)
		}
	}
}

func (sess *session) serverSession() *mcp.ServerSession {
	sess.s.mu.Lock()
	defer sess.s.mu.Unlock()
	return sess.ss
}

// Close ends every session of this replica (the gateway's shutdown): their
// GET streams end and their clients must open new sessions elsewhere.
func (s *Server) Close() {
	s.mu.Lock()
	open := make([]*mcp.ServerSession, 0, len(s.sessions))
	for _, sess := range s.sessions {
		open = append(open, sess.ss)
	}
	s.mu.Unlock()
	for _, ss := range open {
		_ = ss.Close()
	}
}

// Sessions reports the number of open sessions on this replica.
func (s *Server) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions)
}

// middleware answers tools/list and tools/call from the registry and the
// invoke path; the SDK handles everything else.
func (sess *session) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "initialize":
			res, err := next(ctx, method, req)
			if err != nil {
				return res, err
			}
			ss, ok := req.GetSession().(*mcp.ServerSession)
			if !ok {
				return res, err
			}
			if sess.s.store != nil && sess.record == nil {
				version := ""
				if ir, ok := res.(*mcp.InitializeResult); ok {
					version = ir.ProtocolVersion
				}
				if serr := sess.save(ctx, ss, version); serr != nil {
					// A session other replicas cannot serve would fail
					// behind a load balancer: refuse it now.
					sess.s.log.Warn("mcp: store session", "err", serr)
					go func() { _ = ss.Close() }()
					return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "MCP sessions unavailable; retry"}
				}
			}
			sess.s.register(sess, ss)
			return res, err
		case "notifications/initialized":
			if sess.restored {
				return nil, nil // the replica that initialized the session had it
			}
		case "tools/list":
			if r, ok := req.(*mcp.ListToolsRequest); ok {
				return sess.listTools(ctx, r)
			}
		case "tools/call":
			if r, ok := req.(*mcp.CallToolRequest); ok {
				return sess.callTool(ctx, r)
			}
		}
		return next(ctx, method, req)
	}
}

// errInvalidCursor answers a cursor this server did not hand out.
var errInvalidCursor = &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "invalid cursor"}

// listTools answers one page of the session's tools: those of connected
// nodes in its scope that the policy lets the principal call (asked as for
// node.list: the tool, no arguments).
func (sess *session) listTools(ctx context.Context, req *mcp.ListToolsRequest) (*mcp.ListToolsResult, error) {
	cursor := ""
	if req.Params != nil {
		cursor = req.Params.Cursor
	}
	tools, next, err := sess.page(ctx, cursor)
	if err != nil {
		return nil, err
	}
	return &mcp.ListToolsResult{Tools: tools, NextCursor: next}, nil
}

// page is tools/list's work, apart from the SDK's types of request.
func (sess *session) page(ctx context.Context, cursor string) ([]*mcp.Tool, string, error) {
	after := ""
	if cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(cursor)
		if err != nil || len(b) == 0 {
			return nil, "", errInvalidCursor
		}
		after = string(b)
	}
	snap := sess.s.catalogs.snapshot(sess.principal.Tenant)
	size := sess.s.cfg.PageSize
	out := make([]*mcp.Tool, 0, min(size, len(snap.entries)))
	last, more := "", false
	visit := func(name string, e *entry) bool {
		if !e.node.Connected || !sess.visible(ctx, e.node, e.tool.name) {
			return true
		}
		if len(out) == size {
			more = true // a next page holds at least this tool
			return false
		}
		out = append(out, e.tool.mcpTool(name, e.node))
		last = name
		return true
	}
	switch sess.scope.kind {
	case scopeNode:
		// The device's own names, in their order.
		idx := snap.byNode[sess.scope.id]
		es := make([]*entry, len(idx))
		for i, j := range idx {
			es[i] = &snap.entries[j]
		}
		sort.Slice(es, func(i, j int) bool { return es[i].tool.name < es[j].tool.name })
		start := sort.Search(len(es), func(i int) bool { return es[i].tool.name > after })
		for _, e := range es[start:] {
			if !visit(e.tool.name, e) {
				break
			}
		}
	default:
		var members map[string]bool
		if sess.scope.kind == scopeGroup {
			m, _, err := sess.s.groupMembers(ctx, sess.principal.Tenant, sess.scope.id)
			if err != nil {
				return nil, "", &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "policy groups unavailable; retry"}
			}
			members = m
		}
		start := sort.Search(len(snap.entries), func(i int) bool { return snap.entries[i].name > after })
		for i := start; i < len(snap.entries); i++ {
			e := &snap.entries[i]
			if sess.scope.kind == scopeGroup && !members[e.node.NodeID] {
				continue
			}
			if !visit(e.name, e) {
				break
			}
		}
	}
	if !more {
		return out, "", nil
	}
	return out, base64.RawURLEncoding.EncodeToString([]byte(last)), nil
}

// visible asks the policy whether the principal may call a node's tool.
func (sess *session) visible(ctx context.Context, n *registry.Node, tool string) bool {
	return sess.s.cfg.Authorizer.Authorize(ctx, access.Request{
		Principal: sess.principal, NodeID: n.NodeID, Command: toolcall.CommandCall, Tool: tool,
	}).Allowed
}

// resolve finds the node and device tool an exposed name stands for in
// the session's scope.
func (sess *session) resolve(ctx context.Context, name string) (*entry, error) {
	snap := sess.s.catalogs.snapshot(sess.principal.Tenant)
	switch sess.scope.kind {
	case scopeNode:
		for _, j := range snap.byNode[sess.scope.id] {
			if snap.entries[j].tool.name == name {
				return &snap.entries[j], nil
			}
		}
		return nil, nil
	case scopeGroup:
		i, ok := snap.byName[name]
		if !ok {
			return nil, nil
		}
		members, _, err := sess.s.groupMembers(ctx, sess.principal.Tenant, sess.scope.id)
		if err != nil {
			return nil, err
		}
		if !members[snap.entries[i].node.NodeID] {
			return nil, nil
		}
		return &snap.entries[i], nil
	}
	if i, ok := snap.byName[name]; ok {
		return &snap.entries[i], nil
	}
	return nil, nil
}

// canCall reports whether a role may call tools (operator.write in the
// WebSocket protocol): admins and operators, not viewers.
func canCall(role string) bool { return role == access.RoleAdmin || role == access.RoleOperator }

// callTool runs a tool call through the invoke path. An unknown name is a
// protocol error (as the MCP spec asks); anything that happens to a known
// tool is a tool result, with isError for a failure.
func (sess *session) callTool(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	p := req.Params
	if p == nil || p.Name == "" {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "tools/call needs a tool name"}
	}
	e, err := sess.resolve(ctx, p.Name)
	if err != nil {
		return toolError("policy groups unavailable; retry"), nil
	}
	if e == nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "unknown tool " + strconv.Quote(p.Name) + " (list the tools again: the device may have left)"}
	}
	if !canCall(sess.principal.Role) {
		return toolError("this token's role (" + sess.principal.Role + ") may list tools but not call them"), nil
	}
	call := ToolCall{Principal: sess.principal, NodeID: e.node.NodeID, Tool: e.tool.name, Arguments: p.Arguments,
		SessionID: sess.id, Inflight: &sess.inflight}
	if key, ok := p.Meta[MetaIdempotencyKey].(string); ok && key != "" {
		call.IdempotencyKey = key
	} else {
		call.IdempotencyKey = "mcp-" + newID()
	}
	if req.Extra != nil && req.Extra.Header != nil {
		call.Traceparent = req.Extra.Header.Get("traceparent")
	}
	if req.Session != nil {
		if ip := req.Session.InitializeParams(); ip != nil && ip.ClientInfo != nil {
			call.Client = ip.ClientInfo.Name + "/" + ip.ClientInfo.Version
		}
	}
	res := sess.s.cfg.Invoker.InvokeTool(ctx, call)
	if res.Err != nil {
		return toolError(res.Err.Message), nil
	}
	return deviceResult(res.Payload), nil
}

// toolError is a failed call as a tool result the agent can read.
func toolError(msg string) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: msg}}}
}

// deviceResult turns a node's result into a CallToolResult: a device's
// MCP result as it is (isError and all), anything else as JSON text.
func deviceResult(payload json.RawMessage) *mcp.CallToolResult {
	if len(payload) == 0 {
		return &mcp.CallToolResult{Content: []mcp.Content{}}
	}
	if r, ok := textResult(payload); ok {
		return r
	}
	var probe struct {
		Content json.RawMessage `json:"content"`
	}
	if json.Unmarshal(payload, &probe) == nil && len(probe.Content) > 0 && probe.Content[0] == '[' {
		var r mcp.CallToolResult
		if err := json.Unmarshal(payload, &r); err == nil {
			return &r
		}
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: string(payload)}}}
}

// textResult reads the usual device result, text content and maybe
// isError and nothing else, as the SDK's decoder would (keys matched
// exactly); ok is false for anything else. It spares a call the SDK
// decoder's 32 KiB buffer, the MCP path's largest cost of our own.
func textResult(payload []byte) (*mcp.CallToolResult, bool) {
	var top map[string]json.RawMessage
	if json.Unmarshal(payload, &top) != nil {
		return nil, false
	}
	content := top["content"]
	if len(content) == 0 || content[0] != '[' {
		return nil, false
	}
	r := &mcp.CallToolResult{}
	for k, v := range top {
		switch k {
		case "content":
		case "isError":
			if json.Unmarshal(v, &r.IsError) != nil {
				return nil, false
			}
		default:
			return nil, false
		}
	}
	var items []map[string]json.RawMessage
	if json.Unmarshal(content, &items) != nil {
		return nil, false
	}
	r.Content = make([]mcp.Content, len(items))
	for i, it := range items {
		if string(it["type"]) != `"text"` {
			return nil, false
		}
		tc := &mcp.TextContent{}
		for k, v := range it {
			switch k {
			case "type":
			case "text":
				if json.Unmarshal(v, &tc.Text) != nil {
					return nil, false
				}
			default:
				return nil, false
			}
		}
		r.Content[i] = tc
	}
	return r, true
}

// groupMembers asks for a group's nodes; without a NodeGroups no group
// exists.
func (s *Server) groupMembers(ctx context.Context, tenant, group string) (map[string]bool, bool, error) {
	if s.cfg.Groups == nil {
		return nil, false, nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, ok, err := s.cfg.Groups.GroupMembers(ctx, tenant, group)
	if err != nil {
		s.log.Warn("mcp: policy group", "tenant", tenant, "group", group, "err", err)
		return nil, false, errors.New("policy groups unavailable")
	}
	return m, ok, nil
}
