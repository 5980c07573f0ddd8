package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"sort"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// serverEnv lists the variables a stdio server inherits from the agent,
// besides the ones its "env" sets (the set MCP desktop clients pass).
var serverEnv = []string{"PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "TMPDIR", "TZ"}

// Restart backoff of a stdio server that exits or fails to start.
const (
	serverMinBackoff = 500 * time.Millisecond
	serverMaxBackoff = 30 * time.Second
	serverStableRun  = 10 * time.Second // a run this long resets the backoff
)

// stdioServer supervises one stdio MCP server: it starts it, lists its
// tools, relays calls and restarts it with exponential backoff when it
// exits. Calls made while it is down wait for it within their timeout.
type stdioServer struct {
	name    string
	cfg     ServerConfig
	timeout time.Duration
	env     func(string) string
	log     *slog.Logger
	version string
	// onTools receives the server's tool list each time it is learned.
	onTools func(server string, tools []*mcp.Tool)

	mu      sync.Mutex
	session *mcp.ClientSession
	up      chan struct{} // closed while session is set
	gone    chan struct{} // closed once session is let go of
	cancel  context.CancelFunc
	done    chan struct{}
}

func newStdioServer(name string, cfg ServerConfig, env func(string) string, log *slog.Logger, version string, onTools func(string, []*mcp.Tool)) *stdioServer {
	timeout, _ := checkTimeout(cfg.TimeoutMs, DefaultServerTimeout)
	return &stdioServer{
		name: name, cfg: cfg, timeout: timeout, env: env, log: log.With("server", name), version: version,
		onTools: onTools, up: make(chan struct{}), done: make(chan struct{}),
	}
}

// start runs the supervisor until stop.
func (s *stdioServer) start() {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() {
		defer close(s.done)
		s.supervise(ctx)
	}()
}

// stop ends the server and its supervisor and waits for both.
func (s *stdioServer) stop() {
	s.cancel()
	<-s.done
}

func (s *stdioServer) command() *exec.Cmd {
	cmd := exec.Command(s.cfg.Command, s.cfg.Args...)
	for _, k := range serverEnv {
		if v := s.env(k); v != "" {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
	}
	keys := make([]string, 0, len(s.cfg.Env))
	for k := range s.cfg.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		cmd.Env = append(cmd.Env, k+"="+s.cfg.Env[k])
	}
	return cmd
}

func (s *stdioServer) supervise(ctx context.Context) {
	backoff := serverMinBackoff
	for ctx.Err() == nil {
		started := time.Now()
		err := s.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) >= serverStableRun {
			backoff = serverMinBackoff
		}
		s.log.Warn("agent: stdio server ended; restarting", "err", err, "in", backoff)
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return
		}
		backoff = min(backoff*2, serverMaxBackoff)
	}
}

// runOnce starts the server, lists its tools, serves calls until it exits.
func (s *stdioServer) runOnce(ctx context.Context) error {
	relist := make(chan struct{}, 1)
	client := mcp.NewClient(&mcp.Implementation{Name: "xiaoclaw-agent", Version: s.version}, &mcp.ClientOptions{
		ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {
			select {
			case relist <- struct{}{}:
			default:
			}
		},
	})
	cs, err := client.Connect(ctx, &mcp.CommandTransport{Command: s.command(), TerminateDuration: 2 * time.Second}, nil)
	if err != nil {
		return fmt.Errorf("start %s: %w", s.cfg.Command, err)
	}
	defer cs.Close()
	if err := s.list(ctx, cs); err != nil {
		return err
	}
	gone := make(chan struct{})
	s.mu.Lock()
	s.session, s.gone = cs, gone
	close(s.up)
	s.mu.Unlock()
	s.log.Info("agent: stdio server up")
	defer func() {
		s.mu.Lock()
		s.session = nil
		s.up = make(chan struct{})
		s.mu.Unlock()
		close(gone)
	}()
	waited := make(chan error, 1)
	go func() { waited <- cs.Wait() }()
	for {
		select {
		case err := <-waited:
			if err == nil {
				err = errors.New("the server closed its stdout")
			}
			return err
		case <-relist:
			if err := s.list(ctx, cs); err != nil {
				s.log.Warn("agent: re-listing tools failed", "err", err)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (s *stdioServer) list(ctx context.Context, cs *mcp.ClientSession) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	var tools []*mcp.Tool
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return fmt.Errorf("tools/list: %w", err)
		}
		tools = append(tools, t)
	}
	s.onTools(s.name, tools)
	return nil
}

// call relays one call, waiting for the server within the call's timeout.
func (s *stdioServer) call(ctx context.Context, tool string, args json.RawMessage) (*mcp.CallToolResult, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	for {
		s.mu.Lock()
		cs, up, gone := s.session, s.up, s.gone
		s.mu.Unlock()
		if cs != nil {
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
			if err != nil && ctx.Err() != nil {
				return nil, &TimeoutError{Tool: s.name + namespaceSeparator + tool, After: s.timeout}
			}
			var rpcErr *jsonrpc.Error
			if err != nil && !errors.As(err, &rpcErr) {
				// The transport failed under this call, which may have
				// reached the server: never resent. When the server died,
				// answer once the supervisor has let go of its session, so
				// that the calls after this one wait for the restart instead
				// of meeting the dead session too.
				select {
				case <-gone:
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
			return res, err
		}
		select {
		case <-up:
		case <-ctx.Done():
			return nil, fmt.Errorf("server %s is not running (waited %s)", s.name, s.timeout)
		}
	}
}
