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
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
)

// Options configure a connection.
type Options struct {
	URL    string // ws://127.0.0.1:18789
	Token  string
	Role   string   // default "operator"
	Scopes []string // default operator.read + operator.write
	// Identity signs the connect request when set.
	Identity ed25519.PrivateKey
	// ClientID and Mode default to "cli"/"cli".
	ClientID, Mode, Version, Platform string
	// Protocol range; default 3..4.
	MinProtocol, MaxProtocol int
	// OnEvent receives every event frame after the handshake (tick excluded).
	// It runs on the read loop: keep it short.
	OnEvent func(Event)
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
	conn    *websocket.Conn
	opts    Options
	hello   json.RawMessage
	nextID  atomic.Uint64
	mu      sync.Mutex
	pending map[string]chan result
	closed  chan struct{}
	err     error
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
	conn, _, err := websocket.Dial(ctx, opts.URL, &websocket.DialOptions{CompressionMode: websocket.CompressionDisabled})
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
	params := map[string]any{
		"minProtocol": c.opts.MinProtocol,
		"maxProtocol": c.opts.MaxProtocol,
		"client": map[string]any{
			"id": c.opts.ClientID, "version": c.opts.Version, "platform": c.opts.Platform,
			"mode": c.opts.Mode, "instanceId": randomID(),
		},
		"role":   c.opts.Role,
		"scopes": c.opts.Scopes,
		"caps":   []string{},
	}
	if c.opts.Token != "" {
		params["auth"] = map[string]any{"token": c.opts.Token}
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
			c.hello = f.Payload
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
		strings.ToLower(strings.TrimSpace(c.opts.Platform)), ""}, "|")
	sig := ed25519.Sign(c.opts.Identity, []byte(payload))
	return map[string]any{
		"id":        deviceID,
		"publicKey": base64.RawURLEncoding.EncodeToString(pub),
		"signature": base64.RawURLEncoding.EncodeToString(sig),
		"signedAt":  ts,
		"nonce":     nonce,
	}
}

func (c *Client) readFrame(ctx context.Context, f *frame) error {
	_, b, err := c.conn.Read(ctx)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, f)
}

func (c *Client) readLoop() {
	defer close(c.closed)
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

// Hello returns the hello-ok payload.
func (c *Client) Hello() json.RawMessage { return c.hello }

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
