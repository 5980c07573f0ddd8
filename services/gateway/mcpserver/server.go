// Package mcpserver serves a tenant's devices as one MCP server over
// Streamable HTTP (the official Go SDK's handler): tools/list lists the
// tools of the tenant's connected nodes under names valid for any agent,
// tools/call runs one through the gateway's node.invoke path (policy,
// idempotency, limits, audit, tracing), and every session hears
// notifications/tools/list_changed when a node in its scope connects,
// disconnects or changes its catalog. A session sees the whole tenant
// (/mcp), one node with the device's own tool names (/mcp/nodes/{nodeId}),
// or a policy group of nodes (/mcp/groups/{group}). Sessions are shared
// by the gateway replicas through a NATS KV bucket (shared.go), so any
// replica serves any request of a session. docs/mcp.md is the user guide.
package mcpserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/registry"
)

// Nodes is the gateway's copy of the node registry (*registry.Registry).
type Nodes interface {
	List(tenant string) []*registry.Node
	Get(tenant, nodeID string) *registry.Node
}

// NodeGroups resolves a tenant's policy group (pkg/policy's groups) to the
// ids of its nodes; ok is false for a group the tenant does not have.
type NodeGroups interface {
	GroupMembers(ctx context.Context, tenant, group string) (members map[string]bool, ok bool, err error)
}

// ToolCall is one tools/call on its way to a node.
type ToolCall struct {
	Principal access.Principal
	NodeID    string
	Tool      string          // the tool's name on the node
	Arguments json.RawMessage // as the client sent them; nil when absent
	// IdempotencyKey is the node.invoke key: the client's (tools/call
	// _meta "xiaoclaw/idempotencyKey") or a new one.
	IdempotencyKey string
	// Traceparent is the HTTP request's W3C traceparent header, if any.
	Traceparent string
	// Client is the MCP client's "name/version" from initialize.
	Client    string
	SessionID string
	// Inflight counts the session's calls in flight: the invoke path caps
	// it as it caps a WebSocket connection's.
	Inflight *atomic.Int64
}

// ToolResult is what a call came back with: the node's result, or why
// there is none.
type ToolResult struct {
	Payload json.RawMessage // the node's tools/call result
	Err     *CallError
}

// CallError is a call that did not produce the node's result.
type CallError struct {
	Code    string // the node.invoke error code (NOT_CONNECTED, TIMEOUT, DEVICE_ERROR, …)
	Message string // for the agent: what happened and, for a denial, the rule
}

// Invoker runs a tool call through the gateway's node.invoke path.
type Invoker interface {
	InvokeTool(ctx context.Context, call ToolCall) ToolResult
}

// AuthThrottle is the gateway's per-source budget of failed
// authentications, shared with the WebSocket handshake, so /mcp is no way
// around it.
type AuthThrottle interface {
	// RetryAfter is how long the request's source must wait; 0: go on.
	RetryAfter(r *http.Request) time.Duration
	// Failed records a refused token (missing: none) from the request's
	// source.
	Failed(r *http.Request, missing bool)
}

// Config configures a Server. Zero values take the documented defaults.
type Config struct {
	Auth       access.Authenticator // operator tokens; required
	Authorizer access.Authorizer    // hides the tools a principal may not call; required
	Nodes      Nodes                // required
	Invoker    Invoker              // required
	Groups     NodeGroups           // nil: /mcp/groups/ answers 404
	Throttle   AuthThrottle         // nil: failed authentications are not throttled
	Version    string               // serverInfo.version
	// PageSize is the number of tools per tools/list page. Default 100.
	PageSize int
	// SessionTimeout closes this replica's copy of a session idle for that
	// long; a shared session's record lives on (wire.MCPSessionTTL) and
	// the next request restores it. Default 30 min.
	SessionTimeout time.Duration
	// MaxRequestBytes caps an HTTP request body; larger answers 413.
	// Default 1 MiB.
	MaxRequestBytes int64
	// MaxSessionsPerPrincipal caps the sessions a token has open (on every
	// replica, when sessions are shared); one more answers 429. Default 100.
	MaxSessionsPerPrincipal int
	// NotifyDelay collects the node changes of a tenant for that long
	// before sessions hear tools/list_changed. Default 100 ms.
	NotifyDelay time.Duration
	Log         *slog.Logger
}

// Protocol versions served: the stateful Streamable HTTP revisions the SDK
// speaks. 2026-07-28 (sessionless) is left out: sessions are needed for
// list_changed on the GET stream.
var protocolVersions = []string{"2025-11-25", "2025-06-18"}

// Server is the MCP endpoint of one gateway replica.
type Server struct {
	cfg      Config
	log      *slog.Logger
	catalogs *catalogs
	sdk      *mcp.StreamableHTTPHandler
	base     *mcp.Server // answers the SDK's per-request protocol version check

	// store holds the sessions' records for every replica (ShareSessions);
	// nil: sessions stay on this replica. Set before serving.
	store jetstream.KeyValue

	mu       sync.Mutex
	sessions map[string]*session              // by Mcp-Session-Id, once initialized or restored
	byTenant map[string]map[*session]struct{} // for list_changed

	notify *notifier
}

// New returns a Server; mount Handler on the gateway's mux.
func New(cfg Config) (*Server, error) {
	if cfg.Auth == nil || cfg.Authorizer == nil || cfg.Nodes == nil || cfg.Invoker == nil {
		return nil, errors.New("mcpserver: Auth, Authorizer, Nodes and Invoker are required")
	}
	if cfg.PageSize <= 0 {
		cfg.PageSize = 100
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = 30 * time.Minute
	}
	if cfg.MaxRequestBytes <= 0 {
		cfg.MaxRequestBytes = 1 << 20
	}
	if cfg.MaxSessionsPerPrincipal <= 0 {
		cfg.MaxSessionsPerPrincipal = 100
	}
	if cfg.NotifyDelay <= 0 {
		cfg.NotifyDelay = 100 * time.Millisecond
	}
	if cfg.Version == "" {
		cfg.Version = "xiaoclaw"
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: cfg.Log.With("component", "mcp"), catalogs: newCatalogs(cfg.Nodes),
		sessions: map[string]*session{}, byTenant: map[string]map[*session]struct{}{}}
	s.notify = newNotifier(s)
	s.base = s.newSDKServer(nil)
	s.sdk = mcp.NewStreamableHTTPHandler(s.getServer, &mcp.StreamableHTTPOptions{
		SessionTimeout: cfg.SessionTimeout,
		Logger:         s.log,
		// Tool arguments are further capped by the invoke path.
		MaxRequestBodyBytes: cfg.MaxRequestBytes,
		// The gateway is reached by its clients under any host name; a
		// bearer token is required for every request instead.
		DisableLocalhostProtection: true,
		JSONResponse:               true,
	})
	return s, nil
}

// scope is the part of a tenant a session sees.
type scope struct {
	kind string // scopeTenant, scopeNode or scopeGroup
	id   string // node id or group name
}

const (
	scopeTenant = "tenant"
	scopeNode   = "node"
	scopeGroup  = "group"
)

func (sc scope) String() string {
	if sc.kind == scopeTenant {
		return sc.kind
	}
	return sc.kind + ":" + sc.id
}

// parseScope reads the scope from the request path.
func parseScope(path string) (scope, bool) {
	rest, ok := strings.CutPrefix(path, "/mcp")
	if !ok {
		return scope{}, false
	}
	if rest == "" || rest == "/" {
		return scope{kind: scopeTenant}, true
	}
	if id, ok := strings.CutPrefix(rest, "/nodes/"); ok && wire.ValidNodeID(id) == nil {
		return scope{kind: scopeNode, id: id}, true
	}
	if g, ok := strings.CutPrefix(rest, "/groups/"); ok && validGroup(g) {
		return scope{kind: scopeGroup, id: g}, true
	}
	return scope{}, false
}

// validGroup accepts the group names tenancy.ValidGroupName does.
func validGroup(g string) bool {
	if g == "" || len(g) > 64 {
		return false
	}
	for i := 0; i < len(g); i++ {
		c := g[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// reqKey holds a request's *reqInfo in its context.
type reqKey struct{}

// reqInfo is what ServeHTTP learned about a request before the SDK's
// handler runs it.
type reqInfo struct {
	principal access.Principal
	scope     scope
	sess      *session // created by getServer for a request that starts a session
}

// Handler serves /mcp, /mcp/nodes/{nodeId}, /mcp/groups/{group} and the
// protected resource metadata of /mcp.
func (s *Server) Handler() http.Handler { return http.HandlerFunc(s.ServeHTTP) }

// ProtectedResourcePath is where the OAuth protected resource metadata
// (RFC 9728) of /mcp is served; 401 answers point to it.
const ProtectedResourcePath = "/.well-known/oauth-protected-resource/mcp"

// ServeHTTP authenticates the request, checks that a session is used by
// the principal and on the path that started it, and hands it to the SDK.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/.well-known/oauth-protected-resource") {
		s.serveResourceMetadata(w, r)
		return
	}
	sc, ok := parseScope(r.URL.Path)
	if !ok {
		http.Error(w, "not found: use /mcp, /mcp/nodes/{nodeId} or /mcp/groups/{group}", http.StatusNotFound)
		return
	}
	p, ok := s.authenticate(w, r)
	if !ok {
		return
	}
	if id := r.Header.Get("Mcp-Session-Id"); id != "" {
		sess, err := s.lookup(r.Context(), id, p, sc)
		switch {
		case errors.Is(err, errNoSession):
			// Unknown, ended, or one this request cannot name: another
			// principal's session, or one begun on another path. 404 tells
			// the client to initialize a new one.
			http.Error(w, "session not found", http.StatusNotFound)
			return
		case err != nil:
			s.log.Warn("mcp: session lookup", "err", err)
			w.Header().Set("Retry-After", "1")
			http.Error(w, "MCP sessions unavailable; retry", http.StatusServiceUnavailable)
			return
		}
		sess.touch()
		if r.Method == http.MethodDelete {
			s.end(w, r, sess)
			return
		}
		if sess.restored {
			s.serveCopy(w, r, sess)
			return
		}
	} else if r.Method == http.MethodPost {
		switch sc.kind {
		case scopeNode:
			if s.cfg.Nodes.Get(p.Tenant, sc.id) == nil {
				http.Error(w, "unknown node", http.StatusNotFound)
				return
			}
		case scopeGroup:
			if _, found, err := s.groupMembers(r.Context(), p.Tenant, sc.id); err != nil {
				http.Error(w, "policy groups unavailable", http.StatusServiceUnavailable)
				return
			} else if !found {
				http.Error(w, "unknown group", http.StatusNotFound)
				return
			}
		}
		if n, err := s.sessionsOf(r.Context(), p); err != nil {
			s.log.Warn("mcp: count sessions", "err", err)
			w.Header().Set("Retry-After", "1")
			http.Error(w, "MCP sessions unavailable; retry", http.StatusServiceUnavailable)
			return
		} else if n >= s.cfg.MaxSessionsPerPrincipal {
			http.Error(w, "too many MCP sessions open for this token (limit "+strconv.Itoa(s.cfg.MaxSessionsPerPrincipal)+
				"): end unused ones with DELETE, or wait until they expire", http.StatusTooManyRequests)
			return
		}
	}
	ctx := context.WithValue(r.Context(), reqKey{}, &reqInfo{principal: p, scope: sc})
	s.sdk.ServeHTTP(w, r.WithContext(ctx))
}

// authenticate resolves the bearer token, or answers 401 (missing or bad
// token, with WWW-Authenticate as RFC 6750 and the MCP authorization spec
// describe) or 503 (the authenticator failed).
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request) (access.Principal, bool) {
	scheme, token, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	challenge := func() string {
		return `Bearer realm="xiaoclaw", resource_metadata="` + baseURL(r) + ProtectedResourcePath + `"`
	}
	if s.cfg.Throttle != nil {
		if wait := s.cfg.Throttle.RetryAfter(r); wait > 0 {
			w.Header().Set("Retry-After", strconv.Itoa(int((wait+time.Second-1)/time.Second)))
			http.Error(w, "too many failed authentications from this address; retry later", http.StatusTooManyRequests)
			return access.Principal{}, false
		}
	}
	if !strings.EqualFold(scheme, "Bearer") || token == "" {
		s.failed(r, true)
		w.Header().Set("WWW-Authenticate", challenge())
		http.Error(w, "missing bearer token: send Authorization: Bearer <operator token>", http.StatusUnauthorized)
		return access.Principal{}, false
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	p, err := s.cfg.Auth.AuthenticateOperator(ctx, token)
	switch {
	case errors.Is(err, access.ErrUnauthenticated):
		s.failed(r, false)
		w.Header().Set("WWW-Authenticate", challenge()+`, error="invalid_token", error_description="unknown, expired or revoked token"`)
		http.Error(w, "invalid token", http.StatusUnauthorized)
		return access.Principal{}, false
	case err != nil || wire.ValidTenant(p.Tenant) != nil:
		s.log.Warn("mcp: operator authentication failed", "err", err)
		w.Header().Set("Retry-After", "1")
		http.Error(w, "authentication unavailable; retry", http.StatusServiceUnavailable)
		return access.Principal{}, false
	}
	return p, true
}

func (s *Server) failed(r *http.Request, missing bool) {
	if s.cfg.Throttle != nil {
		s.cfg.Throttle.Failed(r, missing)
	}
}

// serveResourceMetadata serves RFC 9728 metadata naming /mcp as a
// resource that takes bearer tokens in the Authorization header. Tokens
// are xiaoclaw operator tokens (no authorization server issues them).
func (s *Server) serveResourceMetadata(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", "GET")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"resource":                 baseURL(r) + "/mcp",
		"bearer_methods_supported": []string{"header"},
		"resource_name":            "xiaoclaw devices",
		"resource_documentation":   "docs/mcp.md: an operator token of the tenant, as for the WebSocket gateway",
	})
}

func baseURL(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https") {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// getServer gives the SDK the server of a new session (a POST without
// Mcp-Session-Id), else the base server, which only answers the SDK's
// protocol version check.
func (s *Server) getServer(r *http.Request) *mcp.Server {
	ri, _ := r.Context().Value(reqKey{}).(*reqInfo)
	if ri == nil || r.Method != http.MethodPost || r.Header.Get("Mcp-Session-Id") != "" {
		return s.base
	}
	if ri.sess == nil {
		ri.sess = s.newSession(ri.principal, ri.scope)
	}
	return ri.sess.server
}

// newSDKServer builds an SDK server; sess is nil for the base server.
func (s *Server) newSDKServer(sess *session) *mcp.Server {
	opts := &mcp.ServerOptions{
		Instructions: "Tools of the devices of your xiaoclaw tenant. Each tool runs on one device; " +
			"its _meta names the node (xiaoclaw/nodeId) and the device's tool (xiaoclaw/tool).",
		Logger:                    s.log,
		Capabilities:              &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}},
		SupportedProtocolVersions: protocolVersions,
		PageSize:                  s.cfg.PageSize,
	}
	if sess != nil {
		opts.GetSessionID = func() string { return sess.id }
	}
	srv := mcp.NewServer(&mcp.Implementation{Name: "xiaoclaw", Title: "xiaoclaw devices", Version: s.cfg.Version}, opts)
	if sess != nil {
		srv.AddReceivingMiddleware(sess.middleware)
	}
	return srv
}

// newID returns 128 random bits in hex.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
