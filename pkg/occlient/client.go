// Package occlient is a client of the OpenClaw gateway protocol (v3/v4) for
// operators: it waits for the connect challenge, connects with a token (and,
// optionally, a signed Ed25519 device identity as the stock CLI does), sends
// requests concurrently over one WebSocket and delivers events. The xiaoclaw
// CLI, the end-to-end tests and the load command use it against xiaoclaw's
// gateway; it works against any gateway that speaks the protocol.
package occlient

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
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

type frame struct {
	Type    string          `json:"type"`
	ID      string          `json:"id,omitempty"`
	Method  string          `json:"method,omitempty"`
	Params  any             `json:"params,omitempty"`
	OK      bool            `json:"ok,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
	Error   *Error          `json:"error,omitempty"`
	Event   string          `json:"event,omitempty"`
	Seq     int64           `json:"seq,omitempty"`
}

type result struct {
	payload json.RawMessage
	err     error
}

// Client is one authenticated gateway connection.
type Client struct {
	lastFrame atomic.Int64 // unix ms of the last frame read, ticks included
	conn      *websocket.Conn
	opts      Options
	hello     json.RawMessage
	tick      time.Duration
	nextID    atomic.Uint64
	mu        sync.Mutex
	pending   map[string]chan result
	closed    chan struct{}
	err       error
}

// Dial connects and completes the handshake.
func Dial(ctx context.Context, opts Options) (*Client, error) {
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
	dopts := &websocket.DialOptions{CompressionMode: websocket.CompressionDisabled}
	if opts.TLS != nil {
		dopts.HTTPClient = &http.Client{Transport: &http.Transport{TLSClientConfig: opts.TLS, Proxy: http.ProxyFromEnvironment}}
	}
	conn, _, err := websocket.Dial(ctx, opts.URL, dopts)
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", opts.URL, err)
	}
	conn.SetReadLimit(32 << 20)
	c := &Client{conn: conn, opts: opts, pending: map[string]chan result{}, closed: make(chan struct{})}
	if err := c.handshake(ctx); err != nil {
		conn.Close(websocket.StatusNormalClosure, "")
		return nil, err
	}
	go c.readLoop()
	return c, nil
}

func (c *Client) handshake(ctx context.Context) error {
	var challenge struct {
		Nonce string `json:"nonce"`
		Ts    int64  `json:"ts"`
	}
	for {
		var f frame
		if err := c.readFrame(ctx, &f); err != nil {
			return fmt.Errorf("waiting for connect.challenge: %w", err)
		}
		if f.Type == "event" && f.Event == "connect.challenge" {
			if err := json.Unmarshal(f.Payload, &challenge); err != nil || challenge.Nonce == "" {
				return errors.New("connect.challenge without nonce")
			}
			break
		}
	}
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
		params["device"] = c.signDevice(challenge.Nonce, challenge.Ts)
	}
	id := "connect-" + randomID()
	b, _ := json.Marshal(frame{Type: "req", ID: id, Method: "connect", Params: params})
	if err := c.conn.Write(ctx, websocket.MessageText, b); err != nil {
		return fmt.Errorf("send connect: %w", err)
	}
	for {
		var f frame
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

// signDevice builds the v3 device proof: the fields v3, deviceId, client id,
// mode, role, scopes, signedAt, token, nonce, platform, deviceFamily joined
// by '|' and signed with Ed25519.
func (c *Client) signDevice(nonce string, ts int64) map[string]any {
	pub := c.opts.Identity.Public().(ed25519.PublicKey)
	sum := sha256.Sum256(pub)
	deviceID := hex.EncodeToString(sum[:])
	if ts <= 0 {
		ts = time.Now().UnixMilli()
	}
	payload := strings.Join([]string{"v3", deviceID, c.opts.ClientID, c.opts.Mode, c.opts.Role,
		strings.Join(c.opts.Scopes, ","), strconv.FormatInt(ts, 10), c.opts.Token, nonce,
		asciiLower(strings.TrimSpace(c.opts.Platform)), asciiLower(strings.TrimSpace(c.opts.DeviceFamily))}, "|")
	sig := ed25519.Sign(c.opts.Identity, []byte(payload))
	return map[string]any{
		"id":        deviceID,
		"publicKey": base64.RawURLEncoding.EncodeToString(pub),
		"signature": base64.RawURLEncoding.EncodeToString(sig),
		"signedAt":  ts,
		"nonce":     nonce,
	}
}

// asciiLower lower-cases ASCII letters only, as OpenClaw normalizes the
// signed platform and device family.
func asciiLower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + ('a' - 'A')
		}
	}
	return string(b)
}

func (c *Client) readFrame(ctx context.Context, f *frame) error {
	_, b, err := c.conn.Read(ctx)
	if err != nil {
		return err
	}
	c.lastFrame.Store(time.Now().UnixMilli())
	return json.Unmarshal(b, f)
}

// LastFrame returns when the last frame (a tick included) arrived.
func (c *Client) LastFrame() time.Time { return time.UnixMilli(c.lastFrame.Load()) }

// Err returns why the connection ended, once Done is closed; the WebSocket
// close status is in the chain (websocket.CloseStatus).
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

func (c *Client) readLoop() {
	defer func() {
		close(c.closed)
		if c.opts.OnClose != nil {
			c.opts.OnClose(c.Err())
		}
	}()
	for {
		var f frame
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
			if ch == nil {
				continue
			}
			if f.OK {
				ch <- result{payload: f.Payload}
			} else if f.Error != nil {
				ch <- result{err: f.Error}
			} else {
				ch <- result{err: errors.New("request failed without error")}
			}
		case "event":
			if f.Event != "tick" && c.opts.OnEvent != nil {
				c.opts.OnEvent(Event{Event: f.Event, Payload: f.Payload, Seq: f.Seq})
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

// Call sends a request and waits for its response payload.
func (c *Client) Call(ctx context.Context, method string, params any) (json.RawMessage, error) {
	id := strconv.FormatUint(c.nextID.Add(1), 10)
	b, err := json.Marshal(frame{Type: "req", ID: id, Method: method, Params: params})
	if err != nil {
		return nil, err
	}
	ch := make(chan result, 1)
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil, c.err
	}
	c.pending[id] = ch
	c.mu.Unlock()
	if err := c.conn.Write(ctx, websocket.MessageText, b); err != nil {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		return nil, err
	}
	select {
	case r := <-ch:
		return r.payload, r.err
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		return nil, ctx.Err()
	}
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
func (c *Client) Done() <-chan struct{} { return c.closed }

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close(websocket.StatusNormalClosure, "bye") }

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
