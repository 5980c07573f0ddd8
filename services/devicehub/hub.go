package devicehub

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/xiaoclaw/xiaoclaw/pkg/gopool"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/devicehub/internal/xzproto"
)

// hub is the transport-independent core: the sessions this replica holds,
// their NATS subscriptions, RPC serving and presence events.
//
// Each held device has two core NATS subscriptions, its rpc subject (so a
// request reaches whichever replica holds the session, and "no responders"
// means offline) and its state subject (so a newer session announced by
// another replica closes ours). Both deliver into one shared channel read
// by one dispatcher: nats.go starts a goroutine per callback subscription,
// which would cost a stack per idle device, while channel subscriptions
// cost none.
type hub struct {
	cfg *Config
	nc  *nats.Conn
	log *slog.Logger

	msgs    chan *nats.Msg
	workers *gopool.Pool // runs the requests to devices

	mu       sync.Mutex
	devices  map[deviceKey]*deviceEntry
	stopping bool
	// conns counts the transports' goroutines; Add happens under mu while
	// not stopping, so it never races with the shutdown Wait.
	conns sync.WaitGroup

	lastSessionNanos atomic.Int64
	fails            *authFailures // refused devices, throttled and folded (authfail.go)

	// Telemetry, set by instrument.
	tracer           trace.Tracer
	invokes          *prometheus.CounterVec
	hopDevice        prometheus.Observer
	devicesConnected *prometheus.GaugeVec
	notifyDropped    *prometheus.CounterVec
}

type deviceEntry struct {
	sess     *session
	rpcSub   *nats.Subscription
	stateSub *nats.Subscription
}

func newHub(cfg *Config, nc *nats.Conn, log *slog.Logger) *hub {
	return &hub{cfg: cfg, nc: nc, log: log, msgs: make(chan *nats.Msg, 8192), workers: gopool.New(0),
		devices: make(map[deviceKey]*deviceEntry)}
}

// instrument takes the tracer and declares the hub's metrics.
func (h *hub) instrument() error {
	h.tracer = h.cfg.TracerProvider.Tracer(telemetry.ScopeName)
	var err error
	if h.invokes, err = telemetry.NewInvokes(h.cfg.Registerer); err != nil {
		return err
	}
	hops, err := telemetry.NewHopDuration(h.cfg.Registerer)
	if err != nil {
		return err
	}
	h.hopDevice = hops.WithLabelValues(telemetry.HopDevicehubDevice)
	if h.devicesConnected, err = telemetry.NewDevicesConnected(h.cfg.Registerer); err != nil {
		return err
	}
	h.notifyDropped, err = newNotificationsDropped(h.cfg.Registerer)
	return err
}

var errStopping = errors.New("devicehub is shutting down")

// admit counts a new connection's goroutine, unless the hub is stopping.
func (h *hub) admit() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopping {
		return false
	}
	h.conns.Add(1)
	return true
}

// newSessionID returns an id that sorts after every earlier one of this
// hub: 16 hex digits of the start time in ns (strictly increasing), then 8
// random hex digits so replicas never collide. Consumers order sessions of
// a device by comparing ids as strings.
func (h *hub) newSessionID() string {
	for {
		last := h.lastSessionNanos.Load()
		now := time.Now().UnixNano()
		if now <= last {
			now = last + 1
		}
		if h.lastSessionNanos.CompareAndSwap(last, now) {
			var r [4]byte
			_, _ = rand.Read(r[:])
			return fmt.Sprintf("%016x%08x", uint64(now), binary.BigEndian.Uint32(r[:]))
		}
	}
}

// attach registers s as the session of its device. An older session of
// the device on this hub ends first (offline before the new online).
func (h *hub) attach(s *session) error {
	h.mu.Lock()
	if h.stopping {
		h.mu.Unlock()
		return errStopping
	}
	e := h.devices[s.key]
	if e == nil {
		e = &deviceEntry{}
		var err error
		if e.rpcSub, err = h.nc.ChanSubscribe(wire.DeviceRPC(s.key.tenant, s.key.device), h.msgs); err != nil {
			h.mu.Unlock()
			return fmt.Errorf("subscribe rpc: %w", err)
		}
		if e.stateSub, err = h.nc.ChanSubscribe(wire.DeviceState(s.key.tenant, s.key.device), h.msgs); err != nil {
			_ = e.rpcSub.Unsubscribe()
			h.mu.Unlock()
			return fmt.Errorf("subscribe state: %w", err)
		}
		h.devices[s.key] = e
	}
	old := e.sess
	e.sess = s
	h.mu.Unlock()
	h.devicesConnected.WithLabelValues(s.key.tenant, s.transport).Inc()
	s.counted.Store(true)
	if old != nil {
		old.end(causeReplaced, "replaced by a newer session", &wire.Fault{
			Code: wire.FaultDisconnected, Message: "the device opened a new session; this one was closed",
		})
	}
	return nil
}

// detach unregisters s if it is still its device's session.
func (h *hub) detach(s *session) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.devices[s.key]
	if e == nil || e.sess != s {
		return
	}
	delete(h.devices, s.key)
	_ = e.rpcSub.Unsubscribe()
	_ = e.stateSub.Unsubscribe()
}

func (h *hub) lookup(k deviceKey) *session {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e := h.devices[k]; e != nil {
		return e.sess
	}
	return nil
}

func (h *hub) snapshot() []*session {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*session, 0, len(h.devices))
	for _, e := range h.devices {
		out = append(out, e.sess)
	}
	return out
}

func (h *hub) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.devices)
}

// publish sends a device event; failures are logged (the NATS client
// buffers while reconnecting, so this is rare).
func (h *hub) publish(k deviceKey, ev *wire.DeviceEvent) {
	if err := h.publishEvent(wire.DeviceState(k.tenant, k.device), k, ev); err != nil {
		h.log.Warn("devicehub: event not published", "kind", ev.Kind, "tenant", k.tenant, "device", k.device, "err", err)
	}
}

// publishEvent puts a device event on subject, with its tenant header.
func (h *hub) publishEvent(subject string, k deviceKey, ev *wire.DeviceEvent) error {
	data, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	msg := &nats.Msg{Subject: subject, Header: nats.Header{}, Data: data}
	msg.Header.Set(wire.HeaderTenant, k.tenant)
	return h.nc.PublishMsg(msg)
}

// dispatch routes the messages of every subscription until stop closes.
func (h *hub) dispatch(stop <-chan struct{}) {
	for {
		select {
		case m := <-h.msgs:
			h.route(m)
		case <-stop:
			return
		}
	}
}

func (h *hub) route(m *nats.Msg) {
	if m.Subject == wire.SubjectHubResync {
		go h.resync()
		return
	}
	tenant, device, ok := wire.DeviceFromSubject(m.Subject)
	if !ok {
		return
	}
	k := deviceKey{tenant, device}
	switch {
	case strings.HasSuffix(m.Subject, ".rpc"):
		s := h.lookup(k)
		if s == nil {
			// The session ended between delivery and now. Stay silent: if
			// the device already reconnected to another replica, that one
			// answers, and an instant "not connected" from here would win.
			h.log.Debug("devicehub: request for a session that just ended", "tenant", tenant, "device", device)
			return
		}
		h.workers.Go(func() { h.serveRPC(s, m) })
	case strings.HasSuffix(m.Subject, ".state"):
		h.checkTakeover(k, m.Data)
	}
}

// checkTakeover ends our session of a device when another replica
// announces a newer one (the device reconnected elsewhere).
func (h *hub) checkTakeover(k deviceKey, data []byte) {
	var ev struct {
		Kind      string `json:"kind"`
		Hub       string `json:"hub"`
		SessionID string `json:"sessionId"`
	}
	if json.Unmarshal(data, &ev) != nil || ev.Kind != wire.DeviceOnline {
		return
	}
	s := h.lookup(k)
	if s == nil || ev.SessionID <= s.id {
		return
	}
	go s.end(causeReplaced, "replaced by a newer session on "+ev.Hub, &wire.Fault{
		Code: wire.FaultDisconnected, Message: "the device opened a new session on another hub; this one was closed",
	})
}

func (h *hub) resync() {
	for _, s := range h.snapshot() {
		s.republish()
	}
}

func (h *hub) serveRPC(s *session, m *nats.Msg) {
	if m.Reply == "" {
		return // nobody to answer: a request without reply subject is not run
	}
	ctx := telemetry.ExtractHeader(context.Background(), m.Header)
	ctx, cancel := context.WithDeadline(ctx, wire.Deadline(m.Header, h.cfg.CallTimeout))
	defer cancel()
	method, raw, err := h.call(ctx, s, m.Data, min(h.nc.MaxPayload()-1024, int64(h.cfg.MaxResultBytes)))
	code := ""
	if err != nil {
		f := asFault(err)
		code = f.Code
		h.respondFault(m, f)
	} else if err := m.RespondMsg(&nats.Msg{Data: raw}); err != nil {
		h.log.WarnContext(ctx, "devicehub: reply not sent", append(s.logAttrs(), "err", err)...)
	}
	h.invokes.WithLabelValues(telemetry.LabelDevicehub, telemetry.CommandLabel(telemetry.MCPCommand(method)), telemetry.OutcomeOf(code)).Inc()
}

// call runs one caller request (a JSON-RPC request body) on s until ctx
// ends and returns the request's method ("" when unreadable) with the
// device's response, which may be at most maxResponse bytes (0: any size).
// A readable request gets the hub's span of the call (the device call), a
// child of ctx's trace context.
func (h *hub) call(ctx context.Context, s *session, body []byte, maxResponse int64) (string, json.RawMessage, error) {
	if len(body) > h.cfg.MaxFrameBytes {
		return "", nil, &wire.Fault{Code: wire.FaultTooLarge, Message: fmt.Sprintf("request of %d bytes exceeds %d", len(body), h.cfg.MaxFrameBytes)}
	}
	req, err := xzproto.ParseRequest(body)
	if err != nil {
		return "", nil, &wire.Fault{Code: wire.FaultInvalidRequest, Message: err.Error()}
	}
	ctx, span := telemetry.StartDeviceCall(ctx, h.tracer, req.Method, s.transport, telemetry.CallInfo{Device: s.key.device})
	if span.Recording() {
		span.AddInfo(telemetry.CallInfo{Tool: toolName(req.Method, req.Params)})
	}
	var sent time.Time
	raw, err := s.mcp.CallWithID(ctx, req.Method, req.Params, func(id uint64) {
		span.SetRequestID(int64(id))
		sent = time.Now()
	})
	if !sent.IsZero() { // the request reached the device's session
		h.hopDevice.Observe(time.Since(sent).Seconds())
	}
	if err == nil && maxResponse > 0 && int64(len(raw)) > maxResponse {
		err = &wire.Fault{Code: wire.FaultTooLarge, Message: fmt.Sprintf("device response of %d bytes exceeds the limit of %d bytes", len(raw), maxResponse)}
	}
	code := telemetry.FaultCode(err)
	if err == nil && isErrorResponse(raw) {
		code = wire.FaultDeviceError
	}
	span.End(code, err)
	return req.Method, raw, err
}

// toolName is the tool of a tools/call request, for span attributes.
func toolName(method string, params json.RawMessage) string {
	if method != "tools/call" || len(params) == 0 {
		return ""
	}
	var p struct {
		Name string `json:"name"`
	}
	_ = json.Unmarshal(params, &p)
	return p.Name
}

// isErrorResponse tells a JSON-RPC error response from a result without
// decoding it: the hub assigned a numeric id, so the first "error" or
// "result" key in the bytes is the response's own.
func isErrorResponse(raw []byte) bool {
	e := bytes.Index(raw, []byte(`"error"`))
	if e < 0 {
		return false
	}
	r := bytes.Index(raw, []byte(`"result"`))
	return r < 0 || e < r
}

func asFault(err error) *wire.Fault {
	var f *wire.Fault
	if errors.As(err, &f) {
		return f
	}
	return &wire.Fault{Code: wire.FaultUnavailable, Message: err.Error()}
}

func (h *hub) respondFault(m *nats.Msg, f *wire.Fault) {
	if m.Reply == "" {
		return
	}
	data, _ := json.Marshal(f)
	reply := &nats.Msg{Header: nats.Header{}, Data: data}
	reply.Header.Set(wire.HeaderFault, f.Code)
	if err := m.RespondMsg(reply); err != nil {
		h.log.Warn("devicehub: fault reply not sent", "subject", m.Subject, "err", err)
	}
}

// shutdown ends every session (pending calls fail with DISCONNECTED,
// offline events go out) and waits up to timeout for the transports.
func (h *hub) shutdown(timeout time.Duration) {
	h.mu.Lock()
	h.stopping = true
	h.mu.Unlock()
	for _, s := range h.snapshot() {
		s.end(causeShutdown, "devicehub shutting down", &wire.Fault{
			Code: wire.FaultDisconnected, Message: "the devicehub holding the session is shutting down",
		})
	}
	done := make(chan struct{})
	go func() { h.conns.Wait(); close(done) }()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		h.log.Warn("devicehub: connections still closing after the shutdown timeout", "timeout", timeout)
	}
}

func nowMs() int64 { return time.Now().UnixMilli() }
