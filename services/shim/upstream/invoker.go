package upstream

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// CallerInvoker is an Invoker that runs a call with the upstream's own
// record at hand (its caller token). The Service reads the record at each
// call, so a new caller token takes effect without restarting the links.
type CallerInvoker interface {
	InvokeAs(ctx context.Context, up Upstream, call Call) (json.RawMessage, *wire.Fault)
}

// recordInvoker is the Invoker of one upstream's links: it runs the call
// with the upstream's current record.
type recordInvoker struct {
	s            *Service
	tenant, name string
}

func (r recordInvoker) Invoke(ctx context.Context, call Call) (json.RawMessage, *wire.Fault) {
	ci, ok := r.s.cfg.Invoker.(CallerInvoker)
	if !ok {
		return r.s.cfg.Invoker.Invoke(ctx, call)
	}
	up, ok := r.s.upstream(r.tenant, r.name)
	if !ok {
		return nil, &wire.Fault{Code: wire.FaultUnavailable, Message: "upstream " + r.name + " was removed"}
	}
	return ci.InvokeAs(ctx, up, call)
}

// GatewayInvoker runs upstream calls as node.invoke on xiaoclaw's own
// gateway, over one operator connection per upstream authenticated with the
// upstream's caller token (Upstream.CallerToken). The gateway is the one
// policy decision point: the call is authorized, audited, deduplicated and
// limited there exactly as an operator's call, with principal
// "upstream:<name>".
type GatewayInvoker struct {
	URL string // xiaoclaw gateway, ws://host:port

	mu      sync.Mutex
	clients map[string]gatewayClient // tenant.name -> connection
}

// gatewayClient is a connection with the caller token it was opened with.
type gatewayClient struct {
	c     *occlient.Client
	token string
}

// maxIdempotencyKey is the gateway's bound on node.invoke's idempotencyKey.
const maxIdempotencyKey = 256

// Invoke implements Invoker: without the upstream's record there is no
// caller token, so the call is refused (the Service calls InvokeAs).
func (g *GatewayInvoker) Invoke(context.Context, Call) (json.RawMessage, *wire.Fault) {
	return nil, &wire.Fault{Code: wire.FaultUnavailable, Message: "no caller token for the upstream"}
}

// InvokeAs implements CallerInvoker.
func (g *GatewayInvoker) InvokeAs(ctx context.Context, up Upstream, call Call) (json.RawMessage, *wire.Fault) {
	if up.CallerToken == "" {
		return nil, &wire.Fault{Code: wire.FaultUnavailable, Message: "no caller token for upstream " + up.Name}
	}
	c, err := g.client(ctx, up)
	if err != nil {
		return nil, &wire.Fault{Code: wire.FaultUnavailable, Message: "xiaoclaw gateway unreachable: " + err.Error()}
	}
	p := occlient.InvokeParams{NodeID: call.NodeID, Command: call.Command, Params: call.Params,
		IdempotencyKey: scopedKey(call.Upstream, call.IdempotencyKey)}
	if dl, ok := ctx.Deadline(); ok {
		p.TimeoutMs = max(time.Until(dl).Milliseconds(), 1)
	}
	res, err := c.Invoke(ctx, p)
	if err != nil {
		return nil, faultOf(ctx, err)
	}
	var ok struct {
		Payload json.RawMessage `json:"payload"`
	}
	if err := json.Unmarshal(res, &ok); err != nil {
		return nil, &wire.Fault{Code: wire.FaultUnavailable, Message: "malformed node.invoke answer from the xiaoclaw gateway"}
	}
	return ok.Payload, nil
}

// scopedKey keeps one upstream's idempotency keys apart from another's and
// from the tenant's operators', within the gateway's length bound. An
// empty key stays empty: the client then picks a fresh one.
func scopedKey(upstream, key string) string {
	if key == "" {
		return ""
	}
	k := "upstream:" + upstream + ":" + key
	if len(k) > maxIdempotencyKey {
		sum := sha256.Sum256([]byte(key))
		k = "upstream:" + upstream + ":sha256:" + hex.EncodeToString(sum[:])
	}
	return k
}

// faultOf turns the gateway's refusal into the error reported upstream:
// the node's own error when the device failed (details.nodeError), else the
// gateway's reason, e.g. POLICY_DENIED with the rule.
func faultOf(ctx context.Context, err error) *wire.Fault {
	var ge *occlient.Error
	if !errors.As(err, &ge) {
		if ctx.Err() != nil {
			return &wire.Fault{Code: wire.FaultTimeout, Message: "node invoke timed out"}
		}
		return &wire.Fault{Code: wire.FaultUnavailable, Message: err.Error()}
	}
	var d struct {
		Code      string `json:"code"`
		NodeError *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"nodeError"`
	}
	_ = json.Unmarshal(ge.Details, &d)
	switch {
	case d.NodeError != nil && d.NodeError.Code != "":
		return &wire.Fault{Code: d.NodeError.Code, Message: d.NodeError.Message}
	case d.Code != "":
		return &wire.Fault{Code: d.Code, Message: ge.Message}
	default:
		return &wire.Fault{Code: ge.Code, Message: ge.Message}
	}
}

// client returns the live connection of an upstream's principal, dialing
// it when there is none or the caller token changed.
func (g *GatewayInvoker) client(ctx context.Context, up Upstream) (*occlient.Client, error) {
	key := up.Tenant + "." + up.Name
	g.mu.Lock()
	defer g.mu.Unlock()
	if gc, ok := g.clients[key]; ok {
		select {
		case <-gc.c.Done():
		default:
			if gc.token == up.CallerToken {
				return gc.c, nil
			}
			_ = gc.c.Close() // the old token no longer authenticates
		}
		delete(g.clients, key)
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := occlient.Dial(dctx, occlient.Options{URL: g.URL, Token: up.CallerToken, ClientID: "gateway-client", Mode: "backend",
		Version: "xiaoclaw-upstream"})
	if err != nil {
		return nil, err
	}
	if g.clients == nil {
		g.clients = map[string]gatewayClient{}
	}
	g.clients[key] = gatewayClient{c: c, token: up.CallerToken}
	return c, nil
}

// Close closes the gateway connections.
func (g *GatewayInvoker) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, gc := range g.clients {
		_ = gc.c.Close()
		delete(g.clients, k)
	}
}
