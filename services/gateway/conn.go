package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
	"github.com/xiaoclaw/xiaoclaw/pkg/authguard"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/protocol"
)

// outQueueLen bounds a connection's queue of unsent frames; a client that
// lets it fill (or exceeds MaxBufferedBytes) is a slow consumer and is
// disconnected. The queue holds slice headers only: 12 KiB per connection.
const outQueueLen = 512

// maxCloseReason is the longest close reason a close frame can carry.
const maxCloseReason = 123

// conn is one client WebSocket. A read loop (the HTTP handler goroutine)
// parses and dispatches frames; one writer goroutine sends everything, so
// NATS callbacks and invoke goroutines never block on a slow socket.
type conn struct {
	s        *Service
	ws       *websocket.Conn
	id       string // connId
	remoteIP string
	local    bool
	nonce    string
	ctx      context.Context
	cancel   context.CancelFunc

	out       chan []byte // frames to send; a nil frame asks for the close below
	closeCode websocket.StatusCode
	closeMsg  string
	queued    atomic.Int64 // bytes queued and not yet written
	closing   atomic.Bool  // a close was requested: queue no more frames
	writeAt   atomic.Int64 // unix ns when the current write started, 0 when idle
	writeDone chan struct{}
	seq       atomic.Int64 // per-connection event sequence

	// Set once at hello, read-only afterwards (published by helloDone).
	helloDone atomic.Bool
	protocol  int
	role      string
	principal access.Principal
	scopes    scopeSet
	token     string // the credential, to re-check it when the tenancy changes
	nodeID    string // role node: the device id
	nodeHost  *nodeHost
	inflight  atomic.Int64 // requests running off the read loop (admit)

	unauthorizedStreak int  // read loop only
	slotHeld           bool // counted in perToken and perTenant (under s.mu)
}

// takeConnSlot counts an authenticated connection against the caps of its
// token and tenant on this replica, or returns the refusal.
func (s *Service) takeConnSlot(c *conn) *protocol.Error {
	p := c.principal
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.perToken[p.ID] >= s.cfg.MaxConnsPerToken:
		return protocol.TooManyConnections("token", s.cfg.MaxConnsPerToken)
	case s.perTenant[p.Tenant] >= s.cfg.MaxConnsPerTenant:
		return protocol.TooManyConnections("tenant", s.cfg.MaxConnsPerTenant)
	}
	s.perToken[p.ID]++
	s.perTenant[p.Tenant]++
	c.slotHeld = true
	return nil
}

// serveWebSocket accepts a client and runs its read loop.
func (s *Service) serveWebSocket(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		http.Error(w, "this is the xiaoclaw gateway: connect with an OpenClaw WebSocket client", http.StatusUpgradeRequired)
		return
	}
	if s.draining.Load() {
		http.Error(w, "gateway shutting down", http.StatusServiceUnavailable)
		return
	}
	ws, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		OriginPatterns:  s.cfg.OriginPatterns,
		CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		s.log.Debug("websocket accept", "err", err)
		return
	}
	// The read loop enforces both caps (pre-auth and MaxPayload) with a
	// close reason that names them; the library limit is a backstop.
	ws.SetReadLimit(s.cfg.MaxPayload + 1)
	host := authguard.ClientAddr(r, s.cfg.TrustedProxies)
	ip := net.ParseIP(host)
	ctx, cancel := context.WithCancel(context.Background())
	c := &conn{
		s:         s,
		ws:        ws,
		id:        newUUID(),
		remoteIP:  host,
		local:     ip != nil && ip.IsLoopback(),
		nonce:     newUUID(),
		ctx:       ctx,
		cancel:    cancel,
		out:       make(chan []byte, outQueueLen),
		writeDone: make(chan struct{}),
	}
	s.mu.Lock()
	if s.draining.Load() {
		s.mu.Unlock()
		cancel()
		ws.Close(protocol.CloseServiceRestart, protocol.ReasonServiceRestart)
		return
	}
	s.conns[c] = struct{}{}
	s.connWG.Add(1)
	s.mu.Unlock()
	defer s.connWG.Done()

	go c.writeLoop()
	c.sendEvent(protocol.EventConnectChallenge, protocol.Challenge(c.nonce, time.Now().UnixMilli()))
	handshake := time.AfterFunc(s.cfg.HandshakeTimeout, func() {
		if !c.helloDone.Load() {
			s.log.Debug("handshake timeout", "conn", c.id, "remote", c.remoteIP)
			c.closeWith(protocol.ClosePolicyViolation, protocol.ReasonHandshakeTimeout+": no connect within "+s.cfg.HandshakeTimeout.String())
		}
	})
	c.readLoop()
	handshake.Stop()
	c.finish()
}

// readLoop reads frames until the socket ends or a close is requested.
func (c *conn) readLoop() {
	var buf bytes.Buffer
	for !c.closing.Load() {
		_, r, err := c.ws.Reader(c.ctx)
		if err != nil {
			return
		}
		buf.Reset()
		if !c.helloDone.Load() {
			n, err := buf.ReadFrom(io.LimitReader(r, protocol.MaxPreauthPayload+1))
			if n > protocol.MaxPreauthPayload {
				c.closeWith(protocol.CloseTooBig, protocol.ReasonPreauthTooLarge)
				return
			}
			if err != nil {
				return
			}
		} else {
			n, err := buf.ReadFrom(io.LimitReader(r, c.s.cfg.MaxPayload+1))
			if n > c.s.cfg.MaxPayload {
				c.s.log.Info("closing connection: frame over maxPayload", "conn", c.id, "remote", c.remoteIP)
				c.closeWith(protocol.CloseTooBig, protocol.ReasonPayloadTooLarge+": frame over "+strconv.FormatInt(c.s.cfg.MaxPayload, 10)+" bytes (policy.maxPayload)")
				return
			}
			if err != nil {
				return
			}
		}
		c.handleFrame(buf.Bytes())
		if buf.Cap() > 1<<20 {
			buf = bytes.Buffer{} // do not pin a large frame's memory
		}
	}
}

// finish runs when the read loop ends: it stops the writer and releases
// everything the connection held.
func (c *conn) finish() {
	if c.closing.Swap(true) {
		// A close was requested: let the writer finish the close handshake.
		t := time.NewTimer(6 * time.Second)
		select {
		case <-c.writeDone:
		case <-t.C:
		}
		t.Stop()
	}
	c.cancel()
	c.ws.CloseNow()
	<-c.writeDone
	s := c.s
	s.mu.Lock()
	delete(s.conns, c)
	if c.slotHeld {
		s.perToken[c.principal.ID]--
		if s.perToken[c.principal.ID] == 0 {
			delete(s.perToken, c.principal.ID)
		}
		s.perTenant[c.principal.Tenant]--
		if s.perTenant[c.principal.Tenant] == 0 {
			delete(s.perTenant, c.principal.Tenant)
		}
	}
	if c.role == protocol.RoleOperator && c.helloDone.Load() {
		if set := s.operators[c.principal.Tenant]; set != nil {
			delete(set, c)
			if len(set) == 0 {
				delete(s.operators, c.principal.Tenant)
			}
		}
	}
	s.mu.Unlock()
	if c.nodeHost != nil {
		s.detachNodeHost(c)
	}
}

// writeLoop sends queued frames until a close request or the end of the
// connection.
func (c *conn) writeLoop() {
	defer close(c.writeDone)
	for {
		select {
		case <-c.ctx.Done():
			return
		case f := <-c.out:
			if f == nil {
				c.writeAt.Store(time.Now().UnixNano())
				_ = c.ws.Close(c.closeCode, c.closeMsg)
				c.cancel()
				return
			}
			c.writeAt.Store(time.Now().UnixNano())
			err := c.ws.Write(c.ctx, websocket.MessageText, f)
			c.writeAt.Store(0)
			c.queued.Add(-int64(len(f)))
			if err != nil {
				c.cancel()
				c.ws.CloseNow()
				return
			}
		}
	}
}

// send queues a frame. It never blocks: a client whose backlog exceeds the
// limits is closed as a slow consumer. It reports whether the frame was
// queued.
func (c *conn) send(frame []byte) bool {
	if c.closing.Load() {
		return false
	}
	if c.queued.Add(int64(len(frame))) > c.s.cfg.MaxBufferedBytes {
		c.queued.Add(-int64(len(frame)))
		c.slowConsumer()
		return false
	}
	select {
	case c.out <- frame:
		return true
	default:
		c.queued.Add(-int64(len(frame)))
		c.slowConsumer()
		return false
	}
}

// slowConsumer drops a client that does not read its frames. It never
// blocks: the socket write may be stuck, so the close runs on its own.
func (c *conn) slowConsumer() {
	if c.closing.Swap(true) {
		return
	}
	c.s.log.Info("closing slow consumer", "conn", c.id, "remote", c.remoteIP)
	go func() {
		_ = c.ws.Close(protocol.ClosePolicyViolation, protocol.ReasonSlowConsumer)
		c.cancel()
	}()
}

// closeWith closes the connection after the frames queued before it.
func (c *conn) closeWith(code int, reason string) {
	if len(reason) > maxCloseReason {
		reason = truncateUTF8(reason, maxCloseReason)
	}
	if c.closing.Swap(true) {
		return
	}
	// Written before the marker is queued: the channel orders it before
	// the writer's read.
	c.closeCode, c.closeMsg = websocket.StatusCode(code), reason
	select {
	case c.out <- nil:
	default:
		c.cancel()
		c.ws.CloseNow()
	}
}

func truncateUTF8(s string, n int) string {
	for n > 0 && n < len(s) && s[n]&0xc0 == 0x80 {
		n--
	}
	return s[:n]
}

// admit counts a request that runs off the read loop (node.invoke, and the
// listings, which ask the policy) against the connection's requests in
// flight; the request's goroutine gives it back with inflight.Add(-1). At
// MaxInflightPerConn a request is still taken, to be refused (overCap); a
// client that keeps sending at twice the cap is closed, which bounds what
// one connection can make the gateway hold. ok is false when the
// connection is being closed.
func (c *conn) admit() (overCap, ok bool) {
	max := int64(c.s.cfg.MaxInflightPerConn)
	n := c.inflight.Add(1)
	if n > 2*max {
		c.inflight.Add(-1)
		c.s.log.Info("closing connection: too many requests in flight", "conn", c.id, "remote", c.remoteIP)
		c.closeWith(protocol.ClosePolicyViolation, protocol.ReasonTooManyInflight)
		return false, false
	}
	return n > max, true
}

// goHandle runs a handler that may wait on another service (the policy
// store) on a goroutine, so the read loop stays free for the next frame.
func (c *conn) goHandle(handle func(*conn, protocol.Request), req protocol.Request) {
	overCap, ok := c.admit()
	if !ok {
		return
	}
	if overCap {
		c.inflight.Add(-1)
		c.respondError(req.ID, protocol.Unavailable("too many requests in flight on this connection", true))
		return
	}
	c.s.workers.Go(func() {
		defer c.inflight.Add(-1)
		handle(c, req)
	})
}

// respond queues a successful response.
func (c *conn) respond(id string, payload []byte) {
	c.send(protocol.AppendResponse(make([]byte, 0, len(payload)+len(id)+48), id, payload))
}

// respondError queues an error response.
func (c *conn) respondError(id string, e *protocol.Error) {
	c.send(protocol.AppendErrorResponse(make([]byte, 0, 128+len(e.Message)+len(e.Details)), id, e))
}

// sendEvent queues an event with the connection's next seq.
func (c *conn) sendEvent(event string, payload []byte) bool {
	seq := int64(protocol.NoSeq)
	if event != protocol.EventConnectChallenge {
		seq = c.seq.Add(1)
	}
	return c.send(protocol.AppendEvent(make([]byte, 0, len(payload)+len(event)+48), event, payload, seq))
}

// failHandshake answers the connect request and closes the socket.
func (c *conn) failHandshake(id string, e *protocol.Error, code int, reason string) {
	c.respondError(id, e)
	c.closeWith(code, reason)
}

// newUUID returns a random RFC 4122 version 4 UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var out [36]byte
	hex.Encode(out[0:8], b[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], b[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], b[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], b[8:10])
	out[23] = '-'
	hex.Encode(out[24:], b[10:])
	return string(out[:])
}

// newID returns 16 random hex characters.
func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// tickLoop sends tick events and cuts connections whose socket write has
// stalled for two tick intervals.
func (s *Service) tickLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.TickInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			payload := protocol.Tick(now.UnixMilli())
			stall := now.Add(-2 * s.cfg.TickInterval).UnixNano()
			s.mu.RLock()
			for c := range s.conns {
				if at := c.writeAt.Load(); at != 0 && at < stall {
					c.slowConsumer()
					continue
				}
				if c.helloDone.Load() {
					c.sendEvent(protocol.EventTick, payload)
				}
			}
			s.mu.RUnlock()
		}
	}
}
