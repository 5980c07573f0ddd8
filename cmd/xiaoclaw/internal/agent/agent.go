// Package agent is `xiaoclaw agent`: a tool host for a Linux box. It
// connects to a devicehub as a XiaoZhi device (WebSocket with a device
// token, or OTA first, exactly as the firmware does) and serves as MCP
// tools the tools of its configuration file: programs run without a shell
// (JSON arguments on stdin), HTTP endpoints, TCP services, and the tools of
// any number of stdio MCP servers, which it starts, relays under the
// server's name and restarts when they die. Calls are checked against the
// tool's JSON Schema before anything runs. A background tool answers at
// once and reports its completion as an MCP notification, which operators
// receive as a node event. The configuration reloads on SIGHUP or when the
// file changes, and the hub learns of the new catalog through
// notifications/tools/list_changed.
package agent

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
)

// Defaults of Options.
const (
	DefaultMinBackoff   = time.Second
	DefaultMaxBackoff   = 2 * time.Minute
	DefaultPingInterval = 30 * time.Second
	DefaultReloadPoll   = 2 * time.Second
	maxPendingNotices   = 256
	// MaxBackground bounds the background runs in progress; a call beyond
	// it is refused rather than starting one more process.
	MaxBackground = 32
)

// Options configure an Agent.
type Options struct {
	// ConfigPath is the configuration file (see File).
	ConfigPath string
	// URL and Token: the hub's XiaoZhi WebSocket endpoint and the device
	// token. OTAURL instead boots like the firmware: the OTA reply names
	// the endpoint (WebSocket or MQTT) and its credentials.
	URL, Token, OTAURL string
	// DeviceID is the MAC-style id the agent connects as; empty derives a
	// stable, locally administered one from the host name and ConfigPath.
	DeviceID string
	// Name and Version make up the MCP serverInfo.
	Name, Version string
	// MinBackoff and MaxBackoff bound the wait between connection attempts.
	MinBackoff, MaxBackoff time.Duration
	// PingInterval: WebSocket pings keep an otherwise silent session
	// within the hub's idle limit.
	PingInterval time.Duration
	// ReloadPoll is how often the configuration file is checked for
	// changes; negative disables the check (SIGHUP still reloads).
	ReloadPoll time.Duration
	Log        *slog.Logger
	// Env reads the agent's environment (os.Getenv when nil).
	Env func(string) string
}

// Agent is one running tool host.
type Agent struct {
	opts   Options
	server *mcp.Server

	mu        sync.Mutex
	cfgRaw    []byte
	local     map[string]*LocalTool // config tools by name
	localKey  map[string]string     // their config, to skip unchanged ones
	servers   map[string]*stdioServer
	serverKey map[string]string
	relayed   map[string]map[string]string // server -> registered tool name -> definition

	devMu   sync.Mutex
	dev     *xzsim.Device // the connected session, nil while down
	pending [][]byte      // notifications waiting for a session

	calls   atomic.Int64
	bgRuns  atomic.Int64
	bg      sync.WaitGroup
	bgCtx   context.Context
	stopBg  context.CancelFunc
	online  chan struct{} // closed at the first established session
	onOnce  sync.Once
	reloads atomic.Int64
}

// New loads the configuration and prepares an agent; nothing runs yet.
func New(opts Options) (*Agent, error) {
	if opts.Env == nil {
		opts.Env = os.Getenv
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.MinBackoff <= 0 {
		opts.MinBackoff = DefaultMinBackoff
	}
	if opts.MaxBackoff < opts.MinBackoff {
		opts.MaxBackoff = max(DefaultMaxBackoff, opts.MinBackoff)
	}
	if opts.PingInterval <= 0 {
		opts.PingInterval = DefaultPingInterval
	}
	if opts.ReloadPoll == 0 {
		opts.ReloadPoll = DefaultReloadPoll
	}
	if opts.Name == "" {
		opts.Name = "xiaoclaw-agent"
	}
	if opts.Version == "" {
		opts.Version = "dev"
	}
	if opts.URL == "" && opts.OTAURL == "" {
		return nil, errors.New("agent: the hub's --url or --ota-url is required")
	}
	if opts.DeviceID == "" {
		opts.DeviceID = DeriveDeviceID(opts.Env("HOSTNAME"), opts.ConfigPath)
	}
	if hw, err := net.ParseMAC(opts.DeviceID); err != nil || len(hw) != 6 {
		return nil, fmt.Errorf("agent: device id %q is not of the form aa:bb:cc:dd:ee:ff", opts.DeviceID)
	}
	a := &Agent{
		opts:     opts,
		local:    map[string]*LocalTool{},
		localKey: map[string]string{}, servers: map[string]*stdioServer{}, serverKey: map[string]string{},
		relayed: map[string]map[string]string{},
		online:  make(chan struct{}),
	}
	a.bgCtx, a.stopBg = context.WithCancel(context.Background())
	a.server = mcp.NewServer(&mcp.Implementation{Name: opts.Name, Version: opts.Version}, &mcp.ServerOptions{
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{ListChanged: true}},
	})
	cfg, raw, err := a.load()
	if err != nil {
		return nil, err
	}
	a.apply(cfg, raw)
	return a, nil
}

// DeriveDeviceID returns a stable, locally administered unicast MAC for a
// host and configuration path.
func DeriveDeviceID(host, configPath string) string {
	if host == "" {
		host, _ = os.Hostname()
	}
	sum := sha256.Sum256([]byte("xiaoclaw-agent\x00" + host + "\x00" + configPath))
	sum[0] = sum[0]&0xfc | 0x02
	return net.HardwareAddr(sum[:6]).String()
}

// DeviceID returns the id the agent connects as.
func (a *Agent) DeviceID() string { return a.opts.DeviceID }

// Online is closed once the agent has established its first session.
func (a *Agent) Online() <-chan struct{} { return a.online }

// Reloads returns how many configuration changes were applied.
func (a *Agent) Reloads() int64 { return a.reloads.Load() }

func (a *Agent) load() (*Config, []byte, error) {
	raw, err := os.ReadFile(a.opts.ConfigPath)
	if err != nil {
		return nil, nil, fmt.Errorf("agent: %w", err)
	}
	cfg, err := ParseConfig(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("agent: %s: %w", a.opts.ConfigPath, err)
	}
	return cfg, raw, nil
}

// Run connects to the hub and serves until ctx ends, reconnecting with
// backoff and reloading the configuration on SIGHUP or file change.
func (a *Agent) Run(ctx context.Context) error {
	defer a.shutdown()
	go a.watch(ctx)
	backoff := a.opts.MinBackoff
	for ctx.Err() == nil {
		started := time.Now()
		err := a.session(ctx)
		if ctx.Err() != nil {
			break
		}
		if time.Since(started) > 30*time.Second {
			backoff = a.opts.MinBackoff
		}
		wait := backoff/2 + rand.N(backoff/2+1) // jitter: a fleet of agents does not reconnect in step
		a.opts.Log.Warn("agent: hub session ended; reconnecting", "err", err, "in", wait)
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
		backoff = min(backoff*2, a.opts.MaxBackoff)
	}
	return nil
}

// session runs one hub session from connect to its end.
func (a *Agent) session(ctx context.Context) error {
	tr := newDeviceTransport(a.opts.Log)
	dev, err := xzsim.NewDevice(xzsim.Config{
		URL: a.opts.URL, Token: a.opts.Token, OTAURL: a.opts.OTAURL, MAC: a.opts.DeviceID,
		BoardName: a.opts.Name, FirmwareVersion: a.opts.Version, MCP: tr.deliver, Log: a.opts.Log,
	})
	if err != nil {
		return err
	}
	tr.dev = dev
	if err := dev.Connect(ctx); err != nil {
		return err
	}
	ss, err := a.server.Connect(ctx, tr, nil)
	if err != nil {
		_ = dev.Close()
		return err
	}
	a.devMu.Lock()
	a.dev = dev
	pending := a.pending
	a.pending = nil
	a.devMu.Unlock()
	a.onOnce.Do(func() { close(a.online) })
	a.opts.Log.Info("agent: connected to the hub", "device", a.opts.DeviceID, "session_id", dev.SessionID())
	for _, p := range pending {
		a.send(p)
	}
	defer func() {
		a.devMu.Lock()
		if a.dev == dev {
			a.dev = nil
		}
		a.devMu.Unlock()
		_ = ss.Close()
	}()
	tick := time.NewTicker(a.opts.PingInterval)
	defer tick.Stop()
	for {
		select {
		case <-dev.Done():
			return dev.Err()
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
			pctx, cancel := context.WithTimeout(ctx, a.opts.PingInterval)
			err := dev.Ping(pctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				_ = dev.Close()
				return fmt.Errorf("ping: %w", err)
			}
		}
	}
}

func (a *Agent) shutdown() {
	a.mu.Lock()
	servers := maps.Clone(a.servers)
	a.mu.Unlock()
	for _, s := range servers {
		s.stop()
	}
	a.stopBg()
	a.bg.Wait()
}

// watch reloads the configuration on SIGHUP and when the file changes.
func (a *Agent) watch(ctx context.Context) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var poll <-chan time.Time
	if a.opts.ReloadPoll > 0 {
		t := time.NewTicker(a.opts.ReloadPoll)
		defer t.Stop()
		poll = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			a.Reload()
		case <-poll:
			raw, err := os.ReadFile(a.opts.ConfigPath)
			a.mu.Lock()
			same := err == nil && string(raw) == string(a.cfgRaw)
			a.mu.Unlock()
			if err == nil && !same {
				a.Reload()
			}
		}
	}
}

// Reload re-reads the configuration and applies it; an invalid file is
// reported and the running configuration stays.
func (a *Agent) Reload() error {
	cfg, raw, err := a.load()
	if err != nil {
		a.opts.Log.Error("agent: configuration not reloaded", "err", err)
		a.mu.Lock()
		a.cfgRaw = raw // report a broken file once, not at every poll
		a.mu.Unlock()
		return err
	}
	a.apply(cfg, raw)
	a.reloads.Add(1)
	a.opts.Log.Info("agent: configuration reloaded")
	return nil
}

// apply brings tools and servers in line with cfg. The MCP server sends
// notifications/tools/list_changed to the hub when the catalog changed.
func (a *Agent) apply(cfg *Config, raw []byte) {
	a.mu.Lock()
	a.cfgRaw = raw
	want := map[string]*LocalTool{}
	for _, t := range cfg.Tools {
		want[t.Name] = t
	}
	var remove []string
	for name := range a.local {
		if want[name] == nil {
			remove = append(remove, name)
			delete(a.local, name)
			delete(a.localKey, name)
		}
	}
	for name, t := range want {
		key, _ := json.Marshal(t.ToolConfig)
		if a.localKey[name] == string(key) {
			continue
		}
		a.local[name], a.localKey[name] = t, string(key)
		a.server.AddTool(&mcp.Tool{Name: t.Name, Description: t.Description, InputSchema: t.schema}, a.localHandler(t))
	}
	wantServers := map[string]*ServerConfig{}
	for i, s := range cfg.Servers {
		wantServers[cfg.ServerName(i)] = s
	}
	var stop []*stdioServer
	for name, s := range a.servers {
		key, _ := json.Marshal(wantServers[name])
		if wantServers[name] == nil || a.serverKey[name] != string(key) {
			stop = append(stop, s)
			delete(a.servers, name)
			delete(a.serverKey, name)
			for tool := range a.relayed[name] {
				remove = append(remove, tool)
			}
			delete(a.relayed, name)
		}
	}
	if len(remove) > 0 {
		a.server.RemoveTools(remove...)
	}
	var start []*stdioServer
	for name, sc := range wantServers {
		if a.servers[name] != nil {
			continue
		}
		key, _ := json.Marshal(sc)
		s := newStdioServer(name, *sc, a.opts.Env, a.opts.Log, a.opts.Version, a.relayTools)
		a.servers[name], a.serverKey[name] = s, string(key)
		start = append(start, s)
		a.registerRelayedLocked(name, declaredTools(sc.Tools))
	}
	a.mu.Unlock()
	for _, s := range stop {
		s.stop()
	}
	for _, s := range start {
		s.start()
	}
}

func declaredTools(ds []DeclaredTool) []*mcp.Tool {
	var out []*mcp.Tool
	for _, d := range ds {
		raw := d.InputSchema
		if len(raw) == 0 {
			raw = d.InputSchemaAlt
		}
		schema, _, err := compileSchema(raw)
		if err != nil {
			continue // checked by ParseConfig
		}
		out = append(out, &mcp.Tool{Name: d.Name, Description: d.Description, InputSchema: schema})
	}
	return out
}

// relayTools is called by a stdio server with its current tool list.
func (a *Agent) relayTools(server string, tools []*mcp.Tool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.servers[server] == nil {
		return // stopped meanwhile
	}
	a.registerRelayedLocked(server, tools)
}

// registerRelayedLocked makes server's tools, named "<server>.<tool>", the
// catalog entries of that server: new and changed ones are added, missing
// ones removed, tools disabled in the configuration left out.
func (a *Agent) registerRelayedLocked(server string, tools []*mcp.Tool) {
	s := a.servers[server]
	disabled := map[string]bool{}
	for _, d := range s.cfg.Tools {
		if d.Enable != nil && !*d.Enable {
			disabled[d.Name] = true
		}
	}
	have := a.relayed[server]
	next := map[string]string{}
	for _, t := range tools {
		if disabled[t.Name] || checkToolName(t.Name) != nil {
			continue
		}
		full := server + namespaceSeparator + t.Name
		if len(full) > maxToolNameLen || a.local[full] != nil {
			a.opts.Log.Warn("agent: relayed tool left out (name too long or taken)", "tool", full)
			continue
		}
		schema, validator, err := relaySchema(t.InputSchema)
		if err != nil {
			a.opts.Log.Warn("agent: relayed tool left out", "tool", full, "err", err)
			continue
		}
		def, _ := json.Marshal(map[string]any{"d": t.Description, "s": json.RawMessage(schema), "a": t.Annotations})
		next[full] = string(def)
		if have[full] == string(def) {
			continue
		}
		tool := &mcp.Tool{Name: full, Description: t.Description, InputSchema: schema, Annotations: t.Annotations}
		a.server.AddTool(tool, a.relayHandler(s, t.Name, full, validator))
	}
	var gone []string
	for name := range have {
		if _, ok := next[name]; !ok {
			gone = append(gone, name)
		}
	}
	if len(gone) > 0 {
		a.server.RemoveTools(gone...)
	}
	a.relayed[server] = next
}

// relaySchema compiles a relayed tool's schema; one that does not compile
// is relayed without validation here (the server still checks its input).
func relaySchema(s any) (json.RawMessage, *jsonschema.Schema, error) {
	raw, err := json.Marshal(s)
	if err != nil {
		return nil, nil, err
	}
	schema, v, err := compileSchema(raw)
	if err != nil {
		var m map[string]any
		if json.Unmarshal(raw, &m) != nil || m["type"] != "object" {
			return nil, nil, err
		}
		return raw, nil, nil
	}
	return schema, v, nil
}

func invalidParams(err error) error {
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: err.Error()}
}

func (a *Agent) localHandler(t *LocalTool) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		args, err := validateArgs(t.validator, req.Params.Arguments)
		if err != nil {
			return nil, invalidParams(err)
		}
		if t.background {
			if a.bgRuns.Add(1) > MaxBackground {
				a.bgRuns.Add(-1)
				return nil, fmt.Errorf("tool %s: %d background runs are in progress; try again later", t.Name, MaxBackground)
			}
			id := "call-" + strconv.FormatInt(a.calls.Add(1), 10)
			a.bg.Add(1)
			go func() {
				defer a.bg.Done()
				defer a.bgRuns.Add(-1)
				out, err := runLocal(a.bgCtx, t, args, a.opts.Env)
				if t.notify {
					a.notifyCompletion(t.Name, id, out, err)
				}
			}()
			started, _ := json.Marshal(map[string]string{"status": "started", "callId": id})
			return textResult(string(started), false), nil
		}
		a.calls.Add(1)
		out, err := runLocal(ctx, t, args, a.opts.Env)
		return callOutcome(out, err)
	}
}

func (a *Agent) relayHandler(s *stdioServer, tool, full string, v *jsonschema.Schema) mcp.ToolHandler {
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		args := req.Params.Arguments
		if v != nil {
			var err error
			if args, err = validateArgs(v, args); err != nil {
				return nil, invalidParams(err)
			}
		}
		a.calls.Add(1)
		res, err := s.call(ctx, tool, args)
		if err != nil {
			var je *jsonrpc.Error
			if errors.As(err, &je) {
				return nil, je
			}
			return nil, fmt.Errorf("%s: %w", full, err)
		}
		return res, nil
	}
}

// callOutcome maps a local run to the MCP answer: a failed tool is a
// result with isError, a timeout or an agent-side failure an error.
func callOutcome(out string, err error) (*mcp.CallToolResult, error) {
	var f *toolFailure
	switch {
	case err == nil:
		return textResult(out, false), nil
	case errors.As(err, &f):
		return textResult(f.msg, true), nil
	default:
		return nil, err
	}
}

func textResult(text string, isError bool) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}, IsError: isError}
}

// Completion is the params of the notification a background tool sends
// when it ends.
type Completion struct {
	Tool    string        `json:"tool"`
	CallID  string        `json:"callId"`
	IsError bool          `json:"isError"`
	Content []mcp.Content `json:"content"`
}

func (a *Agent) notifyCompletion(tool, id, out string, err error) {
	c := Completion{Tool: tool, CallID: id}
	if err != nil {
		var f *toolFailure
		msg := err.Error()
		if errors.As(err, &f) {
			msg = f.msg
		}
		c.IsError, c.Content = true, []mcp.Content{&mcp.TextContent{Text: msg}}
	} else {
		c.Content = []mcp.Content{&mcp.TextContent{Text: out}}
	}
	params, _ := json.Marshal(c)
	msg, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": completedNotification, "params": json.RawMessage(params)})
	a.send(msg)
}

// send writes a notification to the hub, or keeps it (bounded) for the
// next session while disconnected.
func (a *Agent) send(msg []byte) {
	a.devMu.Lock()
	dev := a.dev
	if dev == nil {
		if len(a.pending) < maxPendingNotices {
			a.pending = append(a.pending, msg)
		}
		a.devMu.Unlock()
		return
	}
	a.devMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := dev.SendMCP(ctx, msg); err != nil {
		a.devMu.Lock()
		if len(a.pending) < maxPendingNotices {
			a.pending = append(a.pending, msg)
		}
		a.devMu.Unlock()
	}
}

// ToolNames returns the catalog's tool names (for diagnostics and tests).
func (a *Agent) ToolNames() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var names []string
	for n := range a.local {
		names = append(names, n)
	}
	for _, m := range a.relayed {
		for n := range m {
			names = append(names, n)
		}
	}
	return names
}
