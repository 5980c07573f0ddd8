package devicehub

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"
	"unique"

	"github.com/xiaoclaw/xiaoclaw/pkg/deviceauth"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// EndpointPath is the MCP endpoint for tool hosts, compatible with the
// XiaoZhi cloud's 接入点: a program that is an MCP *server* (mcp_pipe,
// xiaozhi-client, ...) dials ws(s)://<hub>/mcp/?token=<token> and the hub
// is its client. Frames are bare JSON-RPC messages, one per text frame.
// Each connection is a node like a device's session.
const EndpointPath = "/mcp/"

// endpointHello is what the session records as its hello: the endpoint
// has none, and operators see the transport it came by.
const endpointHello = `{"type":"hello","transport":"mcp-endpoint","features":{"mcp":true}}`

// serveEndpoint authenticates an endpoint connection by its token and
// runs it as a session.
func (h *hub) serveEndpoint(w http.ResponseWriter, r *http.Request) {
	remoteIP, ok := h.admitWebSocket(w, r)
	if !ok {
		return
	}
	token := r.URL.Query().Get("token")
	if token == "" {
		token, _ = strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	}
	device, devToken, err := deviceauth.ParseEndpointToken(token)
	if err != nil {
		h.authFailed(wire.TransportWebSocket, "", deviceauth.EndpointClientID, remoteIP, err.Error())
		h.refuse(w, http.StatusUnauthorized, "devicehub: MCP endpoint refused", "remote_ip", remoteIP, "reason", err.Error())
		return
	}
	tenant, ok := h.authenticateWebSocket(w, r, deviceauth.Credentials{
		Transport: wire.TransportWebSocket, Token: devToken, DeviceID: device,
		ClientID: deviceauth.EndpointClientID, RemoteAddr: r.RemoteAddr,
	}, device, remoteIP, "devicehub: MCP endpoint refused")
	if !ok {
		return
	}
	h.serveSession(w, r, true, deviceKey{tenant, device}, device, deviceauth.EndpointClientID, remoteIP)
}

// startEndpoint registers an endpoint session at once (there is no hello)
// and starts MCP discovery: the hub sends initialize, the tool host answers.
func (c *wsConn) startEndpoint() bool {
	h, s := c.hub, c.sess
	c.helloed.Store(true)
	c.touch()
	s.id = h.newSessionID()
	s.startedMs = nowMs()
	s.hello = unique.Make(endpointHello)
	s.hasMCP = true
	s.mcp.Init(c, h.cfg.MaxInFlight)
	if err := h.attach(s); err != nil {
		h.log.Warn("devicehub: endpoint session not registered", append(s.logAttrs(), "err", err)...)
		c.close(causeRefused, "session not registered")
		c.finish()
		return false
	}
	h.log.Info("devicehub: MCP endpoint session started", append(s.logAttrs(), "remote_ip", s.remoteIP)...)
	s.startMCP()
	go c.keepEndpointAlive()
	return true
}

// keepEndpointAlive sends an MCP ping every third of IdleTimeout, as the
// XiaoZhi cloud does: tool hosts such as xiaozhi-client send nothing while
// idle and expect the server to probe them. The answer extends the idle
// deadline; a host that does not answer is cut at IdleTimeout as usual.
func (c *wsConn) keepEndpointAlive() {
	interval := c.hub.cfg.IdleTimeout / 3
	t := time.NewTicker(interval)
	defer t.Stop()
	for range t.C {
		if c.closing.Load() != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), interval)
		_, err := c.sess.mcp.Call(ctx, "ping", nil)
		cancel()
		var f *wire.Fault
		if errors.As(err, &f) && f.Code == wire.FaultDisconnected {
			return
		}
	}
}
