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

// GatewayInvoker runs upstream calls as node.invoke on xiaoclaw's own
// gateway, over one operator connection per upstream authenticated with the
// upstream's principal token. The gateway is the one policy decision point:
// the call is authorized, audited, deduplicated and limited there exactly as
// an operator's call, with principal "upstream:<name>".
type GatewayInvoker struct {
	URL string // xiaoclaw gateway, ws://host:port
	// Tokens maps an upstream name to the xiaoclaw operator token whose
	// principal is "upstream:<name>".
	Tokens map[string]string

	mu      sync.Mutex
	clients map[string]*occlient.Client
}

// maxIdempotencyKey is the gateway's bound on node.invoke's idempotencyKey.
const maxIdempotencyKey = 256

// Invoke implements Invoker.
func (g *GatewayInvoker) Invoke(ctx context.Context, call Call) (json.RawMessage, *wire.Fault) {
	c, err := g.client(ctx, call.Upstream)
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
// it when there is none.
func (g *GatewayInvoker) client(ctx context.Context, upstream string) (*occlient.Client, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if c := g.clients[upstream]; c != nil {
		select {
		case <-c.Done():
		default:
			return c, nil
		}
	}
	token, ok := g.Tokens[upstream]
	if !ok {
		return nil, errors.New("no principal token for upstream " + upstream)
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := occlient.Dial(dctx, occlient.Options{URL: g.URL, Token: token, ClientID: "gateway-client", Mode: "backend",
		Version: "xiaoclaw-upstream"})
	if err != nil {
		return nil, err
	}
	if g.clients == nil {
		g.clients = map[string]*occlient.Client{}
	}
	g.clients[upstream] = c
	return c, nil
}

// Close closes the gateway connections.
func (g *GatewayInvoker) Close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for k, c := range g.clients {
		_ = c.Close()
		delete(g.clients, k)
	}
}
