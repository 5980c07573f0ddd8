package gateway_test

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/xiaoclaw/xiaoclaw/services/gateway"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/gwtest"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/protocol"
)

// capturedParams returns the params of a connect frame captured from the
// real OpenClaw CLI or node host (see internal/protocol/testdata), with the
// token replaced.
func capturedParams(t *testing.T, seq int, token string) map[string]any {
	t.Helper()
	f, err := os.Open("internal/protocol/testdata/frames.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var line struct {
			Seq   int `json:"seq"`
			Frame struct {
				Params map[string]any `json:"params"`
			} `json:"frame"`
		}
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatal(err)
		}
		if line.Seq == seq {
			p := line.Frame.Params
			p["auth"] = map[string]any{"token": token}
			return p
		}
	}
	t.Fatalf("no captured frame %d", seq)
	return nil
}

// resign replaces the device proof of captured params with one made with a
// fresh key over this connection's challenge, as the real client would.
func resign(t *testing.T, params map[string]any, ch gwtest.Challenge, priv ed25519.PrivateKey) {
	t.Helper()
	raw, _ := json.Marshal(params)
	p, why := protocol.ParseConnect(raw)
	if p == nil {
		t.Fatal(why)
	}
	gwtest.SignDevice(p, priv, ch.Nonce, ch.Ts)
	params["device"] = p.Device
}

// assertNoNull fails on any JSON null: the stock client drops such frames.
func assertNoNull(t *testing.T, raw []byte) {
	t.Helper()
	var walk func(v any) bool
	walk = func(v any) bool {
		switch x := v.(type) {
		case nil:
			return false
		case map[string]any:
			for _, e := range x {
				if !walk(e) {
					return false
				}
			}
		case []any:
			for _, e := range x {
				if !walk(e) {
					return false
				}
			}
		}
		return true
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil || !walk(v) {
		t.Fatalf("frame holds a null (or is not JSON): %s", raw)
	}
}

func keys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestCapturedCLIConnectV4GetsHelloOK(t *testing.T) {
	e := newEnv(t)
	gw := e.gateway(nil)
	c, err := gwtest.Dial(ctxT(t), gw.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if c.Challenge.Nonce == "" || c.Challenge.Ts <= 0 {
		t.Fatalf("challenge %+v", c.Challenge)
	}
	res, err := c.Connect(ctxT(t), capturedParams(t, 2, tokAdmin))
	if err != nil {
		t.Fatal(err)
	}
	assertNoNull(t, res.Raw)
	hello := payload[map[string]any](t, res)
	if got := keys(hello); !slices.Equal(got, []string{"auth", "features", "policy", "protocol", "server", "snapshot", "type"}) {
		t.Fatalf("hello-ok keys %v", got)
	}
	if hello["type"] != "hello-ok" || hello["protocol"] != 4.0 {
		t.Fatalf("hello-ok %v", hello)
	}
	server := hello["server"].(map[string]any)
	if got := keys(server); !slices.Equal(got, []string{"connId", "version"}) || server["connId"] == "" {
		t.Fatalf("server %v", server)
	}
	auth := hello["auth"].(map[string]any)
	if auth["role"] != "operator" || auth["method"] != "token" || !slices.Equal(toStrings(auth["scopes"]), []string{"operator.read"}) {
		t.Fatalf("auth %v", auth)
	}
	snap := hello["snapshot"].(map[string]any)
	if len(snap["presence"].([]any)) != 0 || len(snap["health"].(map[string]any)) != 0 ||
		snap["stateVersion"].(map[string]any)["presence"] != 0.0 || snap["uptimeMs"] == nil {
		t.Fatalf("snapshot %v", snap)
	}
	policy := hello["policy"].(map[string]any)
	if policy["maxPayload"] != 1048576.0 || policy["maxBufferedBytes"] != 52428800.0 || policy["tickIntervalMs"] != 30000.0 {
		t.Fatalf("policy %v", policy)
	}
	methods := toStrings(hello["features"].(map[string]any)["methods"])
	for _, m := range []string{"node.list", "node.describe", "node.invoke", "node.invoke.result", "node.event", "health", "skills.bins"} {
		if !slices.Contains(methods, m) {
			t.Errorf("features.methods lacks %s", m)
		}
	}
	// The granted read scope is enough for node.list, as the CLI expects.
	payload[nodeList](t, call(t, c, "node.list", map[string]any{}))
}

func toStrings(v any) []string {
	var out []string
	for _, e := range v.([]any) {
		out = append(out, e.(string))
	}
	return out
}

func TestSEraSignedCLIConnectV3(t *testing.T) {
	e := newEnv(t)
	gw := e.gateway(nil)
	c, err := gwtest.Dial(ctxT(t), gw.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	// An S-era CLI: protocol 3 only, all CLI scopes, always a signed device.
	p := gwtest.OperatorParams(tokOperator, "operator.admin", "operator.read", "operator.write", "operator.approvals", "operator.pairing")
	*p.MinProtocol, *p.MaxProtocol = 3, 3
	_, priv, _ := ed25519.GenerateKey(nil)
	gwtest.SignDevice(p, priv, c.Challenge.Nonce, time.Now().UnixMilli())
	res, err := c.Connect(ctxT(t), p)
	if err != nil {
		t.Fatal(err)
	}
	assertNoNull(t, res.Raw)
	hello := payload[map[string]any](t, res)
	auth := hello["auth"].(map[string]any)
	if hello["protocol"] != 3.0 || auth["method"] != nil {
		t.Fatalf("hello %v", hello)
	}
	// An operator principal gets read, write and pairing (node listing) only,
	// whatever it asks for: not operator.admin.
	if got := toStrings(auth["scopes"]); !slices.Equal(got, []string{"operator.read", "operator.write", "operator.pairing"}) {
		t.Fatalf("granted %v", got)
	}
}

func TestCapturedNodeHostConnectIsRegistered(t *testing.T) {
	e := newEnv(t)
	gw := e.gateway(nil)
	op := operator(t, gw, tokAdmin, "operator.read")

	c, err := gwtest.Dial(ctxT(t), gw.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	params := capturedParams(t, 10, tokAdmin)
	_, priv, _ := ed25519.GenerateKey(nil)
	resign(t, params, c.Challenge, priv)
	res, err := c.Connect(ctxT(t), params)
	if err != nil {
		t.Fatal(err)
	}
	hello := payload[map[string]any](t, res)
	auth := hello["auth"].(map[string]any)
	if hello["protocol"] != 4.0 || auth["role"] != "node" || len(auth["scopes"].([]any)) != 0 {
		t.Fatalf("hello %v", hello)
	}
	nodeID := params["device"].(*protocol.DeviceProof).ID
	n := waitListed(t, op, *nodeID, true)
	want := toStrings(params["commands"].([]any))
	sort.Strings(want)
	if n.DisplayName != "ocl-node-1" || n.Platform != "linux" || !n.Paired || n.Kind != "openclaw" ||
		n.RemoteIP != "127.0.0.1" || !slices.Equal(n.Commands, want) || n.ConnectedAtMs == 0 {
		t.Fatalf("listed as %+v", n)
	}
	// The node host's follow-up calls as captured are answered.
	for _, m := range []struct {
		method string
		params any
	}{
		{"node.event", map[string]any{"event": "node.host.stats", "payloadJSON": `{"cpuCount":2}`}},
		{"node.runnerInventory.update", map[string]any{"protocolFeatures": []string{"node-worker-supervisor-v6"}}},
		{"node.skills.update", map[string]any{"skills": []any{}}},
		{"node.pluginTools.update", map[string]any{"tools": []any{}}},
		{"skills.bins", map[string]any{}},
		{"health", map[string]any{}},
	} {
		payload[map[string]any](t, call(t, c, m.method, m.params))
	}
	c.Close()
	waitListed(t, op, *nodeID, false)
}

func TestNodeHostFallbackToProtocol3(t *testing.T) {
	e := newEnv(t)
	gw := e.gateway(nil)
	c, err := gwtest.Dial(ctxT(t), gw.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	// The captured node host connect as the current client retries it
	// against a v3 gateway: protocol 3/3 and no deviceFamily.
	params := capturedParams(t, 220, tokOperator)
	params["minProtocol"], params["maxProtocol"] = 3, 3
	delete(params["client"].(map[string]any), "deviceFamily")
	_, priv, _ := ed25519.GenerateKey(nil)
	resign(t, params, c.Challenge, priv)
	hello := payload[map[string]any](t, must(c.Connect(ctxT(t), params)))
	if hello["protocol"] != 3.0 || hello["auth"].(map[string]any)["method"] != nil {
		t.Fatalf("hello %v", hello)
	}
}

// handshakeFailure is one refused connect.
type handshakeFailure struct {
	name       string
	params     func(ch gwtest.Challenge) any
	code       string // error.code
	detailCode string
	message    string
	closeCode  websocket.StatusCode
	closeMsg   string
}

func signedNode(token string, mutate func(p *protocol.ConnectParams, ch gwtest.Challenge, priv ed25519.PrivateKey)) func(gwtest.Challenge) any {
	return func(ch gwtest.Challenge) any {
		_, priv, _ := ed25519.GenerateKey(nil)
		p := gwtest.NodeParams(token, "n1", "system.which")
		gwtest.SignDevice(p, priv, ch.Nonce, ch.Ts)
		if mutate != nil {
			mutate(p, ch, priv)
		}
		return p
	}
}

func TestHandshakeFailuresUseOpenClawCodes(t *testing.T) {
	e := newEnv(t)
	gw := e.gateway(nil)
	cases := []handshakeFailure{
		{
			name:   "bad token",
			params: func(gwtest.Challenge) any { return gwtest.OperatorParams("wrong", "operator.read") },
			code:   "INVALID_REQUEST", detailCode: "AUTH_TOKEN_MISMATCH",
			message:   "unauthorized: gateway token mismatch (use this gateway's gateway.auth.token or pair the device)",
			closeCode: 1008, closeMsg: "unauthorized: gateway token mismatch (use this gateway's gateway.auth.token or pair the device)",
		},
		{
			name: "missing token",
			params: func(gwtest.Challenge) any {
				p := gwtest.OperatorParams("", "operator.read")
				p.Auth = nil
				return p
			},
			code: "INVALID_REQUEST", detailCode: "AUTH_TOKEN_MISSING",
			message:   "unauthorized: gateway token missing (use this gateway's gateway.auth.token or pair the device)",
			closeCode: 1008, closeMsg: "unauthorized: gateway token missing (use this gateway's gateway.auth.token or pair the device)",
		},
		{
			name: "bad signature",
			params: signedNode(tokAdmin, func(p *protocol.ConnectParams, _ gwtest.Challenge, priv ed25519.PrivateKey) {
				// Signed by the right key, but over other bytes.
				sig := base64.RawURLEncoding.EncodeToString(ed25519.Sign(priv, []byte("something else")))
				p.Device.Signature = &sig
			}),
			code: "INVALID_REQUEST", detailCode: "DEVICE_AUTH_SIGNATURE_INVALID", message: "device signature invalid",
			closeCode: 1008, closeMsg: "device signature invalid",
		},
		{
			name: "stale signedAt",
			params: signedNode(tokAdmin, func(p *protocol.ConnectParams, ch gwtest.Challenge, priv ed25519.PrivateKey) {
				gwtest.SignDevice(p, priv, ch.Nonce, ch.Ts-121_000)
			}),
			code: "INVALID_REQUEST", detailCode: "DEVICE_AUTH_SIGNATURE_EXPIRED", message: "device signature expired",
			closeCode: 1008, closeMsg: "device signature expired",
		},
		{
			name: "nonce of another challenge",
			params: signedNode(tokAdmin, func(p *protocol.ConnectParams, ch gwtest.Challenge, priv ed25519.PrivateKey) {
				gwtest.SignDevice(p, priv, "8f8a7eee-6bd8-4272-932c-cd1f7aa069e9", ch.Ts)
			}),
			code: "INVALID_REQUEST", detailCode: "DEVICE_AUTH_NONCE_MISMATCH", message: "device nonce mismatch",
			closeCode: 1008, closeMsg: "device nonce mismatch",
		},
		{
			name: "device id not the key's hash",
			params: signedNode(tokAdmin, func(p *protocol.ConnectParams, _ gwtest.Challenge, _ ed25519.PrivateKey) {
				*p.Device.ID = "9be53a609b31554634b88ee42bd9884793b2cfe3b96b8cf478341f469e7d7761"
			}),
			code: "INVALID_REQUEST", detailCode: "DEVICE_AUTH_DEVICE_ID_MISMATCH", message: "device identity mismatch",
			closeCode: 1008, closeMsg: "device identity mismatch",
		},
		{
			name: "protocol range without 3 or 4",
			params: func(gwtest.Challenge) any {
				p := gwtest.OperatorParams(tokAdmin)
				*p.MinProtocol, *p.MaxProtocol = 5, 6
				return p
			},
			code: "INVALID_REQUEST", detailCode: "PROTOCOL_MISMATCH", message: "protocol mismatch",
			closeCode: 1002, closeMsg: "protocol mismatch",
		},
		{
			name: "node without device identity",
			params: func(gwtest.Challenge) any {
				return gwtest.NodeParams(tokAdmin, "n1", "system.which")
			},
			code: "NOT_PAIRED", detailCode: "DEVICE_IDENTITY_REQUIRED", message: "device identity required",
			closeCode: 1008, closeMsg: "device identity required",
		},
		{
			name:   "viewer token as node host",
			params: signedNode(tokViewer, nil),
			code:   "INVALID_REQUEST", detailCode: "AUTH_UNAUTHORIZED",
			message:   "unauthorized: this token may not connect as a node (use an operator or admin token)",
			closeCode: 1008, closeMsg: "unauthorized: this token may not connect as a node (use an operator or admin token)",
		},
		{
			name: "unknown role",
			params: func(gwtest.Challenge) any {
				p := gwtest.OperatorParams(tokAdmin)
				r := "superuser"
				p.Role = &r
				return p
			},
			code: "INVALID_REQUEST", message: "invalid role", closeCode: 1008, closeMsg: "invalid role",
		},
		{
			name: "connect params without client version",
			params: func(gwtest.Challenge) any {
				return map[string]any{"minProtocol": 4, "maxProtocol": 4, "client": map[string]any{"id": "cli", "platform": "linux", "mode": "cli"}}
			},
			code:      "INVALID_REQUEST",
			message:   "invalid connect params: at /client: must have required property 'version'",
			closeCode: 1008, closeMsg: "invalid connect params: at /client: must have required property 'version'",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := gwtest.Dial(ctxT(t), gw.URL())
			if err != nil {
				t.Fatal(err)
			}
			defer c.CloseNow()
			res, err := c.Connect(ctxT(t), tc.params(c.Challenge))
			if err != nil {
				t.Fatal(err)
			}
			assertNoNull(t, res.Raw)
			fe := failure(t, res)
			if fe.Code != tc.code || fe.Message != tc.message || fe.DetailCode() != tc.detailCode {
				t.Fatalf("got %s %q details %s", fe.Code, fe.Message, fe.Details)
			}
			code, reason, err := c.CloseStatus(waitFor)
			if err != nil || code != tc.closeCode || reason != tc.closeMsg {
				t.Fatalf("closed with %d %q (%v), want %d %q", code, reason, err, tc.closeCode, tc.closeMsg)
			}
		})
	}
}

func TestAuthFailureDetails(t *testing.T) {
	e := newEnv(t)
	gw := e.gateway(nil)
	c, err := gwtest.Dial(ctxT(t), gw.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	// A wrong token with a signed device: OpenClaw suggests the device token.
	_, priv, _ := ed25519.GenerateKey(nil)
	p := gwtest.OperatorParams("wrong", "operator.read")
	gwtest.SignDevice(p, priv, c.Challenge.Nonce, c.Challenge.Ts)
	fe := failure(t, must(c.Connect(ctxT(t), p)))
	want := `{"code":"AUTH_TOKEN_MISMATCH","authReason":"token_mismatch","canRetryWithDeviceToken":true,"recommendedNextStep":"retry_with_device_token"}`
	if string(fe.Details) != want {
		t.Fatalf("details %s", fe.Details)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestPreauthFrameRules(t *testing.T) {
	e := newEnv(t)
	gw := e.gateway(func(c *gateway.Config) { c.HandshakeTimeout = 300 * time.Millisecond })

	t.Run("first request not connect", func(t *testing.T) {
		c, _ := gwtest.Dial(ctxT(t), gw.URL())
		defer c.CloseNow()
		fe := failure(t, must(c.Call(ctxT(t), "node.list", map[string]any{})))
		const msg = "invalid handshake: first request must be connect"
		if fe.Code != "INVALID_REQUEST" || fe.Message != msg {
			t.Fatalf("got %+v", fe)
		}
		if code, reason, _ := c.CloseStatus(waitFor); code != 1008 || reason != msg {
			t.Fatalf("closed with %d %q", code, reason)
		}
	})
	t.Run("not a request frame", func(t *testing.T) {
		c, _ := gwtest.Dial(ctxT(t), gw.URL())
		defer c.CloseNow()
		if err := c.SendRaw(ctxT(t), []byte(`{"hello":`)); err != nil {
			t.Fatal(err)
		}
		if code, reason, _ := c.CloseStatus(waitFor); code != 1008 || reason != "invalid request frame" {
			t.Fatalf("closed with %d %q", code, reason)
		}
	})
	t.Run("oversize pre-auth frame", func(t *testing.T) {
		c, _ := gwtest.Dial(ctxT(t), gw.URL())
		defer c.CloseNow()
		big := append([]byte(`{"type":"req","id":"1","method":"connect","params":{"pad":"`), bytes.Repeat([]byte("x"), 70_000)...)
		big = append(big, `"}}`...)
		if err := c.SendRaw(ctxT(t), big); err != nil {
			t.Fatal(err)
		}
		if code, reason, _ := c.CloseStatus(waitFor); code != 1009 || reason != "preauth payload too large" {
			t.Fatalf("closed with %d %q", code, reason)
		}
	})
	t.Run("frame just under the cap is parsed", func(t *testing.T) {
		c, _ := gwtest.Dial(ctxT(t), gw.URL())
		defer c.CloseNow()
		p := map[string]any{"minProtocol": 4, "maxProtocol": 4, "pad": strings.Repeat("x", 60_000),
			"client": map[string]any{"id": "cli", "version": "1", "platform": "linux", "mode": "cli"}, "auth": map[string]any{"token": tokAdmin}}
		if res := must(c.Connect(ctxT(t), p)); !res.OK {
			t.Fatalf("refused: %+v", res.Error)
		}
	})
	t.Run("handshake timeout", func(t *testing.T) {
		c, _ := gwtest.Dial(ctxT(t), gw.URL())
		defer c.CloseNow()
		// OpenClaw closes without a status code (1005); the reason says why.
		if code, reason, _ := c.CloseStatus(waitFor); code != 1008 || reason != "handshake timeout: no connect within 300ms" {
			t.Fatalf("closed with %d %q", code, reason)
		}
	})
}
