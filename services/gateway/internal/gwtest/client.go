// Package gwtest is the gateway's test harness: an OpenClaw protocol client
// (pkg/occlient's connection, driven frame by frame) that plays an operator
// (the stock CLI's frames) or a node host (signed device identity,
// answering node.invoke.request), and helpers to build connect params the
// way the stock clients do.
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
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/protocol"
)

// Frame is any frame the gateway sends, decoded.
type Frame = occlient.Frame

// ErrorShape is an error as the gateway sends it.
type ErrorShape = occlient.Error

// Challenge is the connect.challenge payload.
type Challenge = occlient.Challenge

// Client is one WebSocket connection to a gateway.
type Client struct {
	*occlient.Client
	Challenge Challenge
	// Events receives every event frame after the challenge.
	Events chan Frame

	nextID atomic.Int64
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
	return dial(ctx, url, localIP, header, nil)
}

// dial opens the socket; onEvent sees events before they are queued (a
// node host answers node.invoke.request there).
func dial(ctx context.Context, url, localIP string, header http.Header, onEvent func(Frame)) (*Client, error) {
	c := &Client{Events: make(chan Frame, 4096)}
	opts := occlient.Options{URL: url, HTTPHeader: header, OnFrame: func(f Frame) {
		if onEvent != nil {
			onEvent(f)
		}
		select {
		case c.Events <- f:
		default:
		}
	}}
	if localIP != "" {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(localIP)}}
		opts.HTTPClient = &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
	}
	oc, err := occlient.Open(ctx, opts)
	if err != nil {
		return nil, err
	}
	c.Client, c.Challenge = oc, oc.Challenge()
	return c, nil
}

// CloseStatus waits up to d for the socket to end and returns the close
// code and reason the gateway sent (-1 if none).
func (c *Client) CloseStatus(d time.Duration) (websocket.StatusCode, string, error) {
	select {
	case <-c.Done():
	case <-time.After(d):
		return -1, "", errors.New("socket still open")
	}
	err := c.Err()
	var ce websocket.CloseError
	if errors.As(err, &ce) {
		return ce.Code, ce.Reason, nil
	}
	return -1, "", err
}

// Close closes the socket.
func (c *Client) Close() { c.Client.CloseWith(websocket.StatusNormalClosure, "") }

// CloseNow drops the socket without a close handshake.
func (c *Client) CloseNow() { c.Client.CloseNow() }

// Call sends a request and waits for its response.
func (c *Client) Call(ctx context.Context, method string, params any) (Frame, error) {
	id := strconv.FormatInt(c.nextID.Add(1), 10) + ":" + method
	return c.CallID(ctx, id, method, params)
}

// CallID is Call with a given request id.
func (c *Client) CallID(ctx context.Context, id, method string, params any) (Frame, error) {
	f, err := c.Request(ctx, id, method, params)
	if err != nil && ctx.Err() == nil {
		return Frame{}, fmt.Errorf("socket closed before the response to %s: %w", method, err)
	}
	return f, err
}

// Connect sends connect with params and waits for the response; an error
// response is returned as the Frame, not as an error.
func (c *Client) Connect(ctx context.Context, params any) (Frame, error) {
	return c.CallID(ctx, "1:connect", protocol.MethodConnect, params)
}

// WaitEvent returns the next event with the given name.
func (c *Client) WaitEvent(ctx context.Context, name string) (Frame, error) {
	c.Done() // starts the read loop
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

// SignDevice fills p.Device with a v3 proof made with priv over nonce, as
// the stock clients do.
func SignDevice(p *protocol.ConnectParams, priv ed25519.PrivateKey, nonce string, signedAtMs int64) {
	d := occlient.SignDevice(priv, occlient.DeviceClaims{
		ClientID: protocol.Str(p.Client.ID), Mode: protocol.Str(p.Client.Mode), Role: p.RoleOrDefault(), Scopes: p.ScopesOrEmpty(),
		Token: p.SignatureToken(), Platform: protocol.Str(p.Client.Platform), DeviceFamily: protocol.Str(p.Client.DeviceFamily),
	}, nonce, signedAtMs)
	p.Device = &protocol.DeviceProof{ID: &d.ID, PublicKey: &d.PublicKey, Signature: &d.Signature, SignedAt: &d.SignedAt, Nonce: &d.Nonce}
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
// them with SignDevice and the challenge nonce.
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
	if priv == nil {
		_, priv, _ = ed25519.GenerateKey(nil)
	}
	h := &NodeHost{NodeID: occlient.DeviceID(priv.Public().(ed25519.PublicKey)), Requests: make(chan InvokeRequest, 1024)}
	// The read loop delivers requests only after connect, when h.Client is set.
	c, err := dial(ctx, url, "", nil, func(f Frame) {
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
			_, _ = h.Call(context.Background(), protocol.MethodNodeInvokeResult, res)
		}()
	})
	if err != nil {
		return nil, Frame{}, err
	}
	h.Client = c
	SignDevice(params, priv, c.Challenge.Nonce, c.Challenge.Ts)
	hello, err := c.Connect(ctx, params)
	if err != nil {
		c.CloseNow()
		return nil, Frame{}, err
	}
	return h, hello, nil
}
