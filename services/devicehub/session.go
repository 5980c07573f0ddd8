package devicehub

import (
	"context"
	"encoding/json"
	"log/slog"
	"sync"
	"sync/atomic"
	"unique"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/devicehub/internal/mcpclient"
	"github.com/xiaoclaw/xiaoclaw/services/devicehub/internal/xzproto"
)

// endCause says why a session ends; transports map it to their close signal.
type endCause int

const (
	causeDevice    endCause = iota // the device closed or the network failed
	causeReplaced                  // a newer session of the same device
	causeShutdown                  // the hub is stopping
	causeIdle                      // nothing from the device for IdleTimeout
	causeMalformed                 // the device sent bytes we cannot parse
	causeTooLarge                  // a frame over MaxFrameBytes
	causeSlow                      // the device does not take our frames
	causeRefused                   // the hub could not register the session
)

// transport is one device connection as a session sees it. The XiaoZhi
// WebSocket implements it; an MQTT connection will too. Send (from
// mcpclient.Sender) writes one JSON-RPC message in the transport's
// envelope; close ends the connection without blocking and is idempotent.
type transport interface {
	mcpclient.Sender
	close(cause endCause, reason string)
}

type deviceKey struct{ tenant, device string }

// session is one device session, whatever its transport: identity, the
// MCP client, and presence. It holds no goroutine of its own; the
// transport's reader feeds it frames.
type session struct {
	hub       *hub
	id        string
	key       deviceKey
	deviceRaw string
	clientID  string
	remoteIP  string
	userAgent string
	transport string // wire.TransportWebSocket or wire.TransportMQTT
	startedMs int64
	conn      transport
	// The hello (and below, the catalog) of every device of one firmware
	// build is the same text: interning keeps one copy for all sessions.
	hello  unique.Handle[string]
	hasMCP bool
	// counted is set while the session counts in the devices-connected gauge.
	counted atomic.Bool

	mcp mcpclient.Client

	notifyOnce sync.Once
	notify     *notifyLimit

	mu         sync.Mutex // guards the fields below and orders this session's events
	connecting bool       // announced connecting, discovery under way
	online     bool
	ended      bool
	serverInfo *unique.Handle[string]
	tools      *unique.Handle[string]
	relist     relister
}

func (s *session) logAttrs() []any {
	return []any{"tenant", s.key.tenant, "device", s.key.device, "session_id", s.id}
}

// startMCP runs discovery for a device that announced MCP, announcing the
// session connecting once the device is initialized and online once its
// tools are listed; without MCP it announces it online at once. Called once
// the session is registered.
func (s *session) startMCP() {
	if !s.hasMCP {
		s.goOnline(nil, nil, false)
		return
	}
	go func() {
		cfg := s.hub.cfg
		d, err := s.mcp.Discover(func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), cfg.CallTimeout)
		}, mcpclient.DiscoverOptions{
			WithUserTools: cfg.WithUserTools, MaxCatalogBytes: cfg.MaxCatalogBytes,
			MaxPages: cfg.MaxToolPages, ClientVersion: cfg.Version,
			Initialized: s.goConnecting,
		})
		if err != nil {
			s.mu.Lock()
			ended := s.ended
			s.mu.Unlock()
			if ended {
				return
			}
			s.hub.log.Warn("devicehub: MCP discovery incomplete; announcing what was learned",
				append(s.logAttrs(), "pages", d.Pages, "err", err)...)
		}
		// Without a single page the catalog is unknown rather than empty:
		// online then carries none, and the registry keeps the node's last
		// one (stale) until a re-list succeeds.
		s.goOnline(d.ServerInfo, d.Tools, err == nil || d.Pages > 0)
	}()
}

// goConnecting announces an initialized session before its catalog is
// known, so that the node is listed (with the catalog it had) while the
// device answers tools/list, which may take long.
func (s *session) goConnecting(serverInfo json.RawMessage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended || s.online {
		return
	}
	if len(serverInfo) > 0 {
		h := unique.Make(string(serverInfo))
		s.serverInfo = &h
	}
	s.connecting = true
	s.publishConnectingLocked()
}

// publishConnectingLocked publishes the connecting event under s.mu.
func (s *session) publishConnectingLocked() {
	ev := s.announceEvent(wire.DeviceConnecting)
	if s.serverInfo != nil {
		ev.ServerInfo = json.RawMessage(s.serverInfo.Value())
	}
	s.hub.publish(s.key, ev)
}

// announceEvent is a connecting or online event with the session's hello facts.
func (s *session) announceEvent(kind string) *wire.DeviceEvent {
	ev := s.event(kind)
	ev.AtMs = s.startedMs
	ev.ClientID = s.clientID
	ev.RemoteIP = s.remoteIP
	ev.UserAgent = s.userAgent
	if s.hello != (unique.Handle[string]{}) {
		ev.Hello = json.RawMessage(s.hello.Value())
	}
	ev.MCP = s.hasMCP
	return ev
}

// goOnline announces the session online; listed says whether tools is the
// device's catalog (an MCP session that could not list any has none).
func (s *session) goOnline(serverInfo, tools json.RawMessage, listed bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return
	}
	if len(serverInfo) > 0 {
		h := unique.Make(string(serverInfo))
		s.serverInfo = &h
	}
	if s.hasMCP && listed {
		if len(tools) == 0 {
			tools = json.RawMessage("[]")
		}
		h := unique.Make(string(tools))
		s.tools = &h
	}
	s.online, s.connecting = true, false
	s.publishOnlineLocked()
	s.hub.log.Info("devicehub: device online", s.logAttrs()...)
}

// publishOnlineLocked publishes the online event; s.mu is held so that an
// offline event can never overtake it.
func (s *session) publishOnlineLocked() {
	ev := s.announceEvent(wire.DeviceOnline)
	if s.serverInfo != nil {
		ev.ServerInfo = json.RawMessage(s.serverInfo.Value())
	}
	if s.tools != nil {
		ev.Tools = json.RawMessage(s.tools.Value())
	}
	s.hub.publish(s.key, ev)
}

// republish announces the session again if it is online or connecting
// (hub resync).
func (s *session) republish() {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.ended:
	case s.online:
		s.publishOnlineLocked()
	case s.connecting:
		s.publishConnectingLocked()
	}
}

func (s *session) event(kind string) *wire.DeviceEvent {
	return &wire.DeviceEvent{
		Kind: kind, Tenant: s.key.tenant, Device: s.key.device, DeviceRaw: s.deviceRaw,
		SessionID: s.id, Hub: s.hub.cfg.Instance, Transport: s.transport, AtMs: nowMs(),
	}
}

// end closes the session once: it closes the transport, fails every
// pending call with fault at once, unregisters the session and, if it was
// announced online, publishes offline with reason.
func (s *session) end(cause endCause, reason string, fault *wire.Fault) {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	s.ended = true
	wasOnline := s.online || s.connecting
	s.mu.Unlock()

	s.conn.close(cause, reason)
	s.mcp.Close(fault)
	s.hub.detach(s)
	if s.counted.Swap(false) {
		s.hub.devicesConnected.WithLabelValues(s.key.tenant, s.transport).Dec()
	}
	if wasOnline {
		ev := s.event(wire.DeviceOffline)
		ev.Reason = reason
		s.hub.publish(s.key, ev)
	}
	level := slog.LevelInfo
	if cause == causeMalformed || cause == causeTooLarge || cause == causeSlow {
		level = slog.LevelWarn
	}
	s.hub.log.Log(context.Background(), level, "devicehub: session ended", append(s.logAttrs(), "reason", reason)...)
}

// handleFrame processes one JSON text frame from the device. It returns an
// error only for a frame that is not JSON, which ends the session.
func (s *session) handleFrame(frame []byte) error {
	f, err := xzproto.ParseFrame(frame)
	if err != nil {
		return err
	}
	switch f.Type {
	case "mcp":
		s.handleMCP(f.Payload)
	case "hello":
		// WebSocket: a repeated hello gets the same answer, the session goes
		// on. MQTT: the hello opens a voice session (see mqttConn).
		if t, ok := s.conn.(interface{ answerHello(frame []byte) }); ok {
			t.answerHello(frame)
		}
	case "goodbye":
		if t, ok := s.conn.(interface{ deviceGoodbye(sessionID string) }); ok {
			t.deviceGoodbye(f.SessionID)
		}
	}
	// listen, abort and anything else: nothing for a control plane.
	return nil
}

func (s *session) handleMCP(payload json.RawMessage) {
	if payload == nil {
		s.hub.log.Debug("devicehub: mcp frame without payload", s.logAttrs()...)
		return
	}
	msg, err := xzproto.ParseMessage(payload)
	if err != nil {
		s.hub.log.Debug("devicehub: unreadable JSON-RPC message dropped", append(s.logAttrs(), "err", err)...)
		return
	}
	switch msg.Kind {
	case xzproto.KindResponse:
		if !msg.NumOK || !s.mcp.Deliver(msg.NumID, payload) {
			s.hub.log.Debug("devicehub: response to no pending call dropped", append(s.logAttrs(), "id", string(msg.ID))...)
		}
	case xzproto.KindNotification:
		if msg.Method == methodToolsListChanged {
			s.requestRelist()
		}
		s.publishNotification(payload)
	case xzproto.KindRequest:
		// The hub is a client only; tell the device so instead of leaving it waiting.
		_ = s.conn.Send(xzproto.AppendErrorResponse(nil, msg.ID, -32601, "Method not found: "+msg.Method))
	}
}
