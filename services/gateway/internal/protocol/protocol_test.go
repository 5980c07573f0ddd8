package protocol

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"os"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
)

// capturedFrame is one line of testdata/frames.jsonl: frames captured
// between the real OpenClaw gateway 2026.9.6, its CLI and a node host.
type capturedFrame struct {
	Seq   int             `json:"seq"`
	Dir   string          `json:"dir"`
	Frame json.RawMessage `json:"frame"`
}

func loadFrames(t testing.TB) map[int]json.RawMessage {
	t.Helper()
	f, err := os.Open("testdata/frames.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[int]json.RawMessage{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var cf capturedFrame
		if err := json.Unmarshal(sc.Bytes(), &cf); err != nil {
			t.Fatal(err)
		}
		out[cf.Seq] = cf.Frame
	}
	return out
}

func mustRequest(t *testing.T, raw []byte) Request {
	t.Helper()
	req, ferr := ParseRequest(raw)
	if ferr != nil {
		t.Fatalf("ParseRequest(%s): %v", raw, ferr)
	}
	return req
}

// The signatures of real node hosts verify with the payload this package
// builds: the proof is byte-for-byte OpenClaw's.
func TestVerifyDeviceAcceptsCapturedNodeHostSignatures(t *testing.T) {
	frames := loadFrames(t)
	for _, seq := range []int{10, 176, 220} {
		req := mustRequest(t, frames[seq])
		p, why := ParseConnect(req.Params)
		if p == nil {
			t.Fatalf("seq %d: %s", seq, why)
		}
		check := DeviceCheck{Params: p, Role: p.RoleOrDefault(), Scopes: p.ScopesOrEmpty(), Nonce: *p.Device.Nonce, NowMs: *p.Device.SignedAt + 1000}
		ver, fail := VerifyDevice(check)
		if fail != nil || ver != "v3" {
			t.Fatalf("seq %d: captured signature refused: %v %q", seq, fail, ver)
		}
	}
}

func TestVerifyDeviceRefusalsInOpenClawOrder(t *testing.T) {
	frames := loadFrames(t)
	base := func() (*ConnectParams, DeviceCheck) {
		p, _ := ParseConnect(mustRequest(t, frames[10]).Params)
		return p, DeviceCheck{Params: p, Role: "node", Scopes: []string{}, Nonce: *p.Device.Nonce, NowMs: *p.Device.SignedAt}
	}
	cases := []struct {
		name   string
		mutate func(p *ConnectParams, c *DeviceCheck)
		want   DeviceFailure
	}{
		{"id not the key's hash", func(p *ConnectParams, _ *DeviceCheck) { *p.Device.ID = strings.Repeat("0", 64) }, DeviceIDMismatch},
		{"garbage public key", func(p *ConnectParams, _ *DeviceCheck) { *p.Device.PublicKey = "%%%" }, DeviceIDMismatch},
		{"signed 121 s ago", func(_ *ConnectParams, c *DeviceCheck) { c.NowMs += 120_001 }, DeviceSignatureStale},
		{"signed in the future", func(_ *ConnectParams, c *DeviceCheck) { c.NowMs -= 120_001 }, DeviceSignatureStale},
		{"nonce blank", func(p *ConnectParams, _ *DeviceCheck) { *p.Device.Nonce = "  " }, DeviceNonceMissing},
		{"nonce missing", func(p *ConnectParams, _ *DeviceCheck) { p.Device.Nonce = nil }, DeviceNonceMissing},
		{"nonce of another challenge", func(_ *ConnectParams, c *DeviceCheck) { c.Nonce = "other" }, DeviceNonceMismatch},
		{"platform changed after signing", func(p *ConnectParams, _ *DeviceCheck) { *p.Client.Platform = "darwin" }, DeviceSignatureBad},
		{"scopes changed after signing", func(_ *ConnectParams, c *DeviceCheck) { c.Scopes = []string{"operator.admin"} }, DeviceSignatureBad},
		{"token changed after signing", func(p *ConnectParams, _ *DeviceCheck) { *p.Auth.Token = "x" }, DeviceSignatureBad},
		{"signature not base64", func(p *ConnectParams, _ *DeviceCheck) { *p.Device.Signature = "!!" }, DeviceSignatureBad},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, c := base()
			tc.mutate(p, &c)
			_, fail := VerifyDevice(c)
			if fail == nil || *fail != tc.want {
				t.Fatalf("got %+v, want %+v", fail, tc.want)
			}
		})
	}
}

func TestVerifyDeviceAcceptsV2AndPEM(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(nil)
	p, _ := ParseConnect(mustRequest(t, loadFrames(t)[10]).Params)
	id, signedAt, nonce := occlient.DeviceID(priv.Public().(ed25519.PublicKey)), int64(1000), "n-1"
	p.Device = &DeviceProof{ID: &id, SignedAt: &signedAt, Nonce: &nonce}
	// Sign the v2 payload (no platform/deviceFamily), as older clients do.
	v2 := occlient.SignaturePayloadV2(*p.Device.ID, "node-host", "node", "node", []string{}, 1000, *p.Auth.Token, "n-1")
	sig := b64(ed25519.Sign(priv, []byte(v2)))
	p.Device.Signature = &sig
	der, _ := x509.MarshalPKIXPublicKey(priv.Public())
	pemKey := string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	p.Device.PublicKey = &pemKey
	ver, fail := VerifyDevice(DeviceCheck{Params: p, Role: "node", Scopes: []string{}, Nonce: "n-1", NowMs: 1000})
	if fail != nil || ver != "v2" {
		t.Fatalf("got %q %v, want v2", ver, fail)
	}
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

func TestParseConnectValidation(t *testing.T) {
	cli := string(loadFrames(t)[2])
	req := mustRequest(t, []byte(cli))
	if p, why := ParseConnect(req.Params); p == nil {
		t.Fatalf("captured CLI connect refused: %s", why)
	}
	cases := map[string]string{
		`{}`:                                "must have required property 'minProtocol'",
		`{"minProtocol":4,"maxProtocol":4}`: "must have required property 'client'",
		`{"minProtocol":4,"maxProtocol":4,"client":{"id":"cli","platform":"linux","mode":"cli"}}`:                          "at /client: must have required property 'version'",
		`{"minProtocol":"4","maxProtocol":4}`:                                                                              "at /minProtocol: must be integer",
		`{"minProtocol":4.5,"maxProtocol":4}`:                                                                              "at /minProtocol: must be integer",
		`{"minProtocol":4,"maxProtocol":4,"client":{"id":"","version":"1","platform":"l","mode":"cli"}}`:                   "at /client/id: must NOT have fewer than 1 characters",
		`{"minProtocol":4,"maxProtocol":4,"client":{"id":"a","version":"1","platform":"l","mode":"cli"},"device":{}}`:      "at /device: must have required property 'id'",
		`{"minProtocol":4,"maxProtocol":4,"client":{"id":"a","version":"1","platform":"l","mode":"cli"},"scopes":"admin"}`: "at /scopes: must be array",
		`[]`: "must be object",
	}
	for in, want := range cases {
		p, why := ParseConnect(json.RawMessage(in))
		if p != nil || why != want {
			t.Errorf("ParseConnect(%s) = %q, want %q", in, why, want)
		}
	}
}

func TestNegotiate(t *testing.T) {
	for _, tc := range []struct {
		min, max int64
		want     int
		ok       bool
	}{{4, 4, 4, true}, {3, 3, 3, true}, {3, 4, 4, true}, {1, 9, 4, true}, {5, 6, 0, false}, {1, 2, 0, false}} {
		got, ok := Negotiate(tc.min, tc.max)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Negotiate(%d,%d) = %d,%v", tc.min, tc.max, got, ok)
		}
	}
}

func TestParseRequestFrames(t *testing.T) {
	for seq, raw := range loadFrames(t) {
		var probe struct {
			Type string `json:"type"`
		}
		_ = json.Unmarshal(raw, &probe)
		_, ferr := ParseRequest(raw)
		if (probe.Type == "req") != (ferr == nil) {
			t.Errorf("seq %d (%s): ParseRequest error %v", seq, probe.Type, ferr)
		}
	}
	for in, want := range map[string]string{
		`{"type":"req","id":"1","method":""}`: "at /method: must NOT have fewer than 1 characters",
		`{"type":"req","method":"x"}`:         "must have required property 'id'",
		`{"type":"res","id":"1","ok":true}`:   "at /type: must be equal to constant",
		`{"type":"req","id":7,"method":"x"}`:  "at /id: must be string",
		`not json`:                            "invalid JSON: invalid character 'o' in literal null (expecting 'u')",
		`"str"`:                               "must be object",
	} {
		_, ferr := ParseRequest([]byte(in))
		if ferr == nil || ferr.Msg != want {
			t.Errorf("ParseRequest(%s) = %v, want %q", in, ferr, want)
		}
	}
}

func TestParseNodeInvoke(t *testing.T) {
	frames := loadFrames(t)
	inv, err := ParseNodeInvoke(mustRequest(t, frames[104]).Params)
	if err != nil {
		t.Fatal(err)
	}
	if inv.Command != "system.which" || inv.TimeoutMs != 15000 || string(inv.Params) != `{"bins":["uname","sh"]}` || inv.IdempotencyKey == "" {
		t.Fatalf("captured node.invoke parsed as %+v", inv)
	}
	for in, want := range map[string]string{
		`{"nodeId":"n","command":"c"}`:                                     "invalid node.invoke params: must have required property 'idempotencyKey'",
		`{"nodeId":"n","command":"c","idempotencyKey":""}`:                 "invalid node.invoke params: at /idempotencyKey: must NOT have fewer than 1 characters",
		`{"nodeId":"n","command":"c","idempotencyKey":"k","timeoutMs":-1}`: "invalid node.invoke params: at /timeoutMs: must be >= 0",
		`{"nodeId":"n","command":"c","idempotencyKey":"k","timeoutMs":0}`: "invalid node.invoke params: at /timeoutMs: must be >= 1 " +
			"(0 would expire before the node could answer; omit timeoutMs for the gateway's default)",
		`{"nodeId":"n","command":"c","idempotencyKey":"k","timeoutMs":"1"}`: "invalid node.invoke params: at /timeoutMs: must be integer",
		`{"nodeId":" ","command":"c","idempotencyKey":"k"}`:                 "nodeId and command required",
		`[1]`: "invalid node.invoke params: must be object",
		`{"nodeId":"n","command":"c","idempotencyKey":"` + strings.Repeat("k", 257) + `"}`: "invalid node.invoke params: at /idempotencyKey: must NOT have more than 256 characters",
	} {
		_, err := ParseNodeInvoke(json.RawMessage(in))
		if err == nil || err.Message != want || err.Code != CodeInvalidRequest {
			t.Errorf("ParseNodeInvoke(%.60s) = %v, want %q", in, err, want)
		}
	}
}

func TestParseNodeInvokeResult(t *testing.T) {
	r, err := ParseNodeInvokeResult(mustRequest(t, loadFrames(t)[106]).Params)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK || string(r.Payload) != `{"bins":{"uname":"/usr/bin/uname","sh":"/usr/bin/sh"}}` {
		t.Fatalf("captured result parsed as %+v (%s)", r, r.Payload)
	}
	for in, want := range map[string]string{
		`{"id":"1","nodeId":"n","ok":true,"payloadJSON":"not json"}`:       `{"payloadJSON":"not json"}`,
		`{"id":"1","nodeId":"n","ok":true,"payloadJSON":{"a":1}}`:          `{"a":1}`,
		`{"id":"1","nodeId":"n","ok":true,"payloadJSON":null,"payload":7}`: `7`,
		`{"id":"1","nodeId":"n","ok":false,"error":null}`:                  ``,
	} {
		r, err := ParseNodeInvokeResult(json.RawMessage(in))
		if err != nil || string(r.Payload) != want {
			t.Errorf("ParseNodeInvokeResult(%s) = %s, %v; want %s", in, r.Payload, err, want)
		}
	}
}

func TestParseNodeEventCaptured(t *testing.T) {
	ev, payload, err := ParseNodeEvent(mustRequest(t, loadFrames(t)[14]).Params)
	if err != nil || ev != "node.host.stats" || !json.Valid(payload) || !bytes.Contains(payload, []byte(`"cpuCount":2`)) {
		t.Fatalf("got %q %s %v", ev, payload, err)
	}
}

func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "plain", `q"uote\back`, "tab\tnl\ncr\r", "\x00\x1f\x7f", "ünï😀", "\u2028\u2029", "bad\xffutf8", "<&>"} {
		got := AppendString(nil, s)
		var back string
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("AppendString(%q) = %s: %v", s, got, err)
		}
		want := strings.ToValidUTF8(s, "\ufffd")
		if back != want {
			t.Errorf("AppendString(%q) round-trips to %q", s, back)
		}
	}
}

func TestErrorShapesAreClosed(t *testing.T) {
	for _, e := range []*Error{
		MissingScope(V4, ScopeWrite), MissingScope(V3, ScopeWrite), ProtocolMismatch(5, 6),
		AuthFailed(AuthTokenMismatch, AuthClient{ID: "cli", Mode: "cli", Local: true, HasToken: true, Device: true}),
		DeviceAuthFailed(DeviceSignatureBad), DeviceIdentityRequired(), NodeNotConnected(),
		NodeFailed("DEVICE_ERROR", "boom", true), InvokeTimedOut(true), CommandNotAllowed(ReasonNotDeclared, "linux", "x"),
		PolicyDenied(V4, "mcp.tools.call", "self.reboot", "r1", "no"), IdempotencyConflict(),
		NodeRefused("RATE_LIMITED", "over", "tenant", 5, 1000), NodeRefused("BUSY", "device busy", "", 0, 0),
	} {
		b := AppendErrorResponse(nil, "id", e)
		if !json.Valid(b) || bytes.Contains(b, []byte("null")) {
			t.Errorf("bad frame %s", b)
		}
	}
	e := AuthFailed(AuthTokenMismatch, AuthClient{ID: "cli", Mode: "cli", Local: true, HasToken: true, Device: true})
	if e.Message != "unauthorized: gateway token mismatch (use this gateway's gateway.auth.token or pair the device)" ||
		string(e.Details) != `{"code":"AUTH_TOKEN_MISMATCH","authReason":"token_mismatch","canRetryWithDeviceToken":true,"recommendedNextStep":"retry_with_device_token"}` {
		t.Errorf("auth failure = %s %s", e.Message, e.Details)
	}
}

// Fuzz targets: every parser of untrusted bytes. `go test` runs the seeds.

func frameSeeds(f *testing.F) {
	for _, raw := range loadFrames(f) {
		f.Add([]byte(raw))
	}
	for _, s := range []string{`{}`, `[]`, `null`, `{"type":"req","id":"1","method":"connect","params":null}`, "\xff", `{"type":"req","id":"","method":"m"}`} {
		f.Add([]byte(s))
	}
}

func FuzzParseRequest(f *testing.F) {
	frameSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		req, ferr := ParseRequest(data)
		if ferr == nil && (req.ID == "" || req.Method == "") {
			t.Fatalf("accepted a frame without id or method: %s", data)
		}
		if ferr != nil && ferr.Msg == "" {
			t.Fatal("error without message")
		}
		if ferr != nil {
			b := AppendErrorResponse(nil, ferr.ID, InvalidFrame(ferr.Msg))
			if !json.Valid(b) {
				t.Fatalf("invalid error frame %s", b)
			}
		}
	})
}

func FuzzConnectAndDevice(f *testing.F) {
	frameSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		req, ferr := ParseRequest(data)
		params := json.RawMessage(data)
		if ferr == nil {
			params = req.Params
		}
		p, why := ParseConnect(params)
		if p == nil {
			if why == "" {
				t.Fatal("refusal without reason")
			}
			return
		}
		if p.Device == nil {
			return
		}
		nonce := Str(p.Device.Nonce)
		_, fail := VerifyDevice(DeviceCheck{Params: p, Role: p.RoleOrDefault(), Scopes: p.ScopesOrEmpty(), Nonce: nonce, NowMs: *p.Device.SignedAt})
		if fail != nil && (fail.Code == "" || fail.Message == "") {
			t.Fatalf("incomplete failure %+v", fail)
		}
	})
}

func FuzzNodeMethodParams(f *testing.F) {
	frameSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		if inv, err := ParseNodeInvoke(data); err == nil {
			if inv.NodeID == "" || inv.Command == "" || inv.IdempotencyKey == "" || (inv.Params != nil && !json.Valid(inv.Params)) {
				t.Fatalf("bad invoke %+v", inv)
			}
		}
		if r, err := ParseNodeInvokeResult(data); err == nil && r.Payload != nil && !json.Valid(r.Payload) {
			t.Fatalf("result payload not JSON: %s", r.Payload)
		}
		if _, payload, err := ParseNodeEvent(data); err == nil && payload != nil && !json.Valid(payload) {
			t.Fatalf("event payload not JSON: %s", payload)
		}
	})
}

func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "a\"b", "\x00", "\xff\xfe", "\u2028", "😀"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := AppendString(nil, s)
		var back string
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("%q -> %s: %v", s, b, err)
		}
		if utf8.ValidString(s) && back != s {
			t.Fatalf("%q round-trips to %q", s, back)
		}
	})
}

func TestErrorWithTraceID(t *testing.T) {
	const id = "4bf92f3577b34da6a3ce929d0e0e4736"
	for _, c := range []struct{ details, want string }{
		{"", `{"traceId":"` + id + `"}`},
		{`{}`, `{"traceId":"` + id + `"}`},
		{` { } `, `{"traceId":"` + id + `"}`},
		{`{"code":"NOT_CONNECTED"}`, `{"traceId":"` + id + `","code":"NOT_CONNECTED"}`},
		{`{"traceId":"other"}`, `{"traceId":"other"}`}, // a replayed error keeps its call's trace
		{`"text"`, `"text"`},                           // not an object: left alone
	} {
		e := &Error{Code: "UNAVAILABLE", Message: "m", Details: json.RawMessage(c.details)}
		got := e.WithTraceID(id)
		if string(got.Details) != c.want {
			t.Errorf("details %q: got %s, want %s", c.details, got.Details, c.want)
		}
		if !json.Valid(AppendError(nil, got)) {
			t.Errorf("details %q: invalid error %s", c.details, AppendError(nil, got))
		}
		if string(e.Details) != c.details {
			t.Errorf("details %q: the original changed to %s", c.details, e.Details)
		}
	}
}
