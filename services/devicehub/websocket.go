package devicehub

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
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

// serveWebSocket authenticates the upgrade request, accepts the WebSocket
// and hands it to a goroutine of its own, so that net/http's connection
// goroutine (and its larger stack) ends right away.
func (h *hub) serveWebSocket(w http.ResponseWriter, r *http.Request) {
	remoteIP := r.RemoteAddr
	if host, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		remoteIP = host
	}
	creds, err := xzproto.ParseCredentials(r.Header, r.URL.Query())
	if err != nil {
		h.refuse(w, http.StatusUnauthorized, "devicehub: device refused", "remote_ip", remoteIP, "device_id", creds.DeviceID, "reason", err.Error())
		return
	}
	device, err := wire.CanonicalDevice(creds.DeviceID)
	if err != nil {
		h.refuse(w, http.StatusUnauthorized, "devicehub: device refused", "remote_ip", remoteIP, "device_id", creds.DeviceID, "reason", "invalid device id")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), authTimeout)
	tenant, err := h.cfg.Auth.AuthenticateDevice(ctx, deviceauth.Credentials{
		Transport: wire.TransportWebSocket, Token: creds.Token, DeviceID: creds.DeviceID,
		ClientID: creds.ClientID, RemoteAddr: r.RemoteAddr,
	})
	cancel()
	switch {
	case errors.Is(err, deviceauth.ErrUnauthenticated):
		h.refuse(w, http.StatusUnauthorized, "devicehub: device refused", "remote_ip", remoteIP, "device", device, "reason", "unauthenticated")
		return
	case err != nil:
		h.log.Error("devicehub: device authentication failed", "remote_ip", remoteIP, "device", device, "err", err)
		writeJSONError(w, http.StatusServiceUnavailable, "authentication unavailable")
		return
	case wire.ValidTenant(tenant) != nil:
		h.log.Error("devicehub: authenticator returned an invalid tenant", "device", device, "tenant", tenant)
		writeJSONError(w, http.StatusServiceUnavailable, "authentication unavailable")
		return
	}
	if !h.admit() {
		writeJSONError(w, http.StatusServiceUnavailable, "shutting down")
		return
	}
	c := &wsConn{hub: h}
	ws, err := websocket.Accept(smallBufferHijacker{w}, r, &websocket.AcceptOptions{
		// Devices authenticate with a bearer token, never with cookies, so a
		// foreign Origin (browser test clients) is no CSRF risk.
		InsecureSkipVerify: true,
		CompressionMode:    websocket.CompressionDisabled,
		OnPingReceived:     func(context.Context, []byte) bool { c.touch(); return true },
	})
	if err != nil {
		h.conns.Done()
		h.log.Debug("devicehub: upgrade failed", "remote_ip", remoteIP, "device", device, "err", err)
		return
	}
	ws.SetReadLimit(int64(h.cfg.MaxFrameBytes))
	c.ws = ws
	s := &session{
		hub: h, key: deviceKey{tenant, device}, deviceRaw: creds.DeviceID, clientID: creds.ClientID,
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
	_, _ = io.WriteString(w, `{"error":"`+msg+`"}`+"\n")
}

// wsConn is the XiaoZhi WebSocket transport of one session. Its only
// goroutine is the reader (run); writes take coder/websocket's frame lock
// under a deadline, so no writer goroutine or queue buffer is needed.
type wsConn struct {
	hub  *hub
	ws   *websocket.Conn
	sess *session

	timer   *time.Timer // pre-hello deadline, then idle deadline
	helloed atomic.Bool
	expired atomic.Bool // the timer fired
	queued  atomic.Int32
	closing atomic.Pointer[closeInfo] // why we closed, first wins
}

type closeInfo struct {
	cause  endCause
	reason string
	code   websocket.StatusCode // 0: closed without a close frame
}

func (c *wsConn) touch() {
	if t := c.timer; t != nil && c.helloed.Load() {
		t.Reset(c.hub.cfg.IdleTimeout)
	}
}

func (c *wsConn) run() {
	h := c.hub
	s := c.sess
	defer h.conns.Done()
	defer func() {
		// Unless a close with a status is under way (it closes the socket
		// after the handshake), drop the connection now.
		if ci := c.closing.Load(); ci == nil || ci.code == 0 {
			c.ws.CloseNow()
		}
	}()

	c.timer = time.AfterFunc(h.cfg.HelloTimeout, func() {
		c.expired.Store(true)
		c.ws.CloseNow()
	})
	defer c.timer.Stop()

	frame, hello, err := c.readHello()
	if err != nil {
		cause, reason := c.endReason(err)
		if c.expired.Load() {
			reason = "no hello within " + h.cfg.HelloTimeout.String()
		}
		c.close(cause, reason)
		h.log.Info("devicehub: connection closed before hello", "tenant", s.key.tenant, "device", s.key.device, "reason", reason)
		return
	}
	c.helloed.Store(true)
	c.timer.Reset(h.cfg.IdleTimeout)

	s.id = h.newSessionID()
	s.startedMs = nowMs()
	s.hello = unique.Make(string(frame))
	s.hasMCP = hello.MCP
	s.mcp.Init(c, h.cfg.MaxInFlight)

	if err := c.writeText(xzproto.ServerHello(s.id)); err != nil {
		c.close(causeDevice, "server hello not sent")
		return
	}
	if err := h.attach(s); err != nil {
		h.log.Warn("devicehub: session not registered", append(s.logAttrs(), "err", err)...)
		c.close(causeRefused, "session not registered")
		return
	}
	h.log.Info("devicehub: session started", append(s.logAttrs(), "remote_ip", s.remoteIP, "client_id", s.clientID, "mcp", s.hasMCP)...)
	s.startMCP()

	for {
		err := c.readFrame()
		if err == nil {
			continue
		}
		cause, reason := c.endReason(err)
		s.end(cause, reason, &wire.Fault{Code: wire.FaultDisconnected, Message: "device session ended: " + reason})
		return
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

// readFrame reads and handles one frame; binary (audio) frames are
// discarded without being buffered.
func (c *wsConn) readFrame() error {
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
	return c.sess.handleFrame(frame)
}

// endReason explains a read error: our own close first, then the device's.
func (c *wsConn) endReason(err error) (endCause, string) {
	if ci := c.closing.Load(); ci != nil {
		return ci.cause, ci.reason
	}
	switch {
	case c.expired.Load() && c.helloed.Load():
		return causeIdle, "idle for " + c.hub.cfg.IdleTimeout.String()
	case errors.Is(err, websocket.ErrMessageTooBig):
		return causeTooLarge, "frame larger than the limit"
	case errors.Is(err, xzproto.ErrMalformed):
		c.close(causeMalformed, "malformed frame")
		return causeMalformed, "malformed frame: " + err.Error()
	}
	if code := websocket.CloseStatus(err); code != -1 {
		return causeDevice, "closed by device (" + code.String() + ")"
	}
	return causeDevice, "connection lost"
}

// Send writes one JSON-RPC message in the XiaoZhi envelope.
func (c *wsConn) Send(payload []byte) error {
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
	ctx, cancel := context.WithTimeout(context.Background(), c.hub.cfg.WriteTimeout)
	defer cancel()
	err := c.ws.Write(ctx, websocket.MessageText, frame)
	if err != nil && ctx.Err() != nil {
		c.close(causeSlow, "slow consumer: write timed out")
	}
	return err
}

func (c *wsConn) resendHello() {
	_ = c.writeText(xzproto.ServerHello(c.sess.id))
}

// close records why the session ends and closes the socket: with a close
// frame in the background (the handshake may take a few seconds), or at
// once when the device cannot take frames anyway.
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
	case causeSlow, causeDevice:
	default:
		code = websocket.StatusNormalClosure
	}
	if !c.closing.CompareAndSwap(nil, &closeInfo{cause, reason, code}) {
		return
	}
	if code == 0 {
		c.ws.CloseNow()
		return
	}
	if len(reason) > 120 {
		reason = reason[:120]
	}
	go c.ws.Close(code, reason)
}

// smallBufferHijacker hands coder/websocket small bufio buffers instead of
// net/http's 4 KiB pair, which would otherwise live as long as the session.
type smallBufferHijacker struct{ http.ResponseWriter }

func (w smallBufferHijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
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
	return conn, bufio.NewReadWriter(br, bufio.NewWriterSize(conn, wsWriteBuffer)), nil
}
