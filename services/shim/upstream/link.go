package upstream

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// Commands a published device declares upstream: the MCP bridge commands of
// api/mcp-mapping.md. Anything else the upstream sends is answered
// "command not supported", as OpenClaw's own node host does.
var Commands = []string{"mcp.initialize", "mcp.tools.call", "mcp.tools.call.v1", "mcp.tools.list"}

// Caps a published device declares upstream.
var Caps = []string{"mcp"}

// Platform is client.platform of a published device.
const Platform = "xiaozhi"

// Protocol constants of OpenClaw's gateway (see
// ../shared/docs/protocols/openclaw-gateway.md).
const (
	closeTickTimeout       = websocket.StatusCode(4000) // the client's own close for a dead link
	closeServiceRestart    = websocket.StatusServiceRestart
	tickTimeoutReason      = "tick timeout"
	defaultTickInterval    = 30 * time.Second
	defaultInvokeTimeout   = 30 * time.Second
	maxInvokeTimeout       = 300 * time.Second
	resultTimeout          = 10 * time.Second
	protocolCurrent        = 4
	protocolNodeMinimum    = 3
	detailPairingRequired  = "PAIRING_REQUIRED"
	detailProtocolMismatch = "PROTOCOL_MISMATCH"
	detailAuthRateLimited  = "AUTH_RATE_LIMITED"
	errNotPaired           = "NOT_PAIRED"
	eventInvokeRequest     = "node.invoke.request"
	eventShutdown          = "shutdown"
	methodInvokeResult     = "node.invoke.result"
	methodNodeEvent        = "node.event"
	faultUnavailable       = "UNAVAILABLE"
	faultInvalid           = "INVALID_REQUEST"
	commandNotSupported    = "command not supported"
)

// Timing of a link; zero values take the defaults.
type Timing struct {
	ConnectTimeout time.Duration // dial + handshake; default 10 s
	BackoffMin     time.Duration // first reconnect delay; default 1 s
	BackoffMax     time.Duration // delay cap; default 30 s
	// AuthRetry is the wait after the upstream refused the credentials
	// (StateDisabled); default 5 min.
	AuthRetry time.Duration
	// StableAfter is how long a connection must have been online for the
	// next drop to start again at BackoffMin; default 10 s.
	StableAfter time.Duration
}

func (t *Timing) setDefaults() {
	if t.ConnectTimeout <= 0 {
		t.ConnectTimeout = 10 * time.Second
	}
	if t.BackoffMin <= 0 {
		t.BackoffMin = time.Second
	}
	if t.BackoffMax <= 0 {
		t.BackoffMax = 30 * time.Second
	}
	if t.BackoffMax < t.BackoffMin {
		t.BackoffMax = t.BackoffMin
	}
	if t.AuthRetry <= 0 {
		t.AuthRetry = 5 * time.Minute
	}
	if t.StableAfter <= 0 {
		t.StableAfter = 10 * time.Second
	}
}

// Call is one invoke forwarded from the upstream.
type Call struct {
	Upstream       string // upstream name; the principal is "upstream:<name>"
	Tenant         string
	NodeID         string // xiaoclaw node id
	Command        string
	Params         json.RawMessage
	IdempotencyKey string
}

// Invoker runs a call through xiaoclaw's pipeline and returns the command's
// payload, or the fault to report upstream.
type Invoker interface {
	Invoke(ctx context.Context, c Call) (json.RawMessage, *wire.Fault)
}

// Node is what a link announces about its device.
type Node struct {
	NodeID       string // xiaoclaw node id
	DisplayName  string
	Version      string // firmware version
	DeviceFamily string // board or chip, e.g. "esp32-s3"
}

// linkConfig is everything one link needs.
type linkConfig struct {
	upstream Upstream
	node     Node
	identity ed25519.PrivateKey
	invoker  Invoker
	timing   Timing
	log      *slog.Logger
	onStatus func(Status)
	rand     func() float64
}

// link is one (device, upstream) connection, reconnected until its context
// ends.
type link struct {
	cfg      linkConfig
	deviceID string
	status   statusBox

	mu   sync.Mutex
	conn *occlient.Client // while online
}

func newLink(cfg linkConfig) *link {
	cfg.timing.setDefaults()
	pub := cfg.identity.Public().(ed25519.PublicKey)
	sum := sha256.Sum256(pub)
	l := &link{cfg: cfg, deviceID: hex.EncodeToString(sum[:])}
	l.status.st = Status{Upstream: cfg.upstream.Name, Tenant: cfg.upstream.Tenant, NodeID: cfg.node.NodeID,
		DeviceID: l.deviceID, State: StateConnecting, SinceMs: time.Now().UnixMilli()}
	l.status.onChange = cfg.onStatus
	return l
}

// Status returns the link's current state.
func (l *link) Status() Status { return l.status.get() }

// run connects and reconnects until ctx ends.
func (l *link) run(ctx context.Context) {
	bo := backoff{min: l.cfg.timing.BackoffMin, max: l.cfg.timing.BackoffMax, rand: l.cfg.rand}
	attempt := 0
	started := time.Now()
	for ctx.Err() == nil {
		l.status.set(StateConnecting, l.status.get().LastError, "")
		c, shutdown, err := l.dial(ctx)
		if ctx.Err() != nil {
			if c != nil {
				_ = c.Close()
			}
			return
		}
		var wait time.Duration
		if err != nil {
			wait = l.failed(err, bo, &attempt)
		} else {
			l.status.update(func(s *Status) { s.OnlineAfterMs = time.Since(started).Milliseconds() })
			l.status.set(StateOnline, "", "")
			onlineAt := time.Now()
			restart := l.serve(ctx, c, shutdown)
			if ctx.Err() != nil {
				return
			}
			if time.Since(onlineAt) >= l.cfg.timing.StableAfter {
				attempt = 0
			}
			reason := "connection closed"
			if e := c.Err(); e != nil {
				reason = e.Error()
			}
			switch {
			case restart && attempt == 0:
				wait = 0 // the gateway said it restarts: be back as soon as it is
				l.status.set(StateConnecting, reason, "")
			default:
				wait = bo.delay(attempt)
				attempt++
				l.status.set(StateBackoff, reason, "")
			}
			started = time.Now()
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// failed classifies a failed connect, sets the state and returns the wait
// before the next attempt.
func (l *link) failed(err error, bo backoff, attempt *int) time.Duration {
	var oe *occlient.Error
	if !errors.As(err, &oe) {
		d := bo.delay(*attempt)
		*attempt++
		l.status.set(StateBackoff, err.Error(), "")
		return d
	}
	code := oe.DetailCode()
	switch {
	case code == detailPairingRequired || oe.Code == errNotPaired:
		var d struct {
			RequestID string `json:"requestId"`
		}
		_ = json.Unmarshal(oe.Details, &d)
		delay := bo.delay(*attempt)
		*attempt++
		l.status.set(StatePairing, oe.Error(), d.RequestID)
		l.cfg.log.Info("upstream pairing required", "upstream", l.cfg.upstream.Name, "node", l.cfg.node.NodeID,
			"request", d.RequestID)
		return delay
	case code == detailAuthRateLimited:
		*attempt++
		l.status.set(StateBackoff, oe.Error(), "")
		return bo.max
	case strings.HasPrefix(code, "AUTH_"):
		l.status.set(StateDisabled, oe.Error(), "")
		l.cfg.log.Warn("upstream refused the credentials", "upstream", l.cfg.upstream.Name,
			"node", l.cfg.node.NodeID, "err", oe.Error())
		return l.cfg.timing.AuthRetry
	default:
		d := bo.delay(*attempt)
		*attempt++
		l.status.set(StateBackoff, oe.Error(), "")
		return d
	}
}

// clientRef hands the connection to event handlers that may run before
// Dial has returned it.
type clientRef struct {
	ready chan struct{}
	c     *occlient.Client
}

func (r *clientRef) get(ctx context.Context) *occlient.Client {
	select {
	case <-r.ready:
		return r.c
	case <-ctx.Done():
		return nil
	}
}

// dial connects as a node host, offering protocol 4 and falling back to 3
// (without deviceFamily, as OpenClaw's node host does) on a mismatch.
func (l *link) dial(ctx context.Context) (*occlient.Client, <-chan struct{}, error) {
	opts := occlient.Options{
		URL: l.cfg.upstream.URL, Token: l.cfg.upstream.Token,
		Role: "node", Scopes: []string{}, Identity: l.cfg.identity,
		ClientID: "node-host", Mode: "node", Version: l.cfg.node.Version, Platform: Platform,
		DisplayName: l.cfg.node.DisplayName, DeviceFamily: l.cfg.node.DeviceFamily,
		InstanceID: l.cfg.node.NodeID, Caps: Caps, Commands: Commands,
		MinProtocol: protocolCurrent, MaxProtocol: protocolCurrent, DiscardHello: true,
	}
	if opts.Version == "" {
		opts.Version = "unknown"
	}
	for {
		ref := &clientRef{ready: make(chan struct{})}
		shutdown := make(chan struct{}, 1)
		opts.OnEvent = func(ev occlient.Event) { l.onEvent(ref, shutdown, ev) }
		dctx, cancel := context.WithTimeout(ctx, l.cfg.timing.ConnectTimeout)
		c, err := occlient.Dial(dctx, opts)
		cancel()
		if err == nil {
			ref.c = c
			close(ref.ready)
			l.mu.Lock()
			l.conn = c
			l.mu.Unlock()
			return c, shutdown, nil
		}
		var oe *occlient.Error
		if errors.As(err, &oe) && oe.DetailCode() == detailProtocolMismatch && opts.MaxProtocol == protocolCurrent {
			opts.MinProtocol, opts.MaxProtocol, opts.DeviceFamily = protocolNodeMinimum, protocolNodeMinimum, ""
			continue
		}
		if dctx.Err() != nil && ctx.Err() == nil && oe == nil {
			return nil, nil, errors.New("connect timed out after " + l.cfg.timing.ConnectTimeout.String())
		}
		return nil, nil, err
	}
}

// serve keeps an online connection: it closes it with 4000 when no frame
// arrived for 2 × tickIntervalMs, and returns when it ends, reporting
// whether the gateway announced a restart (shutdown event or close 1012).
func (l *link) serve(ctx context.Context, c *occlient.Client, shutdown <-chan struct{}) (restart bool) {
	defer func() {
		l.mu.Lock()
		if l.conn == c {
			l.conn = nil
		}
		l.mu.Unlock()
	}()
	tick := c.TickInterval()
	if tick <= 0 {
		tick = defaultTickInterval
	}
	check := time.NewTicker(tick / 4)
	defer check.Stop()
	for {
		select {
		case <-ctx.Done():
			_ = c.Close()
			<-c.Done()
			return false
		case <-c.Done():
			return websocket.CloseStatus(c.Err()) == closeServiceRestart || len(shutdown) > 0
		case <-check.C:
			if time.Since(c.LastFrame()) > 2*tick {
				l.cfg.log.Info("upstream tick timeout", "upstream", l.cfg.upstream.Name, "node", l.cfg.node.NodeID)
				_ = c.CloseWith(closeTickTimeout, tickTimeoutReason)
				<-c.Done()
				return false
			}
		}
	}
}

// onEvent runs on the connection's read loop: it never blocks.
func (l *link) onEvent(ref *clientRef, shutdown chan struct{}, ev occlient.Event) {
	switch ev.Event {
	case eventInvokeRequest:
		go l.handleInvoke(ref, ev.Payload)
	case eventShutdown:
		select {
		case shutdown <- struct{}{}:
		default:
		}
	}
}

// invokeRequest is the payload of node.invoke.request; paramsJSON may be
// null.
type invokeRequest struct {
	ID             string  `json:"id"`
	NodeID         string  `json:"nodeId"`
	Command        string  `json:"command"`
	ParamsJSON     *string `json:"paramsJSON"`
	TimeoutMs      *int64  `json:"timeoutMs"`
	IdempotencyKey string  `json:"idempotencyKey"`
}

type resultError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

type invokeResult struct {
	ID          string       `json:"id"`
	NodeID      string       `json:"nodeId"`
	OK          bool         `json:"ok"`
	PayloadJSON string       `json:"payloadJSON,omitempty"`
	Error       *resultError `json:"error,omitempty"`
}

func (l *link) handleInvoke(ref *clientRef, raw json.RawMessage) {
	var req invokeRequest
	if err := json.Unmarshal(raw, &req); err != nil || req.ID == "" {
		l.cfg.log.Warn("malformed node.invoke.request from upstream", "upstream", l.cfg.upstream.Name)
		return // without an id there is nothing to answer
	}
	timeout := defaultInvokeTimeout
	if req.TimeoutMs != nil {
		timeout = min(max(time.Duration(*req.TimeoutMs)*time.Millisecond, time.Millisecond), maxInvokeTimeout)
	}
	res := invokeResult{ID: req.ID, NodeID: l.deviceID}
	var params json.RawMessage
	if req.ParamsJSON != nil && *req.ParamsJSON != "" {
		params = json.RawMessage(*req.ParamsJSON)
	}
	switch {
	case !declared(req.Command):
		res.Error = &resultError{Code: faultUnavailable, Message: commandNotSupported}
	case params != nil && !json.Valid(params):
		res.Error = &resultError{Code: faultInvalid, Message: "paramsJSON is not valid JSON"}
	default:
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		payload, fault := l.cfg.invoker.Invoke(ctx, Call{Upstream: l.cfg.upstream.Name, Tenant: l.cfg.upstream.Tenant,
			NodeID: l.cfg.node.NodeID, Command: req.Command, Params: params, IdempotencyKey: req.IdempotencyKey})
		cancel()
		if fault != nil {
			res.Error = &resultError{Code: fault.Code, Message: fault.Message}
		} else {
			res.OK = true
			if len(payload) == 0 {
				payload = json.RawMessage("null")
			}
			res.PayloadJSON = string(payload)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), resultTimeout)
	defer cancel()
	c := ref.get(ctx)
	if c == nil {
		return
	}
	if _, err := c.Call(ctx, methodInvokeResult, res); err != nil {
		l.cfg.log.Info("node.invoke.result not delivered", "upstream", l.cfg.upstream.Name, "node", l.cfg.node.NodeID, "err", err)
	}
}

func declared(command string) bool {
	for _, c := range Commands {
		if c == command {
			return true
		}
	}
	return false
}

// sendEvent forwards a device event upstream as node.event when the link is
// online; events while it is not are dropped (they describe a moment).
func (l *link) sendEvent(event string, payload json.RawMessage) {
	l.mu.Lock()
	c := l.conn
	l.mu.Unlock()
	if c == nil {
		return
	}
	p := map[string]any{"event": event}
	if len(payload) > 0 {
		p["payloadJSON"] = string(payload)
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), resultTimeout)
		defer cancel()
		if _, err := c.Call(ctx, methodNodeEvent, p); err != nil {
			l.cfg.log.Debug("node.event not delivered", "upstream", l.cfg.upstream.Name, "node", l.cfg.node.NodeID, "err", err)
		}
	}()
}
