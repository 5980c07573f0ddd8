// Package mcpstdio serves a gateway's MCP endpoint over stdio, for MCP
// clients that only start servers as subprocesses (Claude Desktop and
// others): it speaks MCP on stdin/stdout with the official Go SDK and
// forwards tools/list and tools/call to the gateway's /mcp over Streamable
// HTTP with the operator's bearer token, and the gateway's
// notifications/tools/list_changed back. The gateway does everything else
// (names, scope, policy, audit), so stdio and HTTP clients see the same
// server.
package mcpstdio

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Config says where the gateway is and who calls it.
type Config struct {
	// Endpoint is the gateway's MCP URL: http(s)://host:port/mcp (or a
	// scoped /mcp/nodes/{id}, /mcp/groups/{g}).
	Endpoint string
	Token    string // operator token
	Version  string // this program's version, in serverInfo and the gateway's audit
}

// EndpointURL turns a gateway URL as the other commands take it (ws://,
// wss://, http://, https://, with or without a path) into the MCP
// endpoint for path ("/mcp", "/mcp/nodes/<id>", ...).
func EndpointURL(gateway, path string) (string, error) {
	u := strings.TrimRight(gateway, "/")
	switch {
	case strings.HasPrefix(u, "ws://"):
		u = "http://" + strings.TrimPrefix(u, "ws://")
	case strings.HasPrefix(u, "wss://"):
		u = "https://" + strings.TrimPrefix(u, "wss://")
	case strings.HasPrefix(u, "http://"), strings.HasPrefix(u, "https://"):
	default:
		return "", fmt.Errorf("gateway URL %q: want ws://, wss://, http:// or https://", gateway)
	}
	if i := strings.Index(u[strings.Index(u, "://")+3:], "/"); i >= 0 {
		u = u[:strings.Index(u, "://")+3+i] // drop any path: the scope decides it
	}
	return u + path, nil
}

type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// proxy holds the upstream session, opened when the stdio client
// initializes (so the gateway's audit names that client).
type proxy struct {
	cfg    Config
	server *mcp.Server

	mu       sync.Mutex
	upstream *mcp.ClientSession
}

// Serve runs the stdio server until the client closes stdin or ctx ends.
func Serve(ctx context.Context, cfg Config, in io.ReadCloser, out io.WriteCloser) error {
	if cfg.Token == "" {
		return errors.New("no operator token")
	}
	p := &proxy{cfg: cfg}
	p.server = mcp.NewServer(&mcp.Implementation{Name: "xiaoclaw", Title: "xiaoclaw devices", Version: cfg.Version},
		&mcp.ServerOptions{Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}},
			// The gateway's versions: a client that would go sessionless
			// (2026-07-28) initializes instead, and list_changed reaches it.
			SupportedProtocolVersions: []string{"2025-11-25", "2025-06-18"}})
	p.server.AddReceivingMiddleware(p.middleware)
	defer p.close()
	err := p.server.Run(ctx, &mcp.IOTransport{Reader: in, Writer: out})
	if errors.Is(err, io.EOF) || ctx.Err() != nil {
		return nil
	}
	return err
}

func (p *proxy) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.upstream != nil {
		_ = p.upstream.Close()
	}
}

// connect opens the session to the gateway on behalf of the stdio client.
func (p *proxy) connect(ctx context.Context, client *mcp.Implementation) error {
	name, version := "xiaoclaw-mcp", p.cfg.Version
	if client != nil && client.Name != "" {
		name, version = client.Name+" via xiaoclaw-mcp", client.Version
	}
	c := mcp.NewClient(&mcp.Implementation{Name: name, Version: version}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) { p.listChanged() },
	})
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cs, err := c.Connect(cctx, &mcp.StreamableClientTransport{Endpoint: p.cfg.Endpoint,
		HTTPClient: &http.Client{Transport: bearer{p.cfg.Token}}}, nil)
	if err != nil {
		return fmt.Errorf("connect to the gateway's MCP endpoint %s: %w", p.cfg.Endpoint, err)
	}
	p.mu.Lock()
	old := p.upstream
	p.upstream = cs
	p.mu.Unlock()
	if old != nil {
		_ = old.Close()
	}
	return nil
}

// session returns the upstream session, opening one for a client that
// skipped initialize.
func (p *proxy) session(ctx context.Context) (*mcp.ClientSession, error) {
	p.mu.Lock()
	cs := p.upstream
	p.mu.Unlock()
	if cs != nil {
		return cs, nil
	}
	if err := p.connect(ctx, nil); err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.upstream, nil
}

// listChangedTool is never listed or called (the middleware answers
// tools/list and tools/call); adding it makes the SDK send
// notifications/tools/list_changed to the stdio client.
var listChangedTool = &mcp.Tool{Name: "xiaoclaw-list-changed", InputSchema: json.RawMessage(`{"type":"object"}`)}

func (p *proxy) listChanged() {
	p.server.AddTool(listChangedTool, func(context.Context, *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return nil, errors.New("not a tool")
	})
}

func (p *proxy) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		switch method {
		case "initialize":
			var client *mcp.Implementation
			if r, ok := req.(*mcp.InitializeRequest); ok && r.Params != nil {
				client = r.Params.ClientInfo
			}
			if err := p.connect(ctx, client); err != nil {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: err.Error()}
			}
		case "tools/list":
			cs, err := p.session(ctx)
			if err != nil {
				return nil, err
			}
			params := &mcp.ListToolsParams{}
			if r, ok := req.(*mcp.ListToolsRequest); ok && r.Params != nil {
				params.Cursor = r.Params.Cursor
			}
			return cs.ListTools(ctx, params)
		case "tools/call":
			cs, err := p.session(ctx)
			if err != nil {
				return nil, err
			}
			r, ok := req.(*mcp.CallToolRequest)
			if !ok || r.Params == nil {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "tools/call needs params"}
			}
			params := &mcp.CallToolParams{Meta: r.Params.Meta, Name: r.Params.Name}
			if len(r.Params.Arguments) > 0 {
				params.Arguments = r.Params.Arguments
			}
			return cs.CallTool(ctx, params)
		}
		return next(ctx, method, req)
	}
}
