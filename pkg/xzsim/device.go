// Package xzsim simulates XiaoZhi ESP32 voice devices as seen from a server:
// the WebSocket upgrade with the firmware's headers, the hello handshake with
// its 10 s wait for the server hello, and the device's MCP server with the
// firmware's quirks (numeric ids only, errors without a code, paged
// tools/list with the next tool's name as cursor, isError always false).
//
// A Device is one simulated board whose state (volume, brightness, theme)
// survives reconnects and can be read by tests; test hooks hold calls,
// drop the connection abruptly and send notifications or raw frames. Fleet
// and Run drive many devices with deterministic identities (MAC and
// Client-Id from a seed and an index), for load tests and `xiaoclaw sim`.
//
// The connection logic sits behind Connect so that other transports (MQTT,
// OTA boot) can be added beside the WebSocket one.
package xzsim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	paho "github.com/eclipse/paho.mqtt.golang"
)

// Defaults of Config.
const (
	DefaultHelloTimeout    = 10 * time.Second // the firmware's wait for the server hello
	DefaultBoardName       = "xiaoclaw-sim"
	DefaultFirmwareVersion = "1.8.9"
)

// Config describes one simulated device.
type Config struct {
	// URL of the server's XiaoZhi WebSocket endpoint, e.g. ws://127.0.0.1:8000/xiaozhi/v1/.
	URL string
	// Token is sent as "Authorization: Bearer <Token>"; empty sends no header.
	Token string
	// MAC is the device id, sent lower-case and colon-separated as Device-Id.
	MAC string
	// ClientID is the Client-Id UUID; defaults to one derived from MAC.
	ClientID string
	// ProtocolVersion is the Protocol-Version header; default 1.
	ProtocolVersion int
	// AuthInQuery sends device-id, client-id and authorization as query
	// parameters instead of headers, as browser clients do.
	AuthInQuery bool
	// NoMCP leaves features.mcp out of the hello.
	NoMCP bool
	// BoardName and FirmwareVersion make up the MCP serverInfo.
	BoardName       string
	FirmwareVersion string
	// ExtraTools adds that many board-style tools after the built-in ones,
	// so the catalog spans several tools/list pages (about 25 per page).
	ExtraTools int
	// Latency delays every tools/call reply.
	Latency time.Duration
	// HelloTimeout bounds the wait for the server hello; default 10 s.
	HelloTimeout time.Duration
	// Log receives the device's diagnostics; nil discards them.
	Log *slog.Logger
	// HTTPClient dials the WebSocket and posts OTA requests; nil makes one
	// per device. With a client of your own, Drop falls back to closing
	// without a close frame at the WebSocket layer.
	HTTPClient *http.Client

	// Transport is TransportWebSocket (default) or TransportMQTT; with
	// OTAURL the OTA reply decides instead, as on the firmware.
	Transport string
	// MQTT is the broker connection of the MQTT transport, as an OTA mqtt
	// section carries it.
	MQTT MQTTConfig
	// OTAURL, when set, makes Connect boot like the firmware: POST the OTA
	// request, run the activation loop while the reply carries an
	// activation, then use the mqtt section if present, else the websocket
	// one. URL, Token and MQTT are then ignored.
	OTAURL string
	// ActivationPoll is the wait between activation polls while the server
	// answers 202 (the firmware waits 3 s; other answers wait 3 × as long).
	ActivationPoll time.Duration
	// WrapActivation sends the /activate body as {"Payload":{…}}, as some
	// clients do.
	WrapActivation bool
	// MCP, when set, replaces the simulated board's MCP server: every MCP
	// payload the server sends (requests, notifications, responses) goes
	// to it verbatim, from the connection's reader; answers go out with
	// SendMCP. Tool hosts built on this package's transports use it.
	MCP func(payload []byte)
}

func (c *Config) setDefaults() {
	if c.ProtocolVersion == 0 {
		c.ProtocolVersion = 1
	}
	if c.BoardName == "" {
		c.BoardName = DefaultBoardName
	}
	if c.FirmwareVersion == "" {
		c.FirmwareVersion = DefaultFirmwareVersion
	}
	if c.HelloTimeout <= 0 {
		c.HelloTimeout = DefaultHelloTimeout
	}
	if c.Transport == "" {
		c.Transport = TransportWebSocket
	}
	if c.ActivationPoll <= 0 {
		c.ActivationPoll = 3 * time.Second
	}
	if c.MQTT.Keepalive <= 0 {
		c.MQTT.Keepalive = DefaultMQTTKeepalive
	}
	if c.MQTT.PublishTopic == "" {
		c.MQTT.PublishTopic = DefaultPublishTopic
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	c.MAC = strings.ToLower(c.MAC)
	if c.ClientID == "" {
		c.ClientID = uuidFrom([]byte("xzsim-client-id:" + c.MAC))
	}
}

// Validate reports a configuration that cannot connect.
func (c Config) Validate() error {
	switch {
	case c.OTAURL != "":
		u, err := url.Parse(c.OTAURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("xzsim: OTAURL %q is not an http:// or https:// URL", c.OTAURL)
		}
	case c.Transport == TransportMQTT:
		if _, _, err := net.SplitHostPort(c.MQTT.Endpoint); err != nil && c.MQTT.Endpoint == "" {
			return fmt.Errorf("xzsim: MQTT.Endpoint is required for the MQTT transport")
		}
		if c.MQTT.ClientID == "" {
			return fmt.Errorf("xzsim: MQTT.ClientID is required for the MQTT transport")
		}
	case c.Transport == TransportWebSocket || c.Transport == "":
		u, err := url.Parse(c.URL)
		if err != nil || (u.Scheme != "ws" && u.Scheme != "wss" && u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("xzsim: URL %q is not a ws:// or wss:// URL", c.URL)
		}
	default:
		return fmt.Errorf("xzsim: unknown transport %q", c.Transport)
	}
	if _, err := net.ParseMAC(c.MAC); err != nil || len(c.MAC) != 17 {
		return fmt.Errorf("xzsim: MAC %q is not of the form aa:bb:cc:dd:ee:ff", c.MAC)
	}
	if c.ExtraTools < 0 || c.ExtraTools > 10000 {
		return fmt.Errorf("xzsim: ExtraTools must be 0-10000")
	}
	return nil
}

// HandshakeError is returned by Connect when the server refused the
// WebSocket upgrade with an HTTP status.
type HandshakeError struct {
	StatusCode int
	Body       string
}

func (e *HandshakeError) Error() string {
	return fmt.Sprintf("xzsim: upgrade refused: HTTP %d %s", e.StatusCode, strings.TrimSpace(e.Body))
}

// ErrHelloTimeout is returned by Connect when no server hello arrived in time.
var ErrHelloTimeout = errors.New("xzsim: server hello timeout")

// Device is one simulated XiaoZhi board. It holds at most one connection at
// a time; its state survives reconnects. All methods are safe for concurrent use.
type Device struct {
	cfg     Config
	catalog *catalog

	mu         sync.Mutex
	volume     int
	brightness int
	theme      string
	extra      map[int]int
	latency    time.Duration
	gate       chan struct{} // non-nil while calls are held
	listGate   chan struct{} // non-nil while tools/list answers are held
	requests   map[string]int
	lastParams map[string]json.RawMessage
	conn       *connection
	audio      *audioChannel // the open voice session over MQTT, if any
	goodbyes   int           // server goodbyes honoured
	activation string        // the activation code shown, while activating
	otaReply   json.RawMessage

	held  atomic.Int64
	calls atomic.Int64
}

// NewDevice validates cfg and returns a disconnected device.
func NewDevice(cfg Config) (*Device, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = newDialClient()
	}
	return newDevice(cfg, newCatalog(cfg.ExtraTools)), nil
}

func newDevice(cfg Config, c *catalog) *Device {
	return &Device{
		cfg: cfg, catalog: c,
		volume: 70, brightness: 75, theme: "light",
		latency:    cfg.Latency,
		requests:   make(map[string]int),
		lastParams: make(map[string]json.RawMessage),
	}
}

// MAC returns the device id as the device sends it.
func (d *Device) MAC() string { return d.cfg.MAC }

// ClientID returns the Client-Id the device sends.
func (d *Device) ClientID() string { return d.cfg.ClientID }

// Volume returns the speaker volume (0-100; 70 at power-on).
func (d *Device) Volume() int { d.mu.Lock(); defer d.mu.Unlock(); return d.volume }

// Brightness returns the screen brightness (0-100; 75 at power-on).
func (d *Device) Brightness() int { d.mu.Lock(); defer d.mu.Unlock(); return d.brightness }

// Theme returns the screen theme ("light" at power-on).
func (d *Device) Theme() string { d.mu.Lock(); defer d.mu.Unlock(); return d.theme }

// ExtraValue returns the value last stored by extra tool i (1-based).
func (d *Device) ExtraValue(i int) int { d.mu.Lock(); defer d.mu.Unlock(); return d.extra[i] }

// Requests returns how many MCP requests with method the device accepted
// (dropped messages do not count).
func (d *Device) Requests(method string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.requests[method]
}

// LastParams returns the params of the last accepted request with method.
func (d *Device) LastParams(method string) json.RawMessage {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastParams[method]
}

// Calls returns how many tools/call requests the device has finished.
func (d *Device) Calls() int64 { return d.calls.Load() }

// SetLatency changes the delay of every later tools/call reply.
func (d *Device) SetLatency(l time.Duration) { d.mu.Lock(); d.latency = l; d.mu.Unlock() }

// Hold makes every tools/call wait before it runs until release is called
// (or the connection ends). Held reports how many calls are waiting.
func (d *Device) Hold() (release func()) {
	gate := make(chan struct{})
	d.mu.Lock()
	d.gate = gate
	d.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			d.mu.Lock()
			if d.gate == gate {
				d.gate = nil
			}
			d.mu.Unlock()
			close(gate)
		})
	}
}

// HoldToolsList makes every tools/list answer wait until release is called
// (or the connection ends), like a board slow to list its tools after a
// reconnect.
func (d *Device) HoldToolsList() (release func()) {
	gate := make(chan struct{})
	d.mu.Lock()
	d.listGate = gate
	d.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			d.mu.Lock()
			if d.listGate == gate {
				d.listGate = nil
			}
			d.mu.Unlock()
			close(gate)
		})
	}
}

// SetExtraTools changes the catalog to the built-in tools plus n extra
// ones, as a firmware update would; tell the server with Notify
// ("notifications/tools/list_changed").
func (d *Device) SetExtraTools(n int) {
	c := newCatalog(n)
	d.mu.Lock()
	d.catalog = c
	d.mu.Unlock()
}

// Held returns how many tools/call requests are waiting on Hold.
func (d *Device) Held() int { return int(d.held.Load()) }

// statusJSON renders self.get_device_status like a Wi-Fi board does.
func (d *Device) statusJSON() jsonText {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, _ := json.Marshal(map[string]any{
		"audio_speaker": map[string]any{"volume": d.volume},
		"screen":        map[string]any{"brightness": d.brightness, "theme": d.theme},
		"battery":       map[string]any{"level": 87, "charging": false},
		"network":       map[string]any{"type": "wifi", "ssid": "xiaoclaw-sim", "signal": "strong"},
		"chip":          map[string]any{"temperature": 41.5},
	})
	return jsonText(b)
}

// connection is one session of a device, over WebSocket or MQTT.
type connection struct {
	d         *Device
	transport string
	ws        *websocket.Conn // WebSocket
	mq        paho.Client     // MQTT
	pubTopic  string          // MQTT uplink topic
	raw       net.Conn        // the TCP connection, for abrupt drops
	sessionID atomic.Pointer[string]
	hello     atomic.Pointer[json.RawMessage] // the last accepted server hello
	helloMu   sync.Mutex
	helloWait chan json.RawMessage // set while a hello is awaited
	done      chan struct{}
	doneOnce  sync.Once
	err       error // why the connection ended; set before done is closed
}

func (c *connection) finish(err error) {
	c.doneOnce.Do(func() {
		c.err = err
		close(c.done)
	})
}

type netConnSlot struct{ c net.Conn }
type netConnSlotKey struct{}

// newDialClient returns an HTTP client for WebSocket upgrades that records
// the TCP connection it dials, so that Drop can cut it without a close frame.
func newDialClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{Timeout: 10 * time.Second}).DialContext(ctx, network, addr)
			if slot, ok := ctx.Value(netConnSlotKey{}).(*netConnSlot); ok && err == nil {
				slot.c = c
			}
			return c, err
		},
		MaxIdleConnsPerHost: -1,
	}}
}

// Connect opens a session like the firmware. With OTAURL it first boots
// through OTA (activation loop included) and uses the transport the reply
// names, MQTT when present. Over WebSocket it upgrades with the device
// headers, sends the hello, waits for the server hello (at most
// HelloTimeout) and sends "listen start". Over MQTT it connects to the
// broker (MQTT 3.1.1, no subscription) and stays idle: a voice session
// opens only with OpenAudio. It returns once the session is up; the
// device then serves MCP in the background until the connection ends (see
// Done). Connect fails if the device is already connected.
func (d *Device) Connect(ctx context.Context) error {
	d.mu.Lock()
	if c := d.conn; c != nil {
		select {
		case <-c.done:
		default:
			d.mu.Unlock()
			return errors.New("xzsim: device already connected")
		}
	}
	d.mu.Unlock()

	p := connectParams{transport: d.cfg.Transport, url: d.cfg.URL, token: d.cfg.Token, mqtt: d.cfg.MQTT}
	if d.cfg.OTAURL != "" {
		var err error
		if p, err = d.bootOTA(ctx); err != nil {
			return err
		}
	}
	if p.transport == TransportMQTT {
		return d.connectMQTT(ctx, p.mqtt)
	}
	return d.connectWebSocket(ctx, p.url, p.token)
}

// connectParams is where and how to connect: from Config or from OTA.
type connectParams struct {
	transport  string
	url, token string
	mqtt       MQTTConfig
}

func (d *Device) connectWebSocket(ctx context.Context, wsURL, token string) error {
	u, hdr := d.upgradeRequest(wsURL, token)
	slot := &netConnSlot{}
	dialCtx, cancel := context.WithTimeout(context.WithValue(ctx, netConnSlotKey{}, slot), d.cfg.HelloTimeout)
	defer cancel()
	ws, resp, err := websocket.Dial(dialCtx, u, &websocket.DialOptions{
		HTTPClient: d.cfg.HTTPClient, HTTPHeader: hdr, CompressionMode: websocket.CompressionDisabled,
	})
	if err != nil {
		if resp != nil && resp.StatusCode != http.StatusSwitchingProtocols {
			body := ""
			if resp.Body != nil {
				b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
				body = string(b)
			}
			return &HandshakeError{StatusCode: resp.StatusCode, Body: body}
		}
		return fmt.Errorf("xzsim: dial %s: %w", wsURL, err)
	}
	ws.SetReadLimit(1 << 20)
	c := &connection{d: d, transport: TransportWebSocket, ws: ws, raw: slot.c, done: make(chan struct{})}
	d.mu.Lock()
	d.conn = c
	d.mu.Unlock()
	helloCh := c.expectHello()
	go c.readLoop()

	if err := c.write(dialCtx, d.helloFrame()); err != nil {
		c.ws.CloseNow()
		<-c.done
		return fmt.Errorf("xzsim: send hello: %w", err)
	}
	if _, err := c.awaitHello(ctx, helloCh); err != nil {
		c.ws.CloseNow()
		<-c.done
		return err
	}
	sid := c.SessionID()
	listen, _ := json.Marshal(map[string]string{"session_id": sid, "type": "listen", "state": "start", "mode": "auto"})
	if err := c.write(ctx, listen); err != nil {
		return fmt.Errorf("xzsim: send listen: %w", err)
	}
	d.cfg.Log.Debug("xzsim: connected", "mac", d.cfg.MAC, "session_id", sid)
	return nil
}

// expectHello arms the wait for the next acceptable server hello.
func (c *connection) expectHello() <-chan json.RawMessage {
	ch := make(chan json.RawMessage, 1)
	c.helloMu.Lock()
	c.helloWait = ch
	c.helloMu.Unlock()
	return ch
}

// awaitHello waits HelloTimeout for the hello armed by expectHello.
func (c *connection) awaitHello(ctx context.Context, ch <-chan json.RawMessage) (json.RawMessage, error) {
	timer := time.NewTimer(c.d.cfg.HelloTimeout)
	defer timer.Stop()
	select {
	case h := <-ch:
		return h, nil
	case <-timer.C:
		return nil, ErrHelloTimeout
	case <-c.done:
		return nil, fmt.Errorf("xzsim: connection ended before the server hello: %w", c.err)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (d *Device) upgradeRequest(wsURL, token string) (string, http.Header) {
	auth := ""
	if token != "" {
		auth = token
		if !strings.Contains(auth, " ") {
			auth = "Bearer " + auth
		}
	}
	hdr := http.Header{}
	u := wsURL
	if d.cfg.AuthInQuery {
		q := url.Values{}
		q.Set("device-id", d.cfg.MAC)
		q.Set("client-id", d.cfg.ClientID)
		if auth != "" {
			q.Set("authorization", auth)
		}
		sep := "?"
		if strings.Contains(u, "?") {
			sep = "&"
		}
		u += sep + q.Encode()
	} else {
		if auth != "" {
			hdr.Set("Authorization", auth)
		}
		hdr.Set("Device-Id", d.cfg.MAC)
		hdr.Set("Client-Id", d.cfg.ClientID)
	}
	hdr.Set("Protocol-Version", fmt.Sprint(d.cfg.ProtocolVersion))
	return u, hdr
}

func (d *Device) helloFrame() []byte {
	features := map[string]bool{"aec": false}
	if !d.cfg.NoMCP {
		features["mcp"] = true
	}
	b, _ := json.Marshal(map[string]any{
		"type": "hello", "version": d.cfg.ProtocolVersion, "features": features, "transport": "websocket",
		"audio_params": map[string]any{"format": "opus", "sample_rate": 16000, "channels": 1, "frame_duration": 60},
	})
	return b
}

func (d *Device) current() (*connection, error) {
	d.mu.Lock()
	c := d.conn
	d.mu.Unlock()
	if c == nil {
		return nil, errors.New("xzsim: device not connected")
	}
	return c, nil
}

// Done is closed when the current connection ends; a closed channel when
// the device never connected.
func (d *Device) Done() <-chan struct{} {
	c, err := d.current()
	if err != nil {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	return c.done
}

// Err returns why the current connection ended (nil while it is up).
func (d *Device) Err() error {
	c, err := d.current()
	if err != nil {
		return err
	}
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

// CloseStatus returns the WebSocket close code the server sent when it
// ended the current connection, or -1 (also for MQTT).
func (d *Device) CloseStatus() websocket.StatusCode {
	c, err := d.current()
	if err != nil || c.ws == nil {
		return -1
	}
	select {
	case <-c.done:
		return websocket.CloseStatus(c.err)
	default:
		return -1
	}
}

// Transport returns the transport of the current connection ("" before
// the first).
func (d *Device) Transport() string {
	c, err := d.current()
	if err != nil {
		return ""
	}
	return c.transport
}

// SessionID returns the session id from the last server hello.
func (d *Device) SessionID() string {
	c, err := d.current()
	if err != nil {
		return ""
	}
	return c.SessionID()
}

// ServerHello returns the last server hello of the current connection.
func (d *Device) ServerHello() json.RawMessage {
	c, err := d.current()
	if err != nil {
		return nil
	}
	if h := c.hello.Load(); h != nil {
		return *h
	}
	return nil
}

// Close ends the connection normally (WebSocket close, MQTT DISCONNECT)
// and waits for it.
func (d *Device) Close() error {
	c, err := d.current()
	if err != nil {
		return nil
	}
	if c.mq != nil {
		select {
		case <-c.done:
		default:
			c.mq.Disconnect(250)
			c.finish(nil)
		}
		return nil
	}
	err = c.ws.Close(websocket.StatusNormalClosure, "bye")
	<-c.done
	return err
}

// Drop closes the TCP connection abruptly, without a WebSocket close frame
// or MQTT DISCONNECT, as a device losing power or Wi-Fi does.
func (d *Device) Drop() {
	c, err := d.current()
	if err != nil {
		return
	}
	switch {
	case c.raw != nil:
		c.raw.Close()
	case c.ws != nil:
		c.ws.CloseNow()
	}
	if c.mq != nil {
		// paho takes a socket closed under it for its own Disconnect and
		// reports nothing: stop it (the DISCONNECT cannot go out any more).
		c.mq.Disconnect(0)
		c.finish(errDropped)
	}
	<-c.done
}

var errDropped = errors.New("xzsim: connection dropped")

// Notify sends an MCP notification (a JSON-RPC message without id).
func (d *Device) Notify(ctx context.Context, method string, params json.RawMessage) error {
	msg := map[string]any{"jsonrpc": "2.0", "method": method}
	if len(params) > 0 {
		msg["params"] = params
	}
	payload, err := json.Marshal(msg)
	if err != nil {
		return err
	}
	c, err := d.current()
	if err != nil {
		return err
	}
	return c.write(ctx, c.mcpFrame(payload))
}

// SendMCP sends one JSON-RPC message in the XiaoZhi mcp envelope.
func (d *Device) SendMCP(ctx context.Context, payload []byte) error {
	c, err := d.current()
	if err != nil {
		return err
	}
	return c.write(ctx, c.mcpFrame(payload))
}

// Ping sends a WebSocket ping and waits for the pong; over MQTT the
// client's keepalive does this and Ping returns nil at once. It keeps a
// session that sends nothing else from ending at the server's idle limit.
func (d *Device) Ping(ctx context.Context) error {
	c, err := d.current()
	if err != nil {
		return err
	}
	if c.ws == nil {
		return nil
	}
	return c.ws.Ping(ctx)
}

// SendText sends one raw text frame (MQTT: one publish), e.g. a malformed one.
func (d *Device) SendText(ctx context.Context, frame []byte) error {
	c, err := d.current()
	if err != nil {
		return err
	}
	return c.write(ctx, frame)
}

// SendBinary sends one binary frame, as the firmware does with Opus audio
// (WebSocket only).
func (d *Device) SendBinary(ctx context.Context, frame []byte) error {
	c, err := d.current()
	if err != nil {
		return err
	}
	if c.ws == nil {
		return errors.New("xzsim: binary frames exist on WebSocket only")
	}
	return c.ws.Write(ctx, websocket.MessageBinary, frame)
}

func (c *connection) SessionID() string {
	if p := c.sessionID.Load(); p != nil {
		return *p
	}
	return ""
}

func (c *connection) write(ctx context.Context, frame []byte) error {
	if c.mq != nil {
		return c.publish(ctx, frame)
	}
	return c.ws.Write(ctx, websocket.MessageText, frame)
}

// mcpFrame wraps a JSON-RPC payload in the XiaoZhi envelope.
func (c *connection) mcpFrame(payload []byte) []byte {
	sid, _ := json.Marshal(c.SessionID())
	b := make([]byte, 0, len(payload)+len(sid)+40)
	b = append(b, `{"session_id":`...)
	b = append(b, sid...)
	b = append(b, `,"type":"mcp","payload":`...)
	b = append(b, payload...)
	return append(b, '}')
}

func (c *connection) readLoop() {
	for {
		typ, frame, err := c.ws.Read(context.Background())
		if err != nil {
			c.d.cfg.Log.Debug("xzsim: connection ended", "mac", c.d.cfg.MAC, "err", err)
			c.finish(err)
			return
		}
		if typ != websocket.MessageText {
			continue // the firmware would play it as Opus audio
		}
		c.handleFrame(frame)
	}
}

// handleFrame processes one JSON message from the server as the firmware
// does: messages without a type are dropped, a hello for this transport
// sets the session (over MQTT only with a complete udp block), a goodbye
// with the current session id closes the voice session, mcp goes to the
// MCP server, everything else is ignored.
func (c *connection) handleFrame(frame []byte) {
	var msg struct {
		Type      string          `json:"type"`
		Transport string          `json:"transport"`
		SessionID *string         `json:"session_id"`
		Payload   json.RawMessage `json:"payload"`
	}
	if json.Unmarshal(frame, &msg) != nil || msg.Type == "" {
		return
	}
	switch msg.Type {
	case "hello":
		if c.transport == TransportMQTT {
			if _, err := ParseUDPHello(frame); err != nil {
				c.d.cfg.Log.Debug("xzsim: server hello ignored", "mac", c.d.cfg.MAC, "err", err)
				return
			}
		} else if msg.Transport != "websocket" {
			return // the firmware ignores a hello for another transport
		}
		c.helloMu.Lock()
		wait := c.helloWait
		c.helloWait = nil
		c.helloMu.Unlock()
		if wait == nil {
			return // not waiting for one: the firmware ignores it
		}
		sid := ""
		if msg.SessionID != nil {
			sid = *msg.SessionID
		}
		c.sessionID.Store(&sid)
		h := append(json.RawMessage(nil), frame...)
		c.hello.Store(&h)
		wait <- h
	case "goodbye":
		if c.transport == TransportMQTT && msg.SessionID != nil && *msg.SessionID == c.SessionID() {
			c.d.closeAudio(true)
		}
	case "mcp":
		if h := c.d.cfg.MCP; h != nil {
			h(msg.Payload)
			return
		}
		c.handleMCP(msg.Payload)
	}
}

func (c *connection) handleMCP(payload []byte) {
	req, ok := parseRequest(payload)
	if !ok {
		return
	}
	reply, call := c.d.respond(req)
	d := c.d
	if call == nil {
		d.mu.Lock()
		listGate := d.listGate
		d.mu.Unlock()
		if req.method != "tools/list" || listGate == nil {
			c.reply(reply)
			return
		}
		go func() {
			select {
			case <-listGate:
				c.reply(reply)
			case <-c.done:
			}
		}()
		return
	}
	d.mu.Lock()
	gate, latency := d.gate, d.latency
	d.mu.Unlock()
	if gate == nil && latency == 0 {
		c.finishCall(req.id, call)
		return
	}
	go func() {
		if gate != nil {
			d.held.Add(1)
			select {
			case <-gate:
			case <-c.done:
			}
			d.held.Add(-1)
		}
		if latency > 0 {
			timer := time.NewTimer(latency)
			select {
			case <-timer.C:
			case <-c.done:
				timer.Stop()
			}
		}
		c.finishCall(req.id, call)
	}()
}

// toolCall is a validated tools/call waiting to run.
type toolCall struct {
	tool *tool
	args args
}

// respond handles one accepted request like the firmware: it returns the
// reply, or for a valid tools/call the call to run (the firmware runs it
// later on its main loop).
func (d *Device) respond(req rpcRequest) ([]byte, *toolCall) {
	d.mu.Lock()
	d.requests[req.method]++
	if p, err := json.Marshal(req.params); err == nil {
		d.lastParams[req.method] = p
	}
	cat := d.catalog
	d.mu.Unlock()

	switch req.method {
	case "initialize":
		info, _ := json.Marshal(map[string]string{"name": d.cfg.BoardName, "version": d.cfg.FirmwareVersion})
		return replyResult(req.id, []byte(`{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":`+string(info)+`}`)), nil
	case "tools/list":
		var cursor string
		if raw, ok := req.params["cursor"]; ok && len(raw) > 0 && raw[0] == '"' {
			_ = json.Unmarshal(raw, &cursor)
		}
		withUser := string(req.params["withUserTools"]) == "true"
		page, errMsg := cat.toolsPage(cursor, withUser)
		if errMsg != "" {
			return replyError(req.id, errMsg), nil
		}
		return replyResult(req.id, page), nil
	case "tools/call":
		return d.prepareCall(req, cat)
	default:
		return replyError(req.id, "Method not implemented: "+req.method), nil
	}
}

func (d *Device) prepareCall(req rpcRequest, cat *catalog) ([]byte, *toolCall) {
	if req.params == nil {
		return replyError(req.id, "Missing params"), nil
	}
	var name string
	if raw := req.params["name"]; len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &name) != nil {
		return replyError(req.id, "Missing name"), nil
	}
	var rawArgs map[string]json.RawMessage
	if raw, ok := req.params["arguments"]; ok && string(raw) != "null" {
		if raw[0] != '{' || json.Unmarshal(raw, &rawArgs) != nil {
			return replyError(req.id, "Invalid arguments"), nil
		}
	}
	t, ok := cat.byName[name]
	if !ok {
		return replyError(req.id, "Unknown tool: "+name), nil
	}
	a, err := t.bind(rawArgs)
	if err != nil {
		return replyError(req.id, err.Error()), nil
	}
	return nil, &toolCall{tool: t, args: a}
}

// run executes a validated call and renders its reply.
func (d *Device) run(id int64, call *toolCall) []byte {
	result, err := call.tool.run(d, call.args)
	d.calls.Add(1)
	if err != nil {
		return replyError(id, err.Error())
	}
	return replyResult(id, callResult(result))
}

func (c *connection) finishCall(id int64, call *toolCall) {
	c.reply(c.d.run(id, call))
}

func (c *connection) reply(payload []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.write(ctx, c.mcpFrame(payload)); err != nil {
		c.d.cfg.Log.Debug("xzsim: reply not sent", "mac", c.d.cfg.MAC, "err", err)
	}
}
