// Package mcpclient is the devicehub's MCP client for one device session:
// it numbers requests with per-session increasing integers (the XiaoZhi
// firmware drops any other id), matches responses to pending calls,
// bounds the calls in flight, fails every pending call at once when the
// session ends, and runs discovery (initialize, then tools/list page by
// page). It knows nothing of the transport: a Sender writes one JSON-RPC
// message, and the transport's reader hands responses to Deliver.
package mcpclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/devicehub/internal/xzproto"
)

// ProtocolVersion is the MCP protocol version the client asks for; it is
// the one the XiaoZhi firmware speaks.
const ProtocolVersion = "2024-11-05"

// Sender writes one JSON-RPC message to the device. The transport wraps it
// in its envelope and must be safe for concurrent use. A write error means
// the session is unusable and the transport ends it, except a *wire.Fault,
// which refuses that one message (e.g. PAYLOAD_TOO_LARGE) and leaves the session up.
type Sender interface {
	Send(payload []byte) error
}

type reply struct {
	raw   json.RawMessage
	fault *wire.Fault
}

// Client is the MCP client of one session. The zero value is not usable;
// call Init.
type Client struct {
	send        Sender
	maxInFlight int

	mu      sync.Mutex
	nextID  uint64
	pending map[uint64]chan reply // nil while no call is pending: idle sessions stay small
	closed  *wire.Fault
}

// Init prepares c to send through s with at most maxInFlight pending calls.
// (A method rather than a constructor, so the client can live inside the
// session struct without a separate allocation.)
func (c *Client) Init(s Sender, maxInFlight int) {
	c.send = s
	c.maxInFlight = maxInFlight
}

// Call sends one request and waits for the device's response, ctx's end or
// the session's end. It returns the JSON-RPC response verbatim (a device
// error is a normal response), or a *wire.Fault: BUSY when maxInFlight
// calls are pending, TIMEOUT when ctx ends first, DISCONNECTED (or the
// session's closing fault) when the session ends first.
func (c *Client) Call(ctx context.Context, method string, params json.RawMessage) (json.RawMessage, error) {
	return c.CallWithID(ctx, method, params, nil)
}

// CallWithID is Call that also reports the request's id: sending, when not
// nil, is called with it just before the request is written (not at all
// when the call fails before that, e.g. BUSY). The devicehub times the
// device round trip from there.
func (c *Client) CallWithID(ctx context.Context, method string, params json.RawMessage, sending func(id uint64)) (json.RawMessage, error) {
	ch := make(chan reply, 1)
	c.mu.Lock()
	if c.closed != nil {
		f := c.closed
		c.mu.Unlock()
		return nil, f
	}
	if len(c.pending) >= c.maxInFlight {
		c.mu.Unlock()
		return nil, &wire.Fault{Code: wire.FaultBusy, Message: fmt.Sprintf("%d calls already in flight for this device", c.maxInFlight)}
	}
	if c.pending == nil {
		c.pending = make(map[uint64]chan reply)
	}
	c.nextID++
	id := c.nextID
	c.pending[id] = ch
	c.mu.Unlock()

	if sending != nil {
		sending(id)
	}
	if err := c.send.Send(xzproto.AppendRequest(nil, id, method, params)); err != nil {
		c.forget(id)
		if f := c.closedFault(); f != nil {
			return nil, f
		}
		var f *wire.Fault
		if errors.As(err, &f) {
			return nil, f // the transport refused this request only, e.g. PAYLOAD_TOO_LARGE
		}
		return nil, &wire.Fault{Code: wire.FaultDisconnected, Message: "could not write to the device: " + err.Error()}
	}
	select {
	case r := <-ch:
		if r.fault != nil {
			return nil, r.fault
		}
		return r.raw, nil
	case <-ctx.Done():
		c.forget(id)
		// A reply may have raced with the deadline; prefer it.
		select {
		case r := <-ch:
			if r.fault != nil {
				return nil, r.fault
			}
			return r.raw, nil
		default:
		}
		if errors.Is(ctx.Err(), context.Canceled) {
			return nil, &wire.Fault{Code: wire.FaultUnavailable, Message: method + " cancelled"}
		}
		return nil, &wire.Fault{Code: wire.FaultTimeout, Message: "the device did not answer " + method + " before the deadline"}
	}
}

// Notify sends a JSON-RPC notification; nothing is awaited.
func (c *Client) Notify(method string, params json.RawMessage) error {
	if f := c.closedFault(); f != nil {
		return f
	}
	return c.send.Send(xzproto.AppendNotification(nil, method, params))
}

func (c *Client) forget(id uint64) {
	c.mu.Lock()
	c.removeLocked(id)
	c.mu.Unlock()
}

// removeLocked drops a pending call; an empty map is released, so an idle
// session keeps none.
func (c *Client) removeLocked(id uint64) {
	delete(c.pending, id)
	if len(c.pending) == 0 {
		c.pending = nil
	}
}

func (c *Client) closedFault() *wire.Fault {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Deliver hands a device response to the call waiting for its id and
// reports whether one was waiting (late and unknown responses are dropped).
func (c *Client) Deliver(id uint64, raw json.RawMessage) bool {
	c.mu.Lock()
	ch, ok := c.pending[id]
	if ok {
		c.removeLocked(id)
	}
	c.mu.Unlock()
	if ok {
		ch <- reply{raw: raw}
	}
	return ok
}

// Fail fails the call waiting for id with f (e.g. a response the transport
// could not accept) and reports whether one was waiting.
func (c *Client) Fail(id uint64, f *wire.Fault) bool {
	c.mu.Lock()
	ch, ok := c.pending[id]
	if ok {
		c.removeLocked(id)
	}
	c.mu.Unlock()
	if ok {
		ch <- reply{fault: f}
	}
	return ok
}

// InFlight returns the number of pending calls.
func (c *Client) InFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

// Close fails every pending call with f at once and every later call too.
// Only the first Close counts.
func (c *Client) Close(f *wire.Fault) {
	c.mu.Lock()
	if c.closed != nil {
		c.mu.Unlock()
		return
	}
	c.closed = f
	pending := c.pending
	c.pending = nil
	c.mu.Unlock()
	for _, ch := range pending {
		ch <- reply{fault: f}
	}
}

// Discovery is what a session learned about the device's MCP server.
type Discovery struct {
	ServerInfo json.RawMessage // initialize result .serverInfo, or nil
	Tools      json.RawMessage // the full catalog, a JSON array
	Pages      int
}

// DiscoverOptions bound discovery.
type DiscoverOptions struct {
	WithUserTools bool
	// MaxCatalogBytes caps the catalog; discovery stops with an error
	// beyond it (the catalog must fit into one NATS message).
	MaxCatalogBytes int
	// MaxPages caps the number of tools/list pages.
	MaxPages int
	// ClientVersion goes into clientInfo.version.
	ClientVersion string
	// Initialized, when set, runs once the server is initialized, before
	// tools/list, with its serverInfo.
	Initialized func(serverInfo json.RawMessage)
}

// Discover runs initialize, notifications/initialized and then tools/list
// page by page until nextCursor is absent. Each request gets its own
// deadline from callCtx. On an error it returns what it learned so far.
func (c *Client) Discover(callCtx func() (context.Context, context.CancelFunc), o DiscoverOptions) (Discovery, error) {
	var d Discovery
	initParams, _ := json.Marshal(map[string]any{
		"protocolVersion": ProtocolVersion,
		"capabilities":    struct{}{},
		"clientInfo":      map[string]string{"name": "xiaoclaw", "version": o.ClientVersion},
	})
	res, err := c.callResult(callCtx, "initialize", initParams)
	if err != nil {
		return d, fmt.Errorf("initialize: %w", err)
	}
	d.ServerInfo = xzproto.ServerInfo(res)
	if err := c.Notify("notifications/initialized", nil); err != nil {
		return d, fmt.Errorf("notifications/initialized: %w", err)
	}
	if o.Initialized != nil {
		o.Initialized(d.ServerInfo)
	}
	l, err := c.ListTools(callCtx, o)
	l.ServerInfo = d.ServerInfo
	return l, err
}

// ListTools reads the whole catalog with tools/list, page by page until
// nextCursor is absent: discovery's second half, and a re-list after the
// device's notifications/tools/list_changed. On an error it returns what
// it learned so far.
func (c *Client) ListTools(callCtx func() (context.Context, context.CancelFunc), o DiscoverOptions) (Discovery, error) {
	var d Discovery
	tools := []byte{'['}
	n := 0
	cursor := ""
	seen := map[string]bool{}
	for {
		params := map[string]any{"withUserTools": o.WithUserTools}
		if cursor != "" {
			params["cursor"] = cursor
		}
		p, _ := json.Marshal(params)
		res, err := c.callResult(callCtx, "tools/list", p)
		if err != nil {
			return d.withTools(tools), fmt.Errorf("tools/list page %d: %w", d.Pages+1, err)
		}
		page, err := xzproto.ParseToolsPage(res)
		if err != nil {
			return d.withTools(tools), fmt.Errorf("tools/list page %d: %w", d.Pages+1, err)
		}
		d.Pages++
		for _, t := range page.Tools {
			if len(tools)+len(t)+2 > o.MaxCatalogBytes {
				return d.withTools(tools), fmt.Errorf("tool catalog exceeds %d bytes", o.MaxCatalogBytes)
			}
			if n > 0 {
				tools = append(tools, ',')
			}
			tools = append(tools, t...)
			n++
		}
		if page.NextCursor == "" {
			return d.withTools(tools), nil
		}
		if seen[page.NextCursor] || len(page.Tools) == 0 {
			return d.withTools(tools), fmt.Errorf("tools/list does not advance (cursor %q)", page.NextCursor)
		}
		if d.Pages >= o.MaxPages {
			return d.withTools(tools), fmt.Errorf("tools/list has more than %d pages", o.MaxPages)
		}
		seen[page.NextCursor] = true
		cursor = page.NextCursor
	}
}

func (d Discovery) withTools(tools []byte) Discovery {
	d.Tools = append(tools, ']')
	return d
}

// callResult runs one call and returns its result, or an error: the fault,
// or the device's JSON-RPC error.
func (c *Client) callResult(callCtx func() (context.Context, context.CancelFunc), method string, params json.RawMessage) (json.RawMessage, error) {
	ctx, cancel := callCtx()
	defer cancel()
	raw, err := c.Call(ctx, method, params)
	if err != nil {
		return nil, err
	}
	resp, err := xzproto.ParseResponse(raw)
	if err != nil {
		return nil, err
	}
	if resp.Error != nil {
		return nil, fmt.Errorf("device error: %w", resp.Error)
	}
	return resp.Result, nil
}
