package upstream

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// fakeGateway is an OpenClaw gateway reduced to what a node host meets:
// the challenge, a connect checked like the real one (v3/v2 device proof
// over the challenge nonce), hello-ok with a tick interval, optional ticks
// and an automatic {ok:true} to every request after the handshake.
type fakeGateway struct {
	t   *testing.T
	srv *httptest.Server

	tickMs    int64
	sendTicks bool
	// silent accepts the WebSocket and never sends the challenge.
	silent bool
	// holdFor, when set, has the gateway close a silent socket itself
	// after that long.
	holdFor time.Duration
	token   string
	// refuse decides, per connect, on an error answer; nil accepts.
	refuse func(n int, p connectParams) *gwError

	methods []string // hello-ok features.methods
	// refuseMethods answers requests of these methods with the error.
	refuseMethods map[string]gwError

	mu            sync.Mutex
	connects      []connectParams
	open, maxOpen int // silent sockets open now, at most
	conns         chan *fakeConn
}

type gwError struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details,omitempty"`
}

type connectParams struct {
	MinProtocol int `json:"minProtocol"`
	MaxProtocol int `json:"maxProtocol"`
	Client      struct {
		ID           string `json:"id"`
		Mode         string `json:"mode"`
		Platform     string `json:"platform"`
		DeviceFamily string `json:"deviceFamily"`
		DisplayName  string `json:"displayName"`
		Version      string `json:"version"`
	} `json:"client"`
	Role     string   `json:"role"`
	Scopes   []string `json:"scopes"`
	Caps     []string `json:"caps"`
	Commands []string `json:"commands"`
	Auth     struct {
		Token string `json:"token"`
	} `json:"auth"`
	Device struct {
		ID        string `json:"id"`
		PublicKey string `json:"publicKey"`
		Signature string `json:"signature"`
		SignedAt  int64  `json:"signedAt"`
		Nonce     string `json:"nonce"`
	} `json:"device"`
}

// fakeConn is one accepted node connection.
type fakeConn struct {
	gw     *fakeGateway
	ws     *websocket.Conn
	params connectParams
	reqs   chan map[string]json.RawMessage // requests the node sent
	closed chan websocket.StatusCode       // the node's close status
	opened time.Time

	mu       sync.Mutex
	closedAt time.Time
}

func (c *fakeConn) closedTime() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closedAt
}

func newFakeGateway(t *testing.T) *fakeGateway {
	g := &fakeGateway{t: t, tickMs: 30000, token: "upstream-secret", conns: make(chan *fakeConn, 16)}
	// As many method names as OpenClaw 2026.9 lists (466): its hello-ok
	// weighs about 15 KB.
	for i := range 466 {
		g.methods = append(g.methods, fmt.Sprintf("method.number.%d", i))
	}
	g.srv = httptest.NewServer(http.HandlerFunc(g.serve))
	t.Cleanup(g.srv.Close)
	return g
}

func (g *fakeGateway) url() string { return "ws" + strings.TrimPrefix(g.srv.URL, "http") }

func (g *fakeGateway) connectCount() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.connects)
}

func (g *fakeGateway) serve(w http.ResponseWriter, r *http.Request) {
	ws, err := websocket.Accept(w, r, nil)
	if err != nil {
		return
	}
	ctx := context.Background()
	if g.silent {
		g.mu.Lock()
		g.connects = append(g.connects, connectParams{})
		g.open++
		g.maxOpen = max(g.maxOpen, g.open)
		g.mu.Unlock()
		done := make(chan struct{})
		go func() { _, _, _ = ws.Read(ctx); close(done) }() // until the node gives up
		if g.holdFor > 0 {
			select {
			case <-done:
			case <-time.After(g.holdFor):
			}
		} else {
			<-done
		}
		g.mu.Lock()
		g.open-- // before the close: the node sees it after this
		g.mu.Unlock()
		_ = ws.CloseNow()
		return
	}
	nonce := "nonce-" + strconv.FormatInt(time.Now().UnixNano(), 10)
	ts := time.Now().UnixMilli()
	write := func(v any) error {
		b, _ := json.Marshal(v)
		return ws.Write(ctx, websocket.MessageText, b)
	}
	if write(map[string]any{"type": "event", "event": "connect.challenge", "payload": map[string]any{"nonce": nonce, "ts": ts}}) != nil {
		return
	}
	_, b, err := ws.Read(ctx)
	if err != nil {
		return
	}
	var req struct {
		ID     string          `json:"id"`
		Method string          `json:"method"`
		Params json.RawMessage `json:"params"`
	}
	_ = json.Unmarshal(b, &req)
	var p connectParams
	_ = json.Unmarshal(req.Params, &p)
	g.mu.Lock()
	n := len(g.connects)
	g.connects = append(g.connects, p)
	g.mu.Unlock()
	refuse := func(e *gwError) {
		_ = write(map[string]any{"type": "res", "id": req.ID, "ok": false, "error": e})
		ws.Close(websocket.StatusPolicyViolation, e.Message)
	}
	if req.Method != "connect" {
		refuse(&gwError{Code: "INVALID_REQUEST", Message: "first request must be connect"})
		return
	}
	if e := verifyDevice(p, nonce); e != "" {
		refuse(&gwError{Code: "INVALID_REQUEST", Message: "device auth failed: " + e})
		return
	}
	if p.Auth.Token != g.token {
		refuse(&gwError{Code: "INVALID_REQUEST", Message: "unauthorized: gateway token mismatch",
			Details: map[string]any{"code": "AUTH_TOKEN_MISMATCH"}})
		return
	}
	if g.refuse != nil {
		if e := g.refuse(n, p); e != nil {
			refuse(e)
			return
		}
	}
	if write(map[string]any{"type": "res", "id": req.ID, "ok": true, "payload": map[string]any{
		"type": "hello-ok", "protocol": p.MaxProtocol, "server": map[string]any{"version": "fake", "connId": "c"},
		"features": map[string]any{"methods": g.methods, "events": []string{}},
		"policy":   map[string]any{"maxPayload": 1 << 20, "maxBufferedBytes": 1 << 20, "tickIntervalMs": g.tickMs}}}) != nil {
		return
	}
	fc := &fakeConn{gw: g, ws: ws, params: p, reqs: make(chan map[string]json.RawMessage, 64),
		closed: make(chan websocket.StatusCode, 1), opened: time.Now()}
	g.conns <- fc
	tickCtx, stopTicks := context.WithCancel(ctx)
	defer stopTicks()
	if g.sendTicks {
		go func() {
			t := time.NewTicker(time.Duration(g.tickMs) * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-tickCtx.Done():
					return
				case <-t.C:
					if write(map[string]any{"type": "event", "event": "tick", "payload": map[string]any{"ts": time.Now().UnixMilli()}}) != nil {
						return
					}
				}
			}
		}()
	}
	for {
		_, b, err := ws.Read(ctx)
		if err != nil {
			fc.mu.Lock()
			fc.closedAt = time.Now()
			fc.mu.Unlock()
			fc.closed <- websocket.CloseStatus(err)
			return
		}
		var f map[string]json.RawMessage
		if json.Unmarshal(b, &f) != nil {
			continue
		}
		fc.reqs <- f
		var id, method string
		_ = json.Unmarshal(f["id"], &id)
		_ = json.Unmarshal(f["method"], &method)
		if e, ok := g.refuseMethods[method]; ok {
			_ = write(map[string]any{"type": "res", "id": id, "ok": false, "error": e})
			continue
		}
		_ = write(map[string]any{"type": "res", "id": id, "ok": true, "payload": map[string]any{"ok": true}})
	}
}

// verifyDevice checks the device proof as OpenClaw does: id = sha256 of the
// key, nonce = the challenge's, a v3 (else v2) signature.
func verifyDevice(p connectParams, nonce string) string {
	pub, err := base64.RawURLEncoding.DecodeString(p.Device.PublicKey)
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return "device-public-key"
	}
	sum := sha256.Sum256(pub)
	if hex.EncodeToString(sum[:]) != p.Device.ID {
		return "device-id-mismatch"
	}
	if p.Device.Nonce != nonce {
		return "device-nonce-mismatch"
	}
	sig, err := base64.RawURLEncoding.DecodeString(p.Device.Signature)
	if err != nil {
		return "device-signature"
	}
	base := []string{p.Device.ID, p.Client.ID, p.Client.Mode, p.Role, strings.Join(p.Scopes, ","),
		strconv.FormatInt(p.Device.SignedAt, 10), p.Auth.Token, nonce}
	v3 := strings.Join(append(append([]string{"v3"}, base...), strings.ToLower(p.Client.Platform), strings.ToLower(p.Client.DeviceFamily)), "|")
	v2 := strings.Join(append([]string{"v2"}, base...), "|")
	if ed25519.Verify(pub, []byte(v3), sig) || ed25519.Verify(pub, []byte(v2), sig) {
		return ""
	}
	return "device-signature"
}

// next waits for the next accepted connection.
func (g *fakeGateway) next(t *testing.T) *fakeConn {
	t.Helper()
	select {
	case c := <-g.conns:
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no node connection reached the gateway")
		return nil
	}
}

// send writes an event to the node.
func (c *fakeConn) send(t *testing.T, event string, payload any) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"type": "event", "event": event, "payload": payload})
	if err := c.ws.Write(context.Background(), websocket.MessageText, b); err != nil {
		t.Fatalf("send %s: %v", event, err)
	}
}

// request waits for the node's next request of a method.
func (c *fakeConn) request(t *testing.T, method string) json.RawMessage {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case f := <-c.reqs:
			var m string
			_ = json.Unmarshal(f["method"], &m)
			if m == method {
				return f["params"]
			}
		case <-deadline:
			t.Fatalf("no %s from the node", method)
			return nil
		}
	}
}

// closeStatus waits for the node to close the connection.
func (c *fakeConn) closeStatus(t *testing.T) websocket.StatusCode {
	t.Helper()
	select {
	case s := <-c.closed:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("the node did not close the connection")
		return 0
	}
}
