// Package occlient is a client of the OpenClaw gateway protocol (v3/v4) for
// operators: it waits for the connect challenge, connects with a token (and,
// optionally, a signed Ed25519 device identity as the stock CLI does), sends
// requests concurrently over one WebSocket and delivers events. The xiaoclaw
// CLI, the end-to-end tests and the load command use it against xiaoclaw's
// gateway; it works against any gateway that speaks the protocol. Open,
// Request and SendRaw give protocol tests the frames themselves; SignDevice
// and the signature payloads are shared with the gateway's verifier.
package occlient

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// Options configure a connection.
type Options struct {
	URL   string // ws://127.0.0.1:18789 or wss://…
	Token string
	// Password is the gateway's shared password, sent instead of a token.
	Password string
	// TLS configures a wss:// connection (a private CA, or no verification
	// for a self-signed test gateway); nil uses the system roots.
	TLS    *tls.Config
	Role   string   // default "operator"
	Scopes []string // default operator.read + operator.write
	// Identity signs the connect request when set.
	Identity ed25519.PrivateKey
	// ClientID and Mode default to "cli"/"cli".
	ClientID, Mode, Version, Platform string
	// Protocol range; default 3..4.
	MinProtocol, MaxProtocol int
	// Node host claims (role "node"): client.displayName, client.deviceFamily
	// (signed into the v3 device proof), client.instanceId (random when
	// empty), caps and commands.
	DisplayName, DeviceFamily, InstanceID string
	Caps, Commands                        []string
	// DiscardHello drops the hello-ok payload after the handshake (Hello
	// returns nil): a real gateway's lists of methods and events weigh
	// about 15 KB, too much to keep per connection when there are many.
	DiscardHello bool
	// OnEvent receives every event frame after the handshake (tick excluded).
	// It runs on the read loop: keep it short.
	OnEvent func(Event)
	// OnClose runs once on the read loop's goroutine after the connection
	// ended and Done is closed, with the error Err returns; a caller can
	// react to the end without a goroutine of its own waiting on Done.
	OnClose func(error)
	// OnFrame receives every event frame after the challenge, ticks
	// included, as sent: for protocol tests. It runs on the read loop.
	OnFrame func(Frame)
	// HTTPHeader is sent with the WebSocket upgrade (e.g. X-Forwarded-For);
	// HTTPClient, when set, makes it (e.g. from a chosen local address; TLS
	// is then its transport's business).
	HTTPHeader http.Header
	HTTPClient *http.Client
}

// Event is a server event frame.
type Event struct {
	Event   string          `json:"event"`
	Payload json.RawMessage `json:"payload,omitempty"`
	Seq     int64           `json:"seq,omitempty"`
}

// Error is an error answer of the gateway.
type Error struct {
	Code         string          `json:"code"`
	Message      string          `json:"message"`
	Details      json.RawMessage `json:"details,omitempty"`
	Retryable    bool            `json:"retryable,omitempty"`
	RetryAfterMs int64           `json:"retryAfterMs,omitempty"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// DetailCode returns details.code, if any.
func (e *Error) DetailCode() string {
	var d struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(e.Details, &d)
	return d.Code
}

// Frame is a frame the gateway sent, decoded; Raw holds its bytes.
type Frame struct {
	Type    string          `json:"type"`
	ID      string          `json:"id,omitempty"`
	OK      bool            `json:"ok,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
	Error   *Error          `json:"error,omitempty"`
	Event   string          `json:"event,omitempty"`
	Seq     *int64          `json:"seq,omitempty"`
	Raw     []byte          `json:"-"`
}

// Challenge is the connect.challenge payload.
type Challenge struct {
	Nonce string `json:"nonce"`
	Ts    int64  `json:"ts"`
}

type request struct {
	Type   string `json:"type"`
	ID     string `json:"id"`
	Method string `json:"method"`
	Params any    `json:"params,omitempty"`
}

type result struct {
	frame Frame
	err   error
}

// Client is one authenticated gateway connection.
type Client struct {
	lastFrame atomic.Int64 // unix ms of the last frame read, ticks included
	conn      *websocket.Conn
	opts      Options
	challenge Challenge
	hello     json.RawMessage
	tick      time.Duration
	nextID    atomic.Uint64
	start     sync.Once
	mu        sync.Mutex
	pending   map[string]chan result
	closed    chan struct{}
	err       error
}

// Dial connects and completes the handshake.
func Dial(ctx context.Context, opts Options) (*Client, error) {
	c, err := Open(ctx, opts)
	if err != nil {
		return nil, err
	}
	// The handshake reads its frames itself, before the read loop runs, so
	// a refused connect ends without OnClose.
	if err := c.handshake(ctx); err != nil {
		c.conn.Close(websocket.StatusNormalClosure, "")
		return nil, err
	}
	c.run()
	return c, nil
}

// Open connects and waits for the connect.challenge without connecting:
// the caller sends connect itself (Request), as protocol tests do. Options
// other than URL, HTTP*, OnEvent, OnFrame and OnClose are not used.
func Open(ctx context.Context, opts Options) (*Client, error) {
	if opts.Role == "" {
		opts.Role = "operator"
	}
	if opts.Scopes == nil {
		opts.Scopes = []string{"operator.read", "operator.write"}
	}
	if opts.ClientID == "" {
		opts.ClientID = "cli"
	}
	if opts.Mode == "" {
		opts.Mode = "cli"
	}
	if opts.Version == "" {
		opts.Version = "xiaoclaw"
	}
	if opts.Platform == "" {
		opts.Platform = "linux"
	}
	if opts.MinProtocol == 0 {
		opts.MinProtocol = 3
	}
	if opts.MaxProtocol == 0 {
		opts.MaxProtocol = 4
	}
	dopts := &websocket.DialOptions{
		CompressionMode: websocket.CompressionDisabled, HTTPHeader: opts.HTTPHeader, HTTPClient: opts.HTTPClient,
	}
	if opts.TLS != nil && opts.HTTPClient == nil {
		dopts.HTTPClient = &http.Client{Transport: &http.Transport{TLSClientConfig: opts.TLS, Proxy: http.ProxyFromEnvironment}}
	}
	conn, _, err := websocket.Dial(ctx, opts.URL, dopts)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", opts.URL, err)
	}
	conn.SetReadLimit(32 << 20)
	c := &Client{conn: conn, opts: opts, pending: map[string]chan result{}, closed: make(chan struct{})}
	for {
		var f Frame
		if err := c.readFrame(ctx, &f); err != nil {
			conn.CloseNow()
			return nil, fmt.Errorf("waiting for connect.challenge: %w", err)
		}
		if f.Type == "event" && f.Event == "connect.challenge" {
			if err := json.Unmarshal(f.Payload, &c.challenge); err != nil || c.challenge.Nonce == "" {
				conn.CloseNow()
				return nil, errors.New("connect.challenge without nonce")
			}
			return c, nil
		}
	}
}

// Challenge returns the connect.challenge Open waited for.
func (c *Client) Challenge() Challenge { return c.challenge }

func (c *Client) handshake(ctx context.Context) error {
	instanceID := c.opts.InstanceID
	if instanceID == "" {
		instanceID = randomID()
	}
	client := map[string]any{
		"id": c.opts.ClientID, "version": c.opts.Version, "platform": c.opts.Platform,
		"mode": c.opts.Mode, "instanceId": instanceID,
	}
	if c.opts.DisplayName != "" {
		client["displayName"] = c.opts.DisplayName
	}
	if c.opts.DeviceFamily != "" {
		client["deviceFamily"] = c.opts.DeviceFamily
	}
	caps := c.opts.Caps
	if caps == nil {
		caps = []string{}
	}
	params := map[string]any{
		"minProtocol": c.opts.MinProtocol,
		"maxProtocol": c.opts.MaxProtocol,
		"client":      client,
		"role":        c.opts.Role,
		"scopes":      c.opts.Scopes,
		"caps":        caps,
	}
	if c.opts.Commands != nil {
		params["commands"] = c.opts.Commands
	}
	switch {
	case c.opts.Token != "":
		params["auth"] = map[string]any{"token": c.opts.Token}
	case c.opts.Password != "":
		params["auth"] = map[string]any{"password": c.opts.Password}
	}
	if c.opts.Identity != nil {
		signedAt := c.challenge.Ts
		if signedAt <= 0 {
			signedAt = time.Now().UnixMilli()
		}
		params["device"] = SignDevice(c.opts.Identity, DeviceClaims{
			ClientID: c.opts.ClientID, Mode: c.opts.Mode, Role: c.opts.Role, Scopes: c.opts.Scopes,
			Token: c.opts.Token, Platform: c.opts.Platform, DeviceFamily: c.opts.DeviceFamily,
		}, c.challenge.Nonce, signedAt)
	}
	id := "connect-" + randomID()
	b, _ := json.Marshal(request{Type: "req", ID: id, Method: "connect", Params: params})
	if err := c.conn.Write(ctx, websocket.MessageText, b); err != nil {
		return fmt.Errorf("send connect: %w", err)
	}
	for {
		var f Frame
		if err := c.readFrame(ctx, &f); err != nil {
			return fmt.Errorf("waiting for hello-ok: %w", err)
		}
		if f.Type == "res" && f.ID == id {
			if !f.OK {
				if f.Error != nil {
					return f.Error
				}
				return errors.New("connect refused")
			}
			var h struct {
				Policy struct {
					TickIntervalMs int64 `json:"tickIntervalMs"`
				} `json:"policy"`
			}
			_ = json.Unmarshal(f.Payload, &h)
			c.tick = time.Duration(h.Policy.TickIntervalMs) * time.Millisecond
			if !c.opts.DiscardHello {
				c.hello = f.Payload
			}
			return nil
		}
	}
}

func (c *Client) readFrame(ctx context.Context, f *Frame) error {
	_, b, err := c.conn.Read(ctx)
	if err != nil {
		return err
	}
	c.lastFrame.Store(time.Now().UnixMilli())
	f.Raw = b
	return json.Unmarshal(b, f)
}

// LastFrame returns when the last frame (a tick included) arrived.
func (c *Client) LastFrame() time.Time { return time.UnixMilli(c.lastFrame.Load()) }

// Err returns why the connection ended, once Done is closed; the WebSocket
// close status is in the chain (websocket.CloseStatus, websocket.CloseError).
func (c *Client) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// CloseWith closes the connection with a status code and reason, e.g.
// 4000 "tick timeout".
func (c *Client) CloseWith(code websocket.StatusCode, reason string) error {
	return c.conn.Close(code, reason)
}

// run starts the read loop once: Dial starts it after the handshake, an
// Open connection on its first use.
func (c *Client) run() { c.start.Do(func() { go c.readLoop() }) }

func (c *Client) readLoop() {
	defer func() {
		close(c.closed)
		if c.opts.OnClose != nil {
			c.opts.OnClose(c.Err())
		}
	}()
	for {
		var f Frame
		if err := c.readFrame(context.Background(), &f); err != nil {
			c.fail(err)
			return
		}
		switch f.Type {
		case "res":
			c.mu.Lock()
			ch := c.pending[f.ID]
			delete(c.pending, f.ID)
			c.mu.Unlock()
			if ch != nil {
				ch <- result{frame: f}
			}
		case "event":
			if c.opts.OnFrame != nil {
				c.opts.OnFrame(f)
			}
			if f.Event != "tick" && c.opts.OnEvent != nil {
				e := Event{Event: f.Event, Payload: f.Payload}
				if f.Seq != nil {
					e.Seq = *f.Seq
				}
				c.opts.OnEvent(e)
			}
		}
	}
}

func (c *Client) fail(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = fmt.Errorf("connection closed: %w", err)
	}
	for id, ch := range c.pending {
		ch <- result{err: c.err}
		delete(c.pending, id)
	}
}

// Hello returns the hello-ok payload (nil with Options.DiscardHello).
func (c *Client) Hello() json.RawMessage { return c.hello }

// TickInterval returns hello-ok's policy.tickIntervalMs; 0 when absent.
func (c *Client) TickInterval() time.Duration { return c.tick }

// Call sends a request and waits for its response payload; an error answer
// is an *Error.
func (c *Client) Call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	f, err := c.Request(ctx, strconv.FormatUint(c.nextID.Add(1), 10), method, params)
	switch {
	case err != nil:
		return nil, err
	case f.OK:
		return f.Payload, nil
	case f.Error != nil:
		return nil, f.Error
	}
	return nil, errors.New("request failed without error")
}

// Request sends a request with the given id and returns its response frame
// as sent, an error answer included; the error is for a request that got no
// answer (the connection ended, ctx is done).
func (c *Client) Request(ctx context.Context, id, method string, params any) (Frame, error) {
	c.run()
	b, err := json.Marshal(request{Type: "req", ID: id, Method: method, Params: params})
	if err != nil {
		return Frame{}, err
	}
	ch := make(chan result, 1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return Frame{}, c.err
	}
	c.pending[id] = ch
	c.mu.Unlock()
	if err := c.conn.Write(ctx, websocket.MessageText, b); err != nil {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		return Frame{}, err
	}
	select {
	case r := <-ch:
		return r.frame, r.err
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		return Frame{}, ctx.Err()
	}
}

// SendRaw writes one text frame as is.
func (c *Client) SendRaw(ctx context.Context, data []byte) error {
	c.run()
	return c.conn.Write(ctx, websocket.MessageText, data)
}

// InvokeParams are the params of node.invoke.
type InvokeParams struct {
	NodeID         string          `json:"nodeId"`
	Command        string          `json:"command"`
	Params         json.RawMessage `json:"params,omitempty"`
	TimeoutMs      int64           `json:"timeoutMs,omitempty"`
	IdempotencyKey string          `json:"idempotencyKey"`
}

// Invoke calls node.invoke; an empty IdempotencyKey gets a random one.
func (c *Client) Invoke(ctx context.Context, p InvokeParams) (json.RawMessage, error) {
	if p.IdempotencyKey == "" {
		p.IdempotencyKey = randomID()
	}
	return c.Call(ctx, "node.invoke", p)
}

// Done is closed when the connection ends.
func (c *Client) Done() <-chan struct{} {
	c.run()
	return c.closed
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close(websocket.StatusNormalClosure, "bye") }

// CloseNow drops the connection without a close handshake.
func (c *Client) CloseNow() error { return c.conn.CloseNow() }

func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// NewIdentity returns a fresh Ed25519 device identity.
func NewIdentity() ed25519.PrivateKey {
	_, k, _ := ed25519.GenerateKey(rand.Reader)
	return k
}
