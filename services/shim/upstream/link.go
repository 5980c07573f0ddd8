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
	"sync/atomic"
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
	eventInvokeCancel      = "node.invoke.cancel"
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
	// ToolsDebounce is how long a catalog change waits before it is
	// published upstream (node.pluginTools.update); default 500 ms.
	ToolsDebounce time.Duration
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
	if t.ToolsDebounce <= 0 {
		t.ToolsDebounce = 500 * time.Millisecond
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
	// handshakes, when set, bounds the handshakes in flight to the
	// upstream; the links of one upstream share it (see handshakeSlots).
	handshakes chan struct{}
}

// handshakeSlots bounds the handshakes a worker has in flight to one
// upstream. OpenClaw admits 32 unauthenticated sockets per client IP and
// answers more with 503 "Too many unauthenticated sockets"; all links of
// a worker come from one IP, so after a gateway restart or a burst of
// devices, unbounded links would mostly be turned away and back off.
const handshakeSlots = 16

// newHandshakeSlots returns a bound for the links of one upstream.
func newHandshakeSlots() chan struct{} { return make(chan struct{}, handshakeSlots) }

// link is one (device, upstream) connection, reconnected until its context
// ends.
type link struct {
	cfg      linkConfig
	deviceID string
	status   statusBox

	mu   sync.Mutex
	conn *occlient.Client // while online

	inflight atomic.Int32 // invokes from the upstream not answered yet

	callsMu sync.Mutex
	calls   map[string]context.CancelFunc // invoke id -> its cancel, while running

	catMu sync.Mutex // guards cat; never held with mu
	cat   catalogState
}

// maxInflightPerLink bounds the calls one upstream runs at once on one
// device; more are refused at once rather than queued (a device serves
// one MCP request at a time anyway).
const maxInflightPerLink = 16

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

// run connects and reconnects until ctx ends (start, waiting for the end).
func (l *link) run(ctx context.Context) {
	done := make(chan struct{})
	l.start(ctx, func() { close(done) })
	<-done
}

// start connects and reconnects until ctx ends, then calls done once.
// While online the link holds no goroutine of its own (a bridged device
// should cost little): a timer watches the ticks, and the connection's
// read loop resumes the link when the connection ends.
func (l *link) start(ctx context.Context, done func()) {
	go l.connect(ctx, done, retry{started: time.Now()})
}

// retry is what carries over from one connection attempt to the next.
type retry struct {
	attempt int       // failed attempts since the last stable connection
	started time.Time // when the current attempt to get online began
}

func (l *link) backoff() backoff {
	return backoff{min: l.cfg.timing.BackoffMin, max: l.cfg.timing.BackoffMax, rand: l.cfg.rand}
}

// connect dials until online (then returns, the session carries on) or
// until ctx ends (then calls done).
func (l *link) connect(ctx context.Context, done func(), r retry) {
	bo := l.backoff()
	for ctx.Err() == nil {
		l.status.set(StateConnecting, l.status.get().LastError, "")
		s := &session{l: l, ctx: ctx, done: done, retry: r, ready: make(chan struct{})}
		c, err := l.dial(ctx, s)
		if ctx.Err() != nil {
			if c != nil {
				s.abandon()
				_ = c.Close()
			}
			break
		}
		if err != nil {
			if !sleep(ctx, l.failed(err, bo, &r.attempt)) {
				break
			}
			continue
		}
		l.mu.Lock()
		l.conn = c // before the state says online: events sent from then on go up
		l.mu.Unlock()
		l.status.update(func(st *Status) { st.OnlineAfterMs = time.Since(r.started).Milliseconds() })
		l.status.set(StateOnline, "", "")
		s.watch(c)
		l.sendEvent(eventPresenceAlive, l.presence())
		go l.publishTools()
		return
	}
	done()
}

// sleep waits d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// session is one online connection of a link.
type session struct {
	l     *link
	ctx   context.Context
	done  func()
	retry retry

	shutdown chan struct{} // a shutdown event arrived
	ready    chan struct{} // closed once watch set up the session, or it was abandoned

	mu        sync.Mutex
	c         *occlient.Client
	abandoned bool
	onlineAt  time.Time
	tick      time.Duration
	watchdog  *time.Timer
	stopCtx   func() bool
}

// watch sets up an online session: ctx's end closes the connection, a
// timer closes it with 4000 when no frame arrived for 2 × tickIntervalMs.
func (s *session) watch(c *occlient.Client) {
	tick := c.TickInterval()
	if tick <= 0 {
		tick = defaultTickInterval
	}
	s.mu.Lock()
	s.c, s.onlineAt, s.tick = c, time.Now(), tick
	s.stopCtx = context.AfterFunc(s.ctx, func() { _ = c.Close() })
	s.watchdog = time.AfterFunc(tick/4, s.check)
	s.mu.Unlock()
	close(s.ready)
}

// abandon marks a session whose connection is closed before it went
// online: its end must not resume the link.
func (s *session) abandon() {
	s.mu.Lock()
	s.abandoned = true
	s.mu.Unlock()
	close(s.ready)
}

// check is the dead-link watchdog.
func (s *session) check() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.c.LastFrame()) > 2*s.tick {
		s.l.cfg.log.Info("upstream tick timeout", "upstream", s.l.cfg.upstream.Name, "node", s.l.cfg.node.NodeID)
		go func() { _ = s.c.CloseWith(closeTickTimeout, tickTimeoutReason) }()
		return
	}
	s.watchdog.Reset(s.tick / 4)
}

// ended runs on the connection's read loop when the connection is over:
// it decides the wait and resumes connecting on a new goroutine.
func (s *session) ended(err error) {
	<-s.ready
	s.mu.Lock()
	if s.abandoned {
		s.mu.Unlock()
		return
	}
	s.watchdog.Stop()
	s.stopCtx()
	c, onlineAt, r := s.c, s.onlineAt, s.retry
	s.mu.Unlock()
	l := s.l
	l.mu.Lock()
	if l.conn == c {
		l.conn = nil
	}
	l.mu.Unlock()
	if s.ctx.Err() != nil {
		s.done()
		return
	}
	if time.Since(onlineAt) >= l.cfg.timing.StableAfter {
		r.attempt = 0
	}
	reason := "connection closed"
	if err != nil {
		reason = err.Error()
	}
	restart := websocket.CloseStatus(err) == closeServiceRestart || len(s.shutdown) > 0
	var wait time.Duration
	if restart && r.attempt == 0 {
		l.status.set(StateConnecting, reason, "") // the gateway said it restarts: be back as soon as it is
	} else {
		wait = l.backoff().delay(r.attempt)
		r.attempt++
		l.status.set(StateBackoff, reason, "")
	}
	r.started = time.Now()
	go func() {
		if !sleep(s.ctx, wait) {
			s.done()
			return
		}
		l.connect(s.ctx, s.done, r)
	}()
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
func (l *link) dial(ctx context.Context, s *session) (*occlient.Client, error) {
	tlsConf, err := l.cfg.upstream.tlsConfig()
	if err != nil {
		return nil, err
	}
	opts := occlient.Options{
		URL: l.cfg.upstream.URL, Token: l.cfg.upstream.Token, Password: l.cfg.upstream.Password, TLS: tlsConf,
		Role: "node", Scopes: []string{}, Identity: l.cfg.identity,
		ClientID: "node-host", Mode: "node", Version: l.cfg.node.Version, Platform: Platform,
		DisplayName: l.cfg.node.DisplayName, DeviceFamily: l.cfg.node.DeviceFamily,
		InstanceID: l.cfg.node.NodeID, Caps: Caps, Commands: Commands,
		MinProtocol: protocolCurrent, MaxProtocol: protocolCurrent, DiscardHello: true,
	}
	if opts.Version == "" {
		opts.Version = "unknown"
	}
	s.shutdown = make(chan struct{}, 1)
	opts.OnClose = s.ended
	for {
		ref := &clientRef{ready: make(chan struct{})}
		opts.OnEvent = func(ev occlient.Event) { l.onEvent(ref, s.shutdown, ev) }
		if l.cfg.handshakes != nil {
			select {
			case l.cfg.handshakes <- struct{}{}:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		dctx, cancel := context.WithTimeout(ctx, l.cfg.timing.ConnectTimeout)
		c, err := occlient.Dial(dctx, opts)
		cancel()
		if l.cfg.handshakes != nil {
			<-l.cfg.handshakes
		}
		if err == nil {
			ref.c = c
			close(ref.ready)
			return c, nil
		}
		var oe *occlient.Error
		if errors.As(err, &oe) && oe.DetailCode() == detailProtocolMismatch && opts.MaxProtocol == protocolCurrent {
			opts.MinProtocol, opts.MaxProtocol, opts.DeviceFamily = protocolNodeMinimum, protocolNodeMinimum, ""
			continue
		}
		// dctx is cancelled by now; only a passed deadline is a timeout
		// (a refused connection fails at once with its own error).
		if errors.Is(dctx.Err(), context.DeadlineExceeded) && ctx.Err() == nil && oe == nil {
			return nil, errors.New("connect timed out after " + l.cfg.timing.ConnectTimeout.String())
		}
		return nil, err
	}
}

// onEvent runs on the connection's read loop: it never blocks.
func (l *link) onEvent(ref *clientRef, shutdown chan struct{}, ev occlient.Event) {
	switch ev.Event {
	case eventInvokeRequest:
		go l.handleInvoke(ref, ev.Payload)
	case eventInvokeCancel:
		l.cancelInvoke(ev.Payload)
	case eventShutdown:
		select {
		case shutdown <- struct{}{}:
		default:
		}
	case eventPairResolved:
		var p struct {
			Decision string `json:"decision"`
		}
		if json.Unmarshal(ev.Payload, &p) == nil && p.Decision == "approved" {
			// Now the upstream admits the node's commands, and with them
			// its tools: publish again to learn what it took.
			l.republish()
			l.sendEvent(eventPresenceAlive, l.presence())
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

// parsedInvoke is a node.invoke.request as a link acts on it.
type parsedInvoke struct {
	id, command, idempotencyKey string
	params                      json.RawMessage // nil when absent
	timeout                     time.Duration   // [1 ms, maxInvokeTimeout]
	// refusal, when set, is the answer: the call is not forwarded.
	refusal *resultError
}

// errNoInvokeID: a request without an id cannot be answered.
var errNoInvokeID = errors.New("node.invoke.request without an id")

// parseInvokeRequest reads a node.invoke.request payload from the
// upstream. paramsJSON may be null or absent; an undeclared command or
// params that are not JSON get a refusal rather than an error.
func parseInvokeRequest(raw []byte) (parsedInvoke, error) {
	var req invokeRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		return parsedInvoke{}, err
	}
	if req.ID == "" {
		return parsedInvoke{}, errNoInvokeID
	}
	p := parsedInvoke{id: req.ID, command: req.Command, idempotencyKey: req.IdempotencyKey, timeout: defaultInvokeTimeout}
	if req.TimeoutMs != nil {
		switch ms := *req.TimeoutMs; {
		case ms >= maxInvokeTimeout.Milliseconds():
			p.timeout = maxInvokeTimeout
		case ms < 1:
			p.timeout = time.Millisecond // OpenClaw: an explicit 0 expires at once
		default:
			p.timeout = time.Duration(ms) * time.Millisecond
		}
	}
	if req.ParamsJSON != nil && *req.ParamsJSON != "" {
		p.params = json.RawMessage(*req.ParamsJSON)
	}
	switch {
	case !declared(req.Command):
		p.refusal = &resultError{Code: faultUnavailable, Message: commandNotSupported}
	case p.params != nil && !json.Valid(p.params):
		p.refusal = &resultError{Code: faultInvalid, Message: "paramsJSON is not valid JSON"}
	}
	return p, nil
}

func (l *link) handleInvoke(ref *clientRef, raw json.RawMessage) {
	req, err := parseInvokeRequest(raw)
	if err != nil {
		l.cfg.log.Warn("malformed node.invoke.request from upstream", "upstream", l.cfg.upstream.Name, "err", err)
		return // without an id there is nothing to answer
	}
	res := invokeResult{ID: req.id, NodeID: l.deviceID, Error: req.refusal}
	if n := l.inflight.Add(1); n > maxInflightPerLink && res.Error == nil {
		res.Error = &resultError{Code: faultUnavailable, Message: "too many calls in flight for this node"}
	}
	defer l.inflight.Add(-1)
	if res.Error == nil {
		ctx, cancel := context.WithTimeout(context.Background(), req.timeout)
		ctx, cancelled := context.WithCancelCause(ctx)
		l.track(req.id, func() { cancelled(errInvokeCancelled) })
		payload, fault := l.cfg.invoker.Invoke(ctx, Call{Upstream: l.cfg.upstream.Name, Tenant: l.cfg.upstream.Tenant,
			NodeID: l.cfg.node.NodeID, Command: req.command, Params: req.params, IdempotencyKey: req.idempotencyKey})
		l.untrack(req.id)
		wasCancelled := errors.Is(context.Cause(ctx), errInvokeCancelled)
		cancelled(nil)
		cancel()
		if wasCancelled {
			return // the upstream gave the call up: it waits for no result
		}
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

// errInvokeCancelled is the cause of a call the upstream cancelled.
var errInvokeCancelled = errors.New("cancelled by the upstream (node.invoke.cancel)")

// track makes a running call cancellable by its invoke id.
func (l *link) track(id string, cancel context.CancelFunc) {
	l.callsMu.Lock()
	defer l.callsMu.Unlock()
	if l.calls == nil {
		l.calls = map[string]context.CancelFunc{}
	}
	l.calls[id] = cancel
}

func (l *link) untrack(id string) {
	l.callsMu.Lock()
	defer l.callsMu.Unlock()
	delete(l.calls, id)
}

// cancelInvoke handles node.invoke.cancel {invokeId, nodeId} (protocol 4):
// the upstream's caller gave up, so the call stops waiting for xiaoclaw's
// gateway and frees its place among the link's calls in flight. A device
// that already received the call still runs it to the end (MCP tools/call
// has no cancel a XiaoZhi device honours). An unknown id is ignored: the
// call has ended already.
func (l *link) cancelInvoke(raw json.RawMessage) {
	var p struct {
		InvokeID string `json:"invokeId"`
	}
	if json.Unmarshal(raw, &p) != nil || p.InvokeID == "" {
		l.cfg.log.Debug("malformed node.invoke.cancel from upstream", "upstream", l.cfg.upstream.Name)
		return
	}
	l.callsMu.Lock()
	cancel := l.calls[p.InvokeID]
	l.callsMu.Unlock()
	if cancel != nil {
		cancel()
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
		res, err := c.Call(ctx, methodNodeEvent, p)
		if err != nil {
			l.cfg.log.Debug("node.event not delivered", "upstream", l.cfg.upstream.Name, "node", l.cfg.node.NodeID, "err", err)
			ack := &EventAck{Event: event, Error: err.Error()}
			l.status.update(func(st *Status) { st.LastEvent = ack })
			return
		}
		// OpenClaw answers {ok, event, handled, reason}: handled false with
		// reason "unsupported_event" for an event it has no use for.
		ack := &EventAck{Event: event, Handled: true}
		_ = json.Unmarshal(res, ack)
		ack.Event = event
		l.status.update(func(st *Status) { st.LastEvent = ack })
	}()
}
