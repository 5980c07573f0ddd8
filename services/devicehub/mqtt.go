package devicehub

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/listeners"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/xiaoclaw/xiaoclaw/pkg/deviceauth"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/devicehub/internal/xzproto"
)

// The MQTT transport. XiaoZhi MQTT devices connect at boot and stay
// connected; they never SUBSCRIBE and publish everything to one shared
// topic, so the broker is only a framing layer here: the hook routes every
// publish by the connection it arrived on and never fans it out, and
// downlink is written straight onto the device's connection as a PUBLISH to
// devices/p2p/<mac_>, with no subscription involved.

// mqttBroker is the embedded mochi broker with the devicehub's hook, and
// the UDP sink announced in server hellos.
type mqttBroker struct {
	hub   *hub
	srv   *mqtt.Server
	ln    *deviceListener
	udp   net.PacketConn
	conns sync.Map // *mqtt.Client -> *mqttConn
}

func newMQTTBroker(h *hub, log *slog.Logger) (*mqttBroker, error) {
	cfg := h.cfg
	caps := mqtt.NewDefaultServerCapabilities()
	caps.MaximumClientWritesPending = int32(cfg.MQTTWritesQueue)
	caps.MaximumPacketSize = uint32(cfg.MaxFrameBytes + 1024) // envelope + topic on top of the JSON
	caps.MaximumInflight = 16
	caps.ReceiveMaximum = 16
	caps.MaximumQos = 0
	caps.RetainAvailable = 0
	caps.WildcardSubAvailable = 0
	caps.SharedSubAvailable = 0
	caps.SubIDAvailable = 0
	caps.TopicAliasMaximum = 0
	caps.MaximumSessionExpiryInterval = 0
	caps.MaximumMessageExpiryInterval = 0
	caps.MinimumProtocolVersion = 3
	srv := mqtt.New(&mqtt.Options{
		Capabilities:             caps,
		ClientNetReadBufferSize:  cfg.MQTTBufferSize,
		ClientNetWriteBufferSize: cfg.MQTTBufferSize,
		// The broker logs every refused connection at warn; the hook
		// logs what matters, so only its errors pass.
		Logger:                 slog.New(minLevel{log.Handler(), slog.LevelError}),
		SysTopicResendInterval: math.MaxInt32, // nobody may subscribe to $SYS
	})
	b := &mqttBroker{hub: h, srv: srv}
	if err := srv.AddHook(&mqttHook{b: b}, nil); err != nil {
		return nil, err
	}
	return b, nil
}

// start binds the MQTT listener and the UDP sink and serves.
func (b *mqttBroker) start() error {
	cfg := b.hub.cfg
	udp, err := net.ListenPacket("udp", cfg.UDPAddr)
	if err != nil {
		return fmt.Errorf("UDP sink on %s: %w", cfg.UDPAddr, err)
	}
	b.udp = udp
	go drainUDP(udp)
	b.ln = &deviceListener{addr: cfg.MQTTAddr, tlsConfig: cfg.MQTTTLS, helloTimeout: cfg.HelloTimeout, writeTimeout: cfg.WriteTimeout}
	if err := b.srv.AddListener(b.ln); err != nil {
		udp.Close()
		return fmt.Errorf("MQTT listener on %s: %w", cfg.MQTTAddr, err)
	}
	return b.srv.Serve()
}

// drainUDP accepts and drops device audio until the socket closes.
func drainUDP(c net.PacketConn) {
	buf := make([]byte, 2048)
	for {
		if _, _, err := c.ReadFrom(buf); errors.Is(err, net.ErrClosed) {
			return
		}
	}
}

// stop closes the listener, every remaining connection and the UDP sink.
func (b *mqttBroker) stop() {
	_ = b.srv.Close()
	if b.udp != nil {
		b.udp.Close()
	}
}

func (b *mqttBroker) udpPort() int {
	if b.udp == nil {
		return 0
	}
	return b.udp.LocalAddr().(*net.UDPAddr).Port
}

// mqttHook is the broker hook: authentication, routing and refusals.
type mqttHook struct {
	mqtt.HookBase
	b *mqttBroker
}

func (*mqttHook) ID() string { return "xiaoclaw-devicehub" }

func (*mqttHook) Provides(b byte) bool {
	switch b {
	case mqtt.OnConnect, mqtt.OnConnectAuthenticate, mqtt.OnACLCheck, mqtt.OnSessionEstablished,
		mqtt.OnPublish, mqtt.OnDisconnect, mqtt.OnPacketRead:
		return true
	}
	return false
}

// OnConnect refuses MQTT 5 (the firmware speaks 3.1.1; the reference
// gateway accepts levels 3 and 4 only) and applies the default keepalive.
func (h *mqttHook) OnConnect(cl *mqtt.Client, pk packets.Packet) error {
	if v := cl.Properties.ProtocolVersion; v != 3 && v != 4 {
		_ = h.b.srv.SendConnack(cl, packets.ErrUnsupportedProtocolVersion, false, nil)
		return packets.ErrUnsupportedProtocolVersion
	}
	// A source that failed too often is refused before its credentials
	// are checked; MQTT 3.1.1 has no "retry later" code, "server
	// unavailable" makes the firmware back off.
	if h.b.hub.throttled(wire.TransportMQTT, cl.Net.Remote) > 0 {
		_ = h.b.srv.SendConnack(cl, packets.ErrServerUnavailable, false, nil)
		return packets.ErrServerUnavailable
	}
	if cl.State.Keepalive == 0 {
		cl.State.Keepalive = uint16(h.b.hub.cfg.MQTTKeepalive / time.Second)
	}
	return nil
}

// OnConnectAuthenticate checks the client id form and the credentials with
// the Authenticator (Transport mqtt) and remembers the tenant.
func (h *mqttHook) OnConnectAuthenticate(cl *mqtt.Client, pk packets.Packet) bool {
	hub := h.b.hub
	remoteIP := cl.Net.Remote
	if host, _, err := net.SplitHostPort(remoteIP); err == nil {
		remoteIP = host
	}
	clientID := pk.Connect.ClientIdentifier
	id, err := xzproto.ParseMQTTClientID(clientID)
	if err != nil {
		hub.authFailed(wire.TransportMQTT, "", clientID, remoteIP, err.Error())
		hub.log.Warn("devicehub: MQTT device refused", "remote_ip", remoteIP, "client_id", truncateLog(clientID), "reason", err.Error())
		return false
	}
	device, err := wire.CanonicalDevice(id.Device)
	if err != nil {
		hub.authFailed(wire.TransportMQTT, id.Device, clientID, remoteIP, "invalid device id")
		hub.log.Warn("devicehub: MQTT device refused", "remote_ip", remoteIP, "client_id", truncateLog(clientID), "reason", "invalid device id")
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), authTimeout)
	tenant, err := hub.cfg.Auth.AuthenticateDevice(ctx, deviceauth.Credentials{
		Transport: wire.TransportMQTT, DeviceID: id.Device, ClientID: clientID,
		Username: string(pk.Connect.Username), Password: string(pk.Connect.Password), RemoteAddr: cl.Net.Remote,
	})
	cancel()
	switch {
	case errors.Is(err, deviceauth.ErrUnauthenticated):
		hub.authFailed(wire.TransportMQTT, device, clientID, remoteIP, "unauthenticated")
		hub.log.Warn("devicehub: MQTT device refused", "remote_ip", remoteIP, "device", device, "reason", "unauthenticated")
		return false
	case err != nil:
		hub.log.Error("devicehub: MQTT device authentication failed", "remote_ip", remoteIP, "device", device, "err", err)
		return false
	case wire.ValidTenant(tenant) != nil:
		hub.log.Error("devicehub: authenticator returned an invalid tenant", "device", device, "tenant", tenant)
		return false
	}
	c := &mqttConn{b: h.b, cl: cl, topic: xzproto.P2PTopic(id.Device)}
	c.sess = &session{
		hub: hub, key: deviceKey{tenant, device}, deviceRaw: id.Device, clientID: id.UUID,
		remoteIP: remoteIP, transport: wire.TransportMQTT, conn: c, hasMCP: true,
	}
	h.b.conns.Store(cl, c)
	return true
}

// OnACLCheck lets a device publish (the hook routes it) and subscribe only
// to its own downlink topic, which some clients do; nothing is ever
// published through the broker, so a subscription receives nothing else.
func (h *mqttHook) OnACLCheck(cl *mqtt.Client, topic string, write bool) bool {
	if write {
		return true
	}
	v, ok := h.b.conns.Load(cl)
	return ok && v.(*mqttConn).topic == topic
}

// OnPacketRead closes the connection of a device that publishes with QoS
// above 0, as the reference gateway does (the firmware publishes QoS 0).
func (h *mqttHook) OnPacketRead(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if pk.FixedHeader.Type == packets.Publish && pk.FixedHeader.Qos > 0 {
		if v, ok := h.b.conns.Load(cl); ok {
			v.(*mqttConn).closing.CompareAndSwap(nil, &closeInfo{cause: causeMalformed, reason: "publish with QoS " + strconv.Itoa(int(pk.FixedHeader.Qos))})
		}
		return pk, packets.ErrRejectPacket
	}
	return pk, nil
}

// OnSessionEstablished registers the session, right after the CONNACK,
// and starts MCP discovery: an MQTT device answers MCP without a voice
// session.
func (h *mqttHook) OnSessionEstablished(cl *mqtt.Client, pk packets.Packet) {
	v, ok := h.b.conns.Load(cl)
	if !ok {
		return
	}
	c := v.(*mqttConn)
	hub := h.b.hub
	s := c.sess
	if !hub.admit() {
		c.closeConn()
		return
	}
	c.admitted = true
	s.id = hub.newSessionID()
	s.startedMs = nowMs()
	s.mcp.Init(c, hub.cfg.MaxInFlight)
	if err := hub.attach(s); err != nil {
		hub.log.Warn("devicehub: session not registered", append(s.logAttrs(), "err", err)...)
		c.close(causeRefused, "session not registered")
		return
	}
	hub.log.Info("devicehub: session started", append(s.logAttrs(), "transport", wire.TransportMQTT, "remote_ip", s.remoteIP, "client_id", s.clientID)...)
	s.startMCP()
}

// OnPublish hands a device's publish to its session and never lets the
// broker deliver it anywhere.
func (h *mqttHook) OnPublish(cl *mqtt.Client, pk packets.Packet) (packets.Packet, error) {
	if v, ok := h.b.conns.Load(cl); ok {
		v.(*mqttConn).receive(pk.Payload)
	}
	return pk, packets.ErrRejectPacket
}

// OnDisconnect ends the session of a closed connection.
func (h *mqttHook) OnDisconnect(cl *mqtt.Client, err error, _ bool) {
	v, ok := h.b.conns.LoadAndDelete(cl)
	if !ok {
		return
	}
	c := v.(*mqttConn)
	cause, reason := c.endReason(err)
	c.closing.CompareAndSwap(nil, &closeInfo{cause: cause, reason: reason})
	if c.sess.id != "" {
		c.sess.end(cause, reason, &wire.Fault{Code: wire.FaultDisconnected, Message: "device session ended: " + reason})
	}
	c.stopVoice()
	if c.admitted {
		h.b.hub.conns.Done()
	}
}

// mqttConn is the MQTT transport of one session. Its goroutines are the
// broker's (a reader and a writer per client); it adds none while idle.
type mqttConn struct {
	b        *mqttBroker
	cl       *mqtt.Client
	sess     *session
	topic    string // devices/p2p/<mac_>
	admitted bool   // counted in hub.conns; set before the reader runs

	queued  atomic.Int32
	closing atomic.Pointer[closeInfo]

	voiceMu sync.Mutex
	voice   *time.Timer // the pending goodbye of an open voice session
}

// receive processes one publish from the device.
func (c *mqttConn) receive(payload []byte) {
	s := c.sess
	if s.id == "" || c.closing.Load() != nil {
		return
	}
	if max := c.b.hub.cfg.MQTTMaxPayload; len(payload) > max {
		c.refuseOversized(payload, max)
		return
	}
	if err := s.handleFrame(payload); err != nil {
		c.close(causeMalformed, "malformed publish: "+err.Error())
	}
}

// refuseOversized fails the call an oversized response answers with
// PAYLOAD_TOO_LARGE; the session stays (the device cannot send that much over MQTT
// anyway, so it is a misbehaving emulator or a broken build).
func (c *mqttConn) refuseOversized(payload []byte, max int) {
	s := c.sess
	f, err := xzproto.ParseFrame(payload)
	if err == nil && f.Type == "mcp" && f.Payload != nil {
		if msg, err := xzproto.ParseMessage(f.Payload); err == nil && msg.Kind == xzproto.KindResponse && msg.NumOK {
			if s.mcp.Fail(msg.NumID, &wire.Fault{Code: wire.FaultTooLarge,
				Message: fmt.Sprintf("device response of %d bytes exceeds the MQTT payload limit of %d", len(payload), max)}) {
				return
			}
		}
	}
	s.hub.log.Warn("devicehub: oversized MQTT publish dropped", append(s.logAttrs(), "bytes", len(payload), "limit", max)...)
}

// Send writes one JSON-RPC message in the XiaoZhi envelope. A message over
// MQTTMaxPayload is refused with PAYLOAD_TOO_LARGE and the session stays.
func (c *mqttConn) Send(payload []byte) error {
	frame := xzproto.AppendMCPFrame(make([]byte, 0, len(payload)+64), c.sess.id, payload)
	if max := c.b.hub.cfg.MQTTMaxPayload; len(frame) > max {
		return &wire.Fault{Code: wire.FaultTooLarge, Message: fmt.Sprintf("request of %d bytes exceeds the MQTT payload limit of %d", len(frame), max)}
	}
	return c.publish(frame)
}

// publish writes one PUBLISH (QoS 0) onto the device's connection. The
// connection bounds each write with WriteTimeout (deviceConn).
func (c *mqttConn) publish(payload []byte) error {
	if c.closing.Load() != nil {
		return errClosing
	}
	if int(c.queued.Add(1)) > c.b.hub.cfg.WriteQueue {
		c.queued.Add(-1)
		c.close(causeSlow, "slow consumer: write queue full")
		return errSlowConsumer
	}
	defer c.queued.Add(-1)
	err := c.cl.WritePacket(packets.Packet{
		FixedHeader: packets.FixedHeader{Type: packets.Publish},
		TopicName:   c.topic,
		Payload:     payload,
	})
	if err != nil {
		if isTimeout(err) {
			c.close(causeSlow, "slow consumer: write timed out")
		} else {
			c.close(causeDevice, "write failed")
		}
	}
	return err
}

// answerHello opens a voice session: the hello reply carries the UDP sink
// with a fresh key and nonce, then (after GoodbyeAfter) a goodbye with the
// same session id returns the device to idle, since the hub has no audio
// pipeline.
func (c *mqttConn) answerHello(frame []byte) {
	s := c.sess
	if _, err := xzproto.ParseHello(frame); err != nil {
		s.hub.log.Debug("devicehub: unreadable hello ignored", append(s.logAttrs(), "err", err)...)
		return
	}
	u := xzproto.UDPEndpoint{Server: c.udpHost(), Port: c.b.udpPort()}
	_, _ = rand.Read(u.Key[:])
	_, _ = rand.Read(u.Nonce[:])
	if c.publish(xzproto.ServerHelloUDP(s.id, u)) != nil {
		return
	}
	after := s.hub.cfg.GoodbyeAfter
	if after == 0 {
		_ = c.publish(xzproto.Goodbye(s.id))
		return
	}
	c.voiceMu.Lock()
	defer c.voiceMu.Unlock()
	if c.voice != nil {
		c.voice.Stop()
	}
	c.voice = time.AfterFunc(after, func() {
		c.voiceMu.Lock()
		c.voice = nil
		c.voiceMu.Unlock()
		_ = c.publish(xzproto.Goodbye(s.id))
	})
}

// deviceGoodbye: the device closed its voice session; nothing to answer.
func (c *mqttConn) deviceGoodbye(string) { c.stopVoice() }

func (c *mqttConn) stopVoice() {
	c.voiceMu.Lock()
	defer c.voiceMu.Unlock()
	if c.voice != nil {
		c.voice.Stop()
		c.voice = nil
	}
}

// udpHost is the udp.server of a hello: the configured public host, the
// UDP listen host when specific, else the address the device reached.
func (c *mqttConn) udpHost() string {
	if h := c.b.hub.cfg.UDPPublicHost; h != "" {
		return h
	}
	if a, ok := c.b.udp.LocalAddr().(*net.UDPAddr); ok && !a.IP.IsUnspecified() {
		return a.IP.String()
	}
	if c.cl.Net.Conn != nil {
		if host, _, err := net.SplitHostPort(c.cl.Net.Conn.LocalAddr().String()); err == nil {
			return host
		}
	}
	return "127.0.0.1"
}

// close records why the session ends and closes the connection; the
// broker's reader then ends and OnDisconnect ends the session.
func (c *mqttConn) close(cause endCause, reason string) {
	if len(reason) > 120 {
		reason = reason[:120]
	}
	c.closing.CompareAndSwap(nil, &closeInfo{cause: cause, reason: reason})
	c.closeConn()
}

func (c *mqttConn) closeConn() { c.cl.Stop(errClosing) }

// endReason explains why the broker's reader ended: our own close first.
func (c *mqttConn) endReason(err error) (endCause, string) {
	if ci := c.closing.Load(); ci != nil {
		return ci.cause, ci.reason
	}
	if cause := c.cl.StopCause(); cause != nil && errors.Is(cause, packets.ErrSessionTakenOver) {
		return causeReplaced, "replaced by a newer session"
	}
	switch {
	case err == nil:
		return causeDevice, "closed by device (DISCONNECT)"
	case isTimeout(err):
		return causeIdle, "idle for 1.5 × keepalive (" + (time.Duration(c.cl.State.Keepalive) * time.Second * 3 / 2).String() + ")"
	case errors.Is(err, packets.ErrPacketTooLarge):
		return causeTooLarge, "packet larger than the limit"
	}
	return causeDevice, "connection lost"
}

// deviceListener is the broker's TCP (optionally TLS) listener. Its
// connections bound every write with writeTimeout and the wait for CONNECT
// with helloTimeout; the broker's keepalive deadline then governs reads.
type deviceListener struct {
	addr         string
	tlsConfig    *tls.Config
	helloTimeout time.Duration
	writeTimeout time.Duration

	ln     net.Listener
	closed atomic.Bool
}

func (l *deviceListener) ID() string       { return "xiaozhi-mqtt" }
func (l *deviceListener) Protocol() string { return "tcp" }

func (l *deviceListener) Address() string {
	if l.ln != nil {
		return l.ln.Addr().String()
	}
	return l.addr
}

func (l *deviceListener) Init(*slog.Logger) error {
	ln, err := net.Listen("tcp", l.addr)
	if err != nil {
		return err
	}
	if l.tlsConfig != nil {
		ln = tls.NewListener(ln, l.tlsConfig)
	}
	l.ln = ln
	return nil
}

func (l *deviceListener) Serve(establish listeners.EstablishFn) {
	for {
		conn, err := l.ln.Accept()
		if err != nil {
			if l.closed.Load() || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		_ = conn.SetReadDeadline(time.Now().Add(l.helloTimeout))
		go func() { _ = establish(l.ID(), &deviceConn{Conn: conn, writeTimeout: l.writeTimeout}) }()
	}
}

func (l *deviceListener) Close(closeClients listeners.CloseFn) {
	if l.closed.CompareAndSwap(false, true) {
		closeClients(l.ID())
		if l.ln != nil {
			l.ln.Close()
		}
	}
}

// deviceConn bounds each write by writeTimeout, and lets the broker's
// keepalive deadline apply to reads only.
type deviceConn struct {
	net.Conn
	writeTimeout time.Duration
}

func (c *deviceConn) SetDeadline(t time.Time) error { return c.Conn.SetReadDeadline(t) }

func (c *deviceConn) Write(p []byte) (int, error) {
	_ = c.Conn.SetWriteDeadline(time.Now().Add(c.writeTimeout))
	return c.Conn.Write(p)
}

// minLevel drops log records below its level.
type minLevel struct {
	slog.Handler
	level slog.Level
}

func (m minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= m.level && m.Handler.Enabled(ctx, l)
}

func (m minLevel) WithAttrs(a []slog.Attr) slog.Handler {
	return minLevel{m.Handler.WithAttrs(a), m.level}
}
func (m minLevel) WithGroup(n string) slog.Handler { return minLevel{m.Handler.WithGroup(n), m.level} }

func truncateLog(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
