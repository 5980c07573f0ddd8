package devicehub

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"
	"unique"

	"github.com/coder/websocket"

	"github.com/xiaoclaw/xiaoclaw/pkg/deviceauth"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/devicehub/internal/xzproto"
)

// Buffer sizes of a device WebSocket. net/http would keep 4 KiB for reading
// and 4 KiB for writing per hijacked connection; device frames are small
// (Opus packets, short JSON), and larger ones bypass a bufio buffer anyway,
// so small buffers cost a few more syscalls on big frames and save most of
// 8 KiB per idle session.
const (
	wsReadBuffer  = 512
	wsWriteBuffer = 512
	authTimeout   = 5 * time.Second
)

// admitWebSocket returns the client address of a WebSocket upgrade (a
// device's or an MCP endpoint's), or answers 429 and false while the
// address is throttled for failed authentication.
func (h *hub) admitWebSocket(w http.ResponseWriter, r *http.Request) (remoteIP string, ok bool) {
	remoteIP = r.RemoteAddr
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		remoteIP = host
	}
	if wait := h.throttled(wire.TransportWebSocket, remoteIP); wait > 0 {
		tooManyFailures(w, wait)
		return "", false
	}
	return remoteIP, true
}

// serveWebSocket authenticates the upgrade request, accepts the WebSocket
// and hands it to a goroutine of its own, so that net/http's connection
// goroutine (and its larger stack) ends right away.
func (h *hub) serveWebSocket(w http.ResponseWriter, r *http.Request) {
	remoteIP, ok := h.admitWebSocket(w, r)
	if !ok {
		return
	}
	creds, err := xzproto.ParseCredentials(r.Header, r.URL.Query())
	if err != nil {
		h.authFailed(wire.TransportWebSocket, creds.DeviceID, creds.ClientID, remoteIP, err.Error())
		h.refuse(w, http.StatusUnauthorized, "devicehub: device refused", "remote_ip", remoteIP, "device_id", creds.DeviceID, "reason", err.Error())
		return
	}
	device, err := wire.CanonicalDevice(creds.DeviceID)
	if err != nil {
		h.authFailed(wire.TransportWebSocket, creds.DeviceID, creds.ClientID, remoteIP, "invalid device id")
		h.refuse(w, http.StatusUnauthorized, "devicehub: device refused", "remote_ip", remoteIP, "device_id", creds.DeviceID, "reason", "invalid device id")
		return
	}
	tenant, ok := h.authenticateWebSocket(w, r, deviceauth.Credentials{
		Transport: wire.TransportWebSocket, Token: creds.Token, DeviceID: creds.DeviceID,
		ClientID: creds.ClientID, RemoteAddr: r.RemoteAddr,
	}, device, remoteIP, "devicehub: device refused")
	if !ok {
		return
	}
	h.serveSession(w, r, false, deviceKey{tenant, device}, creds.DeviceID, creds.ClientID, remoteIP)
}

// serveSession upgrades an authenticated request to the WebSocket of a
// session and runs it: a XiaoZhi device's (hello first) or, plain, an MCP
// endpoint tool host's (one bare JSON-RPC message per frame).
func (h *hub) serveSession(w http.ResponseWriter, r *http.Request, plain bool, key deviceKey, deviceRaw, clientID, remoteIP string) {
	if !h.admit() {
		writeJSONError(w, http.StatusServiceUnavailable, "shutting down")
		return
	}
	c := &wsConn{hub: h, plain: plain}
	ws, err := websocket.Accept(&smallBufferHijacker{ResponseWriter: w, c: c}, r, &websocket.AcceptOptions{
		// Devices and tool hosts authenticate with a token, never with
		// cookies, so a foreign Origin (browser test clients) is no CSRF risk.
		InsecureSkipVerify: true,
		CompressionMode:    websocket.CompressionDisabled,
		OnPingReceived:     func(context.Context, []byte) bool { c.touch(); return true },
	})
	if err != nil || c.raw == nil {
		h.conns.Done()
		h.log.Debug("devicehub: upgrade failed", "remote_ip", remoteIP, "device", key.device, "plain", plain, "err", err)
		return
	}
	ws.SetReadLimit(int64(h.cfg.MaxFrameBytes))
	c.ws = ws
	s := &session{
		hub: h, key: key, deviceRaw: deviceRaw, clientID: clientID,
		remoteIP: remoteIP, userAgent: r.UserAgent(), transport: wire.TransportWebSocket, conn: c,
	}
	if len(s.userAgent) > 256 {
		s.userAgent = s.userAgent[:256]
	}
	c.sess = s
	go c.run()
}

func (h *hub) refuse(w http.ResponseWriter, status int, msg string, attrs ...any) {
	h.log.Warn(msg, attrs...)
	w.Header().Set("WWW-Authenticate", `Bearer realm="xiaoclaw devicehub"`)
	writeJSONError(w, status, "unauthorized")
}

func writeJSONError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	b, _ := json.Marshal(map[string]string{"error": msg})
	_, _ = w.Write(append(b, '\n'))
}

// wsConn is the XiaoZhi WebSocket transport of one session.
//
// Memory per idle session matters (thousands per replica), so a session
// has exactly one goroutine, the reader (run), and no timers of its own:
//   - the pre-hello and idle limits are read deadlines on the TCP
//     connection (the runtime's per-connection poller timers);
//   - between frames the reader waits in a shallow Peek on the buffered
//     reader rather than deep inside the WebSocket library, so the garbage
//     collector can shrink its stack back to a few KiB;
//   - writes take the library's frame lock under a write deadline, with no
//     writer goroutine or queue buffer;
//   - ending the session from elsewhere interrupts the reader with a past
//     read deadline, and the reader itself sends the close frame, so only
//     one goroutine ever reads the connection.
type wsConn struct {
	hub  *hub
	ws   *websocket.Conn
	raw  net.Conn      // the hijacked TCP connection
	br   *bufio.Reader // the WebSocket library reads through it too
	sess *session
	// plain: an MCP endpoint connection (endpoint.go): no hello, one bare
	// JSON-RPC message per text frame instead of the XiaoZhi envelope.
	plain bool

	helloed atomic.Bool
	queued  atomic.Int32
	closing atomic.Pointer[closeInfo] // why we close, first wins
}

type closeInfo struct {
	cause  endCause
	reason string
	code   websocket.StatusCode // 0: closed without a close frame
}

// aLongTimeAgo is a read deadline in the past: it wakes the reader at once.
var aLongTimeAgo = time.Unix(1, 0)

// touch extends the idle deadline; called for every frame and ping.
func (c *wsConn) touch() {
	if c.helloed.Load() && c.closing.Load() == nil {
		_ = c.raw.SetReadDeadline(time.Now().Add(c.hub.cfg.IdleTimeout))
	}
}

// run is the session's only goroutine. It stays small: the handshake and
// each frame's handling happen in callees that return before the reader
// waits again, so the stack in use while idle is shallow (see wsConn).
func (c *wsConn) run() {
	defer c.hub.conns.Done()
	if !c.handshake() {
		return
	}
	var err error
	for err == nil {
		if err = c.waitFrame(); err == nil {
			err = c.readFrame()
		}
	}
	c.ended(err)
}

// handshake reads the hello, answers it and registers the session; on
// failure it closes the connection and returns false.
func (c *wsConn) handshake() bool {
	h := c.hub
	s := c.sess
	if c.plain {
		return c.startEndpoint()
	}
	_ = c.raw.SetReadDeadline(time.Now().Add(h.cfg.HelloTimeout))
	frame, hello, err := c.readHello()
	if err != nil {
		cause, reason := c.endReason(err)
		if isTimeout(err) && c.closing.Load() == nil {
			cause, reason = causeIdle, "no hello within "+h.cfg.HelloTimeout.String()
		}
		c.close(cause, reason)
		c.finish()
		h.log.Info("devicehub: connection closed before hello", "tenant", s.key.tenant, "device", s.key.device, "reason", reason)
		return false
	}
	c.helloed.Store(true)
	c.touch()

	s.id = h.newSessionID()
	s.startedMs = nowMs()
	s.hello = unique.Make(string(frame))
	s.hasMCP = hello.MCP
	s.mcp.Init(c, h.cfg.MaxInFlight)

	if err := c.writeText(xzproto.ServerHello(s.id)); err != nil {
		c.close(causeDevice, "server hello not sent")
		c.finish()
		return false
	}
	if err := h.attach(s); err != nil {
		h.log.Warn("devicehub: session not registered", append(s.logAttrs(), "err", err)...)
		c.close(causeRefused, "session not registered")
		c.finish()
		return false
	}
	h.log.Info("devicehub: session started", append(s.logAttrs(), "remote_ip", s.remoteIP, "client_id", s.clientID, "mcp", s.hasMCP)...)
	s.startMCP()
	return true
}

// ended closes the session after the read error err.
func (c *wsConn) ended(err error) {
	cause, reason := c.endReason(err)
	c.close(cause, reason)
	c.sess.end(cause, reason, &wire.Fault{Code: wire.FaultDisconnected, Message: "device session ended: " + reason})
	c.finish()
}

// waitFrame blocks until the next frame starts to arrive (or the read
// deadline passes), in as shallow a stack as possible.
//
//go:noinline
func (c *wsConn) waitFrame() error {
	_, err := c.br.Peek(1)
	return err
}

// finish runs on the reader once the session is over: it sends the close
// frame when one is due and releases the connection.
func (c *wsConn) finish() {
	ci := c.closing.Load()
	if ci == nil || ci.code == 0 {
		c.ws.CloseNow()
		return
	}
	// The close handshake reads the device's answer; give it its own deadline.
	_ = c.raw.SetReadDeadline(time.Now().Add(5 * time.Second))
	_ = c.raw.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if err := c.ws.Close(ci.code, ci.reason); err != nil {
		c.ws.CloseNow()
	}
}

// readHello reads frames until the first text frame, which must be a hello.
func (c *wsConn) readHello() ([]byte, xzproto.Hello, error) {
	for {
		typ, r, err := c.ws.Reader(context.Background())
		if err != nil {
			return nil, xzproto.Hello{}, err
		}
		if typ == websocket.MessageBinary {
			if _, err := io.Copy(io.Discard, r); err != nil {
				return nil, xzproto.Hello{}, err
			}
			continue
		}
		frame, err := io.ReadAll(r)
		if err != nil {
			return nil, xzproto.Hello{}, err
		}
		hello, err := xzproto.ParseHello(frame)
		if err != nil {
			return nil, xzproto.Hello{}, err
		}
		return frame, hello, nil
	}
}

// readFrame reads and handles the frame that started to arrive; binary
// (audio) frames are discarded without being buffered.
//
//go:noinline
func (c *wsConn) readFrame() error {
	if c.closing.Load() != nil {
		return errClosing
	}
	typ, r, err := c.ws.Reader(context.Background())
	if err != nil {
		return err
	}
	c.touch()
	if typ == websocket.MessageBinary {
		_, err := io.Copy(io.Discard, r)
		return err
	}
	frame, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if c.plain {
		c.sess.handleMCP(frame)
		return nil
	}
	return c.sess.handleFrame(frame)
}

var errClosing = errors.New("session closing")

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// endReason explains a read error: our own close first, then the device's.
func (c *wsConn) endReason(err error) (endCause, string) {
	if ci := c.closing.Load(); ci != nil {
		return ci.cause, ci.reason
	}
	switch {
	case isTimeout(err):
		return causeIdle, "idle for " + c.hub.cfg.IdleTimeout.String()
	case errors.Is(err, websocket.ErrMessageTooBig):
		return causeTooLarge, "frame larger than the limit"
	case errors.Is(err, xzproto.ErrMalformed):
		return causeMalformed, "malformed frame: " + err.Error()
	}
	if code := websocket.CloseStatus(err); code != -1 {
		return causeDevice, "closed by device (" + code.String() + ")"
	}
	return causeDevice, "connection lost"
}

// Send writes one JSON-RPC message in the XiaoZhi envelope.
func (c *wsConn) Send(payload []byte) error {
	if c.plain {
		return c.writeText(payload)
	}
	return c.writeText(xzproto.AppendMCPFrame(make([]byte, 0, len(payload)+64), c.sess.id, payload))
}

var errSlowConsumer = errors.New("device is a slow consumer")

func (c *wsConn) writeText(frame []byte) error {
	if int(c.queued.Add(1)) > c.hub.cfg.WriteQueue {
		c.queued.Add(-1)
		c.close(causeSlow, "slow consumer: write queue full")
		return errSlowConsumer
	}
	defer c.queued.Add(-1)
	// Every writer pushes the deadline out, so it bounds how long the
	// device may stall, not one frame's wait for the lock.
	_ = c.raw.SetWriteDeadline(time.Now().Add(c.hub.cfg.WriteTimeout))
	err := c.ws.Write(context.Background(), websocket.MessageText, frame)
	if err != nil {
		// A failed write may have left half a frame: the stream is unusable.
		if isTimeout(err) {
			c.close(causeSlow, "slow consumer: write timed out")
		} else {
			c.close(causeDevice, "write failed")
		}
	}
	return err
}

func (c *wsConn) answerHello([]byte) {
	_ = c.writeText(xzproto.ServerHello(c.sess.id))
}

// close records why the session ends and stops the connection: a close
// with a status is left to the reader (woken by a past read deadline),
// which sends the close frame; otherwise the socket closes at once.
func (c *wsConn) close(cause endCause, reason string) {
	var code websocket.StatusCode
	switch cause {
	case causeShutdown:
		code = websocket.StatusGoingAway
	case causeMalformed:
		code = websocket.StatusInvalidFramePayloadData
	case causeTooLarge:
		code = websocket.StatusMessageTooBig
	case causeRefused:
		code = websocket.StatusTryAgainLater
	case causeReplaced, causeIdle:
		code = websocket.StatusNormalClosure
	}
	if len(reason) > 120 {
		reason = reason[:120]
	}
	if !c.closing.CompareAndSwap(nil, &closeInfo{cause, reason, code}) {
		return
	}
	if code == 0 {
		c.ws.CloseNow()
		return
	}
	_ = c.raw.SetReadDeadline(aLongTimeAgo)
}

// smallBufferHijacker hands coder/websocket small bufio buffers instead of
// net/http's 4 KiB pair, which would otherwise live as long as the session,
// and keeps the TCP connection and reader for the session's own use.
type smallBufferHijacker struct {
	http.ResponseWriter
	c *wsConn
}

func (w *smallBufferHijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("response writer cannot be hijacked")
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	br := bufio.NewReaderSize(conn, wsReadBuffer)
	if n := brw.Reader.Buffered(); n > 0 {
		// Bytes the client sent right after its request: they must sit in
		// the new reader's buffer, where the caller looks for them (it
		// replaces the reader's source).
		b, _ := brw.Reader.Peek(n)
		br = bufio.NewReaderSize(io.MultiReader(bytes.NewReader(bytes.Clone(b)), conn), max(wsReadBuffer, n))
		if _, err := br.Peek(n); err != nil {
			conn.Close()
			return nil, nil, err
		}
	}
	w.c.raw, w.c.br = conn, br
	return conn, bufio.NewReadWriter(br, bufio.NewWriterSize(conn, wsWriteBuffer)), nil
}

// authenticateWebSocket asks the Authenticator about a WebSocket door's
// credentials (device is their canonical device id) and answers the refusals
// itself: 401 (refused is the log message), 429 past the device id's failure
// budget, 503 when authentication is unavailable. ok reports a tenant to
// serve.
func (h *hub) authenticateWebSocket(w http.ResponseWriter, r *http.Request, creds deviceauth.Credentials, device, remoteIP, refused string) (tenant string, ok bool) {
	ctx, cancel := context.WithTimeout(r.Context(), authTimeout)
	tenant, err := h.cfg.Auth.AuthenticateDevice(ctx, creds)
	cancel()
	switch {
	case errors.Is(err, deviceauth.ErrUnauthenticated):
		if wait := h.authFailed(wire.TransportWebSocket, device, creds.ClientID, remoteIP, "unauthenticated"); wait > 0 {
			h.log.Warn(refused+", too many failures for its id", "remote_ip", remoteIP, "device", device)
			tooManyFailures(w, wait)
			return "", false
		}
		h.refuse(w, http.StatusUnauthorized, refused, "remote_ip", remoteIP, "device", device, "reason", "unauthenticated")
		return "", false
	case err != nil:
		h.log.Error("devicehub: device authentication failed", "remote_ip", remoteIP, "device", device, "err", err)
		writeJSONError(w, http.StatusServiceUnavailable, "authentication unavailable")
		return "", false
	case wire.ValidTenant(tenant) != nil:
		h.log.Error("devicehub: authenticator returned an invalid tenant", "device", device, "tenant", tenant)
		writeJSONError(w, http.StatusServiceUnavailable, "authentication unavailable")
		return "", false
	}
	return tenant, true
}
