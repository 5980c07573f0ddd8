// Package gwtest is the gateway's test harness: an OpenClaw protocol client
// over a real WebSocket that plays an operator (the stock CLI's frames) or a
// node host (signed device identity, answering node.invoke.request), and
// helpers to build connect params the way the stock clients do.
package gwtest

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/protocol"
)

// Frame is any frame the gateway sends, decoded.
type Frame struct {
	Type    string          `json:"type"`
	ID      string          `json:"id,omitempty"`
	OK      bool            `json:"ok,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
	Error   *ErrorShape     `json:"error,omitempty"`
	Event   string          `json:"event,omitempty"`
	Seq     *int64          `json:"seq,omitempty"`
	Raw     []byte          `json:"-"`
}

// ErrorShape is an error as the gateway sends it.
type ErrorShape struct {
	Code      string          `json:"code"`
	Message   string          `json:"message"`
	Details   json.RawMessage `json:"details,omitempty"`
	Retryable bool            `json:"retryable,omitempty"`
	// RetryAfterMs is how long to wait before trying again (AUTH_RATE_LIMITED).
	RetryAfterMs int64 `json:"retryAfterMs,omitempty"`
}

// DetailCode returns details.code.
func (e *ErrorShape) DetailCode() string {
	var d struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(e.Details, &d)
	return d.Code
}

func (e *ErrorShape) Error() string { return e.Code + ": " + e.Message }

// Challenge is the connect.challenge payload.
type Challenge struct {
	Nonce string `json:"nonce"`
	Ts    int64  `json:"ts"`
}

// Client is one WebSocket connection to a gateway.
type Client struct {
	ws        *websocket.Conn
	Challenge Challenge
	// Events receives every event frame after the challenge.
	Events chan Frame
	// OnEvent, when set before Connect, sees events before they are queued
	// (a node host answers node.invoke.request there).
	OnEvent func(Frame)

	start   sync.Once
	mu      sync.Mutex
	pending map[string]chan Frame
	nextID  atomic.Int64
	done    chan struct{}
	readErr error
}

// Dial opens a socket and waits for the connect.challenge.
func Dial(ctx context.Context, url string) (*Client, error) {
	return DialFrom(ctx, url, "")
}

// DialFrom is Dial from the local address localIP (on Linux any
// 127.0.0.0/8 address reaches a loopback listener: a second client
// address); "" lets the system choose.
func DialFrom(ctx context.Context, url, localIP string) (*Client, error) {
	return DialWith(ctx, url, localIP, nil)
}

// DialWith is DialFrom sending header with the upgrade request (e.g.
// X-Forwarded-For, as a reverse proxy does).
func DialWith(ctx context.Context, url, localIP string, header http.Header) (*Client, error) {
	opts := &websocket.DialOptions{CompressionMode: websocket.CompressionDisabled, HTTPHeader: header}
	if localIP != "" {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(localIP)}}
		opts.HTTPClient = &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
	}
	ws, _, err := websocket.Dial(ctx, url, opts)
	if err != nil {
		return nil, err
	}
	ws.SetReadLimit(64 << 20)
	c := &Client{ws: ws, Events: make(chan Frame, 4096), pending: map[string]chan Frame{}, done: make(chan struct{})}
	_, data, err := ws.Read(ctx)
	if err != nil {
		ws.CloseNow()
		return nil, fmt.Errorf("waiting for connect.challenge: %w", err)
	}
	var f Frame
	if err := json.Unmarshal(data, &f); err != nil || f.Event != protocol.EventConnectChallenge {
		ws.CloseNow()
		return nil, fmt.Errorf("first frame is not connect.challenge: %s", data)
	}
	if err := json.Unmarshal(f.Payload, &c.Challenge); err != nil {
		ws.CloseNow()
		return nil, err
	}
	return c, nil
}

// run starts the read loop; OnEvent must be set before.
func (c *Client) run() { c.start.Do(func() { go c.readLoop() }) }

func (c *Client) readLoop() {
	defer close(c.done)
	for {
		_, data, err := c.ws.Read(context.Background())
		if err != nil {
			c.mu.Lock()
			c.readErr = err
			c.mu.Unlock()
			return
		}
		var f Frame
		if err := json.Unmarshal(data, &f); err != nil {
			continue
		}
		f.Raw = data
		switch f.Type {
		case "res":
			c.mu.Lock()
			ch := c.pending[f.ID]
			delete(c.pending, f.ID)
			c.mu.Unlock()
			if ch != nil {
				ch <- f
			}
		case "event":
			if c.OnEvent != nil {
				c.OnEvent(f)
			}
			select {
			case c.Events <- f:
			default:
			}
		}
	}
}

// Done is closed when the socket has ended.
func (c *Client) Done() <-chan struct{} {
	c.run()
	return c.done
}

// CloseStatus waits up to d for the socket to end and returns the close
// code and reason the gateway sent (-1 if none).
func (c *Client) CloseStatus(d time.Duration) (websocket.StatusCode, string, error) {
	c.run()
	select {
	case <-c.done:
	case <-time.After(d):
		return -1, "", errors.New("socket still open")
	}
	c.mu.Lock()
	err := c.readErr
	c.mu.Unlock()
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		return ce.Code, ce.Reason, nil
	}
	return -1, "", err
}

// Close closes the socket.
func (c *Client) Close() { c.ws.Close(websocket.StatusNormalClosure, "") }

// CloseNow drops the socket without a close handshake.
func (c *Client) CloseNow() { c.ws.CloseNow() }

// SendRaw writes one text frame as is.
func (c *Client) SendRaw(ctx context.Context, data []byte) error {
	c.run()
	return c.ws.Write(ctx, websocket.MessageText, data)
}

// Call sends a request and waits for its response.
func (c *Client) Call(ctx context.Context, method string, params any) (Frame, error) {
	id := strconv.FormatInt(c.nextID.Add(1), 10) + ":" + method
	return c.CallID(ctx, id, method, params)
}

// CallID is Call with a given request id.
func (c *Client) CallID(ctx context.Context, id, method string, params any) (Frame, error) {
	req := struct {
		Type   string `json:"type"`
		ID     string `json:"id"`
		Method string `json:"method"`
		Params any    `json:"params,omitempty"`
	}{"req", id, method, params}
	data, err := json.Marshal(req)
	if err != nil {
		return Frame{}, err
	}
	ch := make(chan Frame, 1)
	c.mu.Lock()
	c.pending[id] = ch
	c.mu.Unlock()
	if err := c.SendRaw(ctx, data); err != nil {
		return Frame{}, err
	}
	select {
	case f := <-ch:
		return f, nil
	case <-c.done:
		select {
		case f := <-ch: // the response came just before the close
			return f, nil
		default:
		}
		return Frame{}, fmt.Errorf("socket closed before the response to %s", method)
	case <-ctx.Done():
		return Frame{}, ctx.Err()
	}
}

// Connect sends connect with params and waits for the response; an error
// response is returned as the Frame, not as an error.
func (c *Client) Connect(ctx context.Context, params any) (Frame, error) {
	return c.CallID(ctx, "1:connect", protocol.MethodConnect, params)
}

// WaitEvent returns the next event with the given name.
func (c *Client) WaitEvent(ctx context.Context, name string) (Frame, error) {
	c.run()
	for {
		select {
		case f := <-c.Events:
			if f.Event == name {
				return f, nil
			}
		case <-ctx.Done():
			return Frame{}, fmt.Errorf("waiting for event %s: %w", name, ctx.Err())
		}
	}
}

func ptr[T any](v T) *T { return &v }

// OperatorParams are connect params as the current stock CLI sends them
// (protocol 4, client cli, no device identity).
func OperatorParams(token string, scopes ...string) *protocol.ConnectParams {
	return &protocol.ConnectParams{
		MinProtocol: ptr[int64](4), MaxProtocol: ptr[int64](4),
		Client: &protocol.ClientInfo{
			ID: ptr("cli"), Version: ptr("2026.9.6"), Platform: ptr("linux"), DeviceFamily: ptr("Linux"),
			Mode: ptr("cli"), InstanceID: ptr("757bc7a1-66c3-4763-babc-8d9b2ab0b109"),
		},
		Caps:   []string{},
		Auth:   &protocol.ConnectAuth{Token: ptr(token)},
		Role:   ptr(protocol.RoleOperator),
		Scopes: scopes,
	}
}

// NodeParams are connect params as the stock node host sends them; sign
// them with protocol.SignDevice and the challenge nonce.
func NodeParams(token, displayName string, commands ...string) *protocol.ConnectParams {
	return &protocol.ConnectParams{
		MinProtocol: ptr[int64](4), MaxProtocol: ptr[int64](4),
		Client: &protocol.ClientInfo{
			ID: ptr("node-host"), DisplayName: ptr(displayName), Version: ptr("2026.9.6"), Platform: ptr("linux"),
			DeviceFamily: ptr("Linux"), Mode: ptr("node"), InstanceID: ptr("5a0f36f2-dfe4-4f05-b85f-b829ca942d8c"),
		},
		Caps:     []string{"system"},
		Commands: commands,
		PathEnv:  ptr("/usr/local/bin:/usr/bin:/bin"),
		Auth:     &protocol.ConnectAuth{Token: ptr(token)},
		Role:     ptr(protocol.RoleNode),
		Scopes:   []string{},
	}
}

// InvokeRequest is a node.invoke.request payload.
type InvokeRequest struct {
	ID             string  `json:"id"`
	NodeID         string  `json:"nodeId"`
	Command        string  `json:"command"`
	ParamsJSON     *string `json:"paramsJSON"`
	TimeoutMs      int64   `json:"timeoutMs"`
	IdempotencyKey string  `json:"idempotencyKey,omitempty"`
}

// InvokeHandler answers an invoke: a JSON payload, or an error code and
// message. A nil handler result with no code means "do not answer".
type InvokeHandler func(req InvokeRequest) (payloadJSON string, errCode, errMessage string)

// NodeHost is a Go OpenClaw node host connected to a gateway.
type NodeHost struct {
	*Client
	NodeID   string
	Requests chan InvokeRequest // every node.invoke.request, as received
}

// ConnectNodeHost dials url and connects as a node host with a fresh or
// given key, answering node.invoke.request with handle.
func ConnectNodeHost(ctx context.Context, url string, params *protocol.ConnectParams, priv ed25519.PrivateKey, handle InvokeHandler) (*NodeHost, Frame, error) {
	c, err := Dial(ctx, url)
	if err != nil {
		return nil, Frame{}, err
	}
	if priv == nil {
		_, priv, _ = ed25519.GenerateKey(nil)
	}
	protocol.SignDevice(params, priv, c.Challenge.Nonce, c.Challenge.Ts)
	h := &NodeHost{Client: c, NodeID: *params.Device.ID, Requests: make(chan InvokeRequest, 1024)}
	c.OnEvent = func(f Frame) {
		if f.Event != protocol.EventNodeInvokeRequest {
			return
		}
		var req InvokeRequest
		if json.Unmarshal(f.Payload, &req) != nil {
			return
		}
		select {
		case h.Requests <- req:
		default:
		}
		if handle == nil {
			return
		}
		go func() {
			payload, code, msg := handle(req)
			if payload == "" && code == "" {
				return
			}
			res := map[string]any{"id": req.ID, "nodeId": h.NodeID, "ok": code == ""}
			if code == "" {
				res["payloadJSON"] = payload
			} else {
				res["error"] = map[string]string{"code": code, "message": msg}
			}
			_, _ = c.Call(context.Background(), protocol.MethodNodeInvokeResult, res)
		}()
	}
	hello, err := c.Connect(ctx, params)
	if err != nil {
		c.CloseNow()
		return nil, Frame{}, err
	}
	return h, hello, nil
}
