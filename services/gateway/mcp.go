package gateway

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/authguard"
	"github.com/xiaoclaw/xiaoclaw/pkg/toolcall"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/protocol"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/registry"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/mcpserver"
)

// MCPConfig configures the MCP endpoint on the gateway's port: /mcp,
// /mcp/nodes/{nodeId}, /mcp/groups/{group} (docs/mcp.md).
type MCPConfig struct {
	// Disabled leaves the endpoint out.
	Disabled bool
	// PageSize is the number of tools per tools/list page. Default 100.
	PageSize int
	// SessionTimeout closes a replica's copy of an MCP session idle for
	// that long; the session itself ends after wire.MCPSessionTTL unused.
	// Default 30 min.
	SessionTimeout time.Duration
	// MaxSessionsPerPrincipal caps the MCP sessions one token has open
	// across the replicas. Default 100.
	MaxSessionsPerPrincipal int
	// NotifyDelay collects a tenant's node changes for that long before its
	// sessions hear tools/list_changed. Default 100 ms.
	NotifyDelay time.Duration
	// Groups resolves /mcp/groups/{group}. Default: the Authorizer, when it
	// resolves groups (policy.Engine does); else no group scope.
	Groups mcpserver.NodeGroups
}

// newMCPServer builds the MCP endpoint of a gateway.
func (s *Service) newMCPServer() (*mcpserver.Server, error) {
	return mcpserver.New(mcpserver.Config{
		Auth: s.cfg.Auth, Authorizer: s.cfg.Authorizer, Nodes: registryView{s}, Invoker: mcpInvoker{s},
		Groups: s.cfg.MCP.Groups, Throttle: mcpThrottle{s}, Version: s.cfg.Version, PageSize: s.cfg.MCP.PageSize,
		SessionTimeout: s.cfg.MCP.SessionTimeout, MaxRequestBytes: s.cfg.MaxPayload, NotifyDelay: s.cfg.MCP.NotifyDelay,
		MaxSessionsPerPrincipal: s.cfg.MCP.MaxSessionsPerPrincipal, Log: s.log,
	})
}

// shareMCPSessions keeps the MCP sessions in the bucket every replica
// reads, so any replica serves any request of a session (docs/mcp.md).
func (s *Service) shareMCPSessions(ctx, runCtx context.Context) error {
	kv, err := wire.OpenBucket(ctx, s.js, wire.MCPSessionsBucketConfig())
	if err != nil {
		return fmt.Errorf("gateway: MCP sessions bucket: %w", err)
	}
	return s.mcp.ShareSessions(runCtx, kv)
}

// MCPSessions reports the number of MCP sessions open on this replica.
func (s *Service) MCPSessions() int {
	if s.mcp == nil {
		return 0
	}
	return s.mcp.Sessions()
}

// mcpThrottle puts /mcp's failed authentications in the same per-source
// budget, and the same folded connect audit, as the WebSocket handshake's.
type mcpThrottle struct{ s *Service }

func (t mcpThrottle) RetryAfter(r *http.Request) time.Duration {
	return t.s.authFails.RetryAfter(authguard.Source(authguard.ClientAddr(r, t.s.cfg.TrustedProxies)))
}

func (t mcpThrottle) Failed(r *http.Request, missing bool) {
	host := authguard.ClientAddr(r, t.s.cfg.TrustedProxies)
	a := ConnectAudit{Time: time.Now(), Instance: t.s.cfg.Instance, RemoteIP: host, Role: protocol.RoleOperator, ClientID: "mcp",
		ErrorCode: "AUTH_TOKEN_MISMATCH", Reason: "MCP: invalid bearer token"}
	if missing {
		a.ErrorCode, a.Reason = "AUTH_TOKEN_MISSING", "MCP: no bearer token"
	}
	t.s.authFails.Failed(authguard.Source(host), a)
}

// registryView reads the registry that Run opens (nil before: no nodes).
type registryView struct{ s *Service }

func (v registryView) List(tenant string) []*registry.Node {
	if v.s.reg == nil {
		return nil
	}
	return v.s.reg.List(tenant)
}

func (v registryView) Get(tenant, nodeID string) *registry.Node {
	if v.s.reg == nil {
		return nil
	}
	return v.s.reg.Get(tenant, nodeID)
}

// mcpInvoker runs MCP tool calls as node.invoke mcp.tools.call.
type mcpInvoker struct{ s *Service }

// InvokeTool builds the node.invoke of a tools/call and runs it through the
// same path as the WebSocket's node.invoke.
func (m mcpInvoker) InvokeTool(ctx context.Context, tc mcpserver.ToolCall) mcpserver.ToolResult {
	params := make([]byte, 0, 32+len(tc.Tool)+len(tc.Arguments))
	params = append(params, `{"name":`...)
	params = protocol.AppendString(params, tc.Tool)
	if len(tc.Arguments) > 0 {
		params = append(params, `,"arguments":`...)
		params = append(params, tc.Arguments...)
	}
	params = append(params, '}')
	result, e := m.s.invokeFor(ctx, invokeOrigin{
		principal: tc.Principal, via: ViaMCP, client: tc.Client, requestID: "mcp-" + tc.SessionID,
		traceparent: tc.Traceparent,
		admit: func() (bool, bool) {
			return tc.Inflight.Add(1) > int64(m.s.cfg.MaxInflightPerConn), true
		},
		release: func() { tc.Inflight.Add(-1) },
	}, protocol.NodeInvoke{NodeID: tc.NodeID, Command: toolcall.CommandCall, Params: params, IdempotencyKey: tc.IdempotencyKey})
	if e != nil {
		return mcpserver.ToolResult{Err: toolCallError(tc.NodeID, e)}
	}
	// result is node.invoke's payload {ok, nodeId, command, payload, payloadJSON}.
	var r struct {
		Payload json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(result, &r); err != nil {
		return mcpserver.ToolResult{Err: &mcpserver.CallError{Code: wire.FaultUnavailable, Message: "malformed node result"}}
	}
	return mcpserver.ToolResult{Payload: r.Payload}
}

// toolCallError words a node.invoke error for an agent: the device's own
// message for a device error, what happened to the node for the others,
// and the policy's message (which names the rule) for a denial.
func toolCallError(nodeID string, e *protocol.Error) *mcpserver.CallError {
	code := errorCode(e)
	var d struct {
		NodeError struct {
			Message string `json:"message"`
		} `json:"nodeError"`
	}
	if len(e.Details) > 0 {
		_ = json.Unmarshal(e.Details, &d)
	}
	msg := e.Message
	switch code {
	case wire.FaultNotConnected, wire.FaultDisconnected:
		msg = "node " + nodeID + " is offline: it is not connected to xiaoclaw"
	case wire.FaultTimeout:
		msg = "node " + nodeID + " did not answer in time"
	case wire.FaultDeviceError:
		if d.NodeError.Message != "" {
			msg = d.NodeError.Message
		}
	}
	if e.Retryable && code != wire.FaultDeviceError {
		msg += " (retryable"
		if e.RetryAfterMs > 0 {
			msg += " after " + strconv.FormatInt(e.RetryAfterMs, 10) + " ms"
		}
		msg += ")"
	}
	return &mcpserver.CallError{Code: code, Message: msg}
}

// invokeFor runs a node.invoke for an origin other than a WebSocket and
// waits for its answer: the result payload (ok) or the error.
func (s *Service) invokeFor(ctx context.Context, o invokeOrigin, inv protocol.NodeInvoke) ([]byte, *protocol.Error) {
	type answer struct {
		result []byte
		e      *protocol.Error
	}
	done := make(chan answer, 1)
	o.ctx = ctx
	o.protocol = protocol.V4
	o.answer = func(r []byte, e *protocol.Error) { done <- answer{r, e} }
	s.invoke(&o, encodeInvokeParams(&inv))
	select {
	case a := <-done:
		return a.result, a.e
	case <-ctx.Done():
		// The call goes on and is audited; this caller no longer waits.
		return nil, protocol.Unavailable("the MCP request ended before the node answered", false)
	}
}

// encodeInvokeParams is node.invoke's params for inv, which Service.invoke
// parses as it parses a WebSocket frame's.
func encodeInvokeParams(inv *protocol.NodeInvoke) []byte {
	b := encodeInvokeRequest(inv)
	if inv.TimeoutMs > 0 {
		b = append(b[:len(b)-1], `,"timeoutMs":`...)
		b = strconv.AppendInt(b, inv.TimeoutMs, 10)
		b = append(b, '}')
	}
	return b
}
