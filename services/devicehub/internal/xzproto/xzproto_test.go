package xzproto

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
)

func TestParseCredentials(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hdr     http.Header
		query   string
		want    Credentials
		wantErr error
	}{
		{"firmware headers", http.Header{"Authorization": {"Bearer abc"}, "Device-Id": {"aa:bb:cc:dd:ee:ff"},
			"Client-Id": {"u-1"}, "Protocol-Version": {"3"}}, "",
			Credentials{Token: "abc", DeviceID: "aa:bb:cc:dd:ee:ff", ClientID: "u-1", ProtocolVersion: 3}, nil},
		{"lower-case scheme", http.Header{"Authorization": {"bearer abc"}, "Device-Id": {"d1"}}, "",
			Credentials{Token: "abc", DeviceID: "d1", ProtocolVersion: 1}, nil},
		{"query fallback", http.Header{}, "device-id=d2&client-id=c2&authorization=Bearer%20xyz",
			Credentials{Token: "xyz", DeviceID: "d2", ClientID: "c2", ProtocolVersion: 1}, nil},
		{"bare token in query", http.Header{}, "device-id=d2&authorization=xyz",
			Credentials{Token: "xyz", DeviceID: "d2", ProtocolVersion: 1}, nil},
		{"header wins over query", http.Header{"Authorization": {"Bearer h"}, "Device-Id": {"dh"}}, "device-id=dq&authorization=q",
			Credentials{Token: "h", DeviceID: "dh", ProtocolVersion: 1}, nil},
		{"bare token in header refused", http.Header{"Authorization": {"abc"}, "Device-Id": {"d"}}, "", Credentials{}, ErrNoToken},
		{"basic auth refused", http.Header{"Authorization": {"Basic abc"}, "Device-Id": {"d"}}, "", Credentials{}, ErrNoToken},
		{"no token", http.Header{"Device-Id": {"d"}}, "", Credentials{}, ErrNoToken},
		{"no device", http.Header{"Authorization": {"Bearer abc"}}, "", Credentials{}, ErrNoDeviceID},
		{"bad protocol version", http.Header{"Authorization": {"Bearer abc"}, "Device-Id": {"d"}, "Protocol-Version": {"x"}}, "",
			Credentials{Token: "abc", DeviceID: "d", ProtocolVersion: 1}, nil},
	} {
		q, _ := url.ParseQuery(tc.query)
		got, err := ParseCredentials(tc.hdr, q)
		if !errors.Is(err, tc.wantErr) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.wantErr)
			continue
		}
		if err == nil && got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestParseHello(t *testing.T) {
	h, err := ParseHello([]byte(`{"type":"hello","version":1,"features":{"aec":true,"mcp":true},"transport":"websocket","audio_params":{}}`))
	if err != nil || h != (Hello{Version: 1, Transport: "websocket", MCP: true}) {
		t.Fatalf("firmware hello: %+v %v", h, err)
	}
	h, err = ParseHello([]byte(`{"type":"hello","audio_params":{"format":"opus"}}`))
	if err != nil || h != (Hello{}) {
		t.Fatalf("browser hello: %+v %v", h, err)
	}
	for _, bad := range []string{`{"type":"listen"}`, `{"type":"hello","version":"1"}`, `[]`, `{"type":"hello"`, ``} {
		if _, err := ParseHello([]byte(bad)); !errors.Is(err, ErrMalformed) {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseFrameAndMessage(t *testing.T) {
	f, err := ParseFrame([]byte(`{"session_id":"s1","type":"mcp","payload":{"jsonrpc":"2.0","id":7,"result":{"x":1}}}`))
	if err != nil || f.Type != "mcp" || f.SessionID != "s1" {
		t.Fatalf("%+v %v", f, err)
	}
	m, err := ParseMessage(f.Payload)
	if err != nil || m.Kind != KindResponse || !m.NumOK || m.NumID != 7 {
		t.Fatalf("%+v %v", m, err)
	}
	for payload, want := range map[string]Message{
		`{"jsonrpc":"2.0","method":"notifications/x","params":{}}`: {Kind: KindNotification, Method: "notifications/x"},
		`{"jsonrpc":"2.0","id":"a","method":"ping"}`:               {Kind: KindRequest, Method: "ping", ID: json.RawMessage(`"a"`)},
		`{"jsonrpc":"2.0","id":2.0,"error":{"message":"x"}}`:       {Kind: KindResponse, ID: json.RawMessage(`2.0`), NumID: 2, NumOK: true},
		`{"jsonrpc":"2.0","id":-1,"result":{}}`:                    {Kind: KindResponse, ID: json.RawMessage(`-1`)},
		`{"jsonrpc":"2.0","id":1.5,"result":{}}`:                   {Kind: KindResponse, ID: json.RawMessage(`1.5`)},
	} {
		got, err := ParseMessage([]byte(payload))
		if err != nil || got.Kind != want.Kind || got.Method != want.Method || got.NumOK != want.NumOK || got.NumID != want.NumID || string(got.ID) != string(want.ID) {
			t.Errorf("%s: %+v %v, want %+v", payload, got, err, want)
		}
	}
	for _, bad := range []string{`{"jsonrpc":"2.0"}`, `[1]`, `"x"`, `{"id":1`, `{"method":5}`} {
		if _, err := ParseMessage([]byte(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
	for _, bad := range []string{`[]`, `{"type":5}`, `{`, `null`} {
		if _, err := ParseFrame([]byte(bad)); err == nil {
			t.Errorf("frame %s accepted", bad)
		}
	}
}

func TestParseResponse(t *testing.T) {
	r, err := ParseResponse([]byte(`{"jsonrpc":"2.0","id":1,"error":{"message":"Unknown tool: x"}}`))
	if err != nil || r.Error == nil || r.Error.Message != "Unknown tool: x" || r.Error.Code != nil {
		t.Fatalf("device error: %+v %v", r, err)
	}
	r, err = ParseResponse([]byte(`{"jsonrpc":"2.0","id":1,"error":"boom"}`))
	if err != nil || r.Error == nil || !strings.Contains(r.Error.Message, "boom") {
		t.Fatalf("string error: %+v %v", r, err)
	}
	r, err = ParseResponse([]byte(`{"jsonrpc":"2.0","id":1,"result":{"tools":[]}}`))
	if err != nil || string(r.Result) != `{"tools":[]}` {
		t.Fatalf("result: %+v %v", r, err)
	}
	if _, err := ParseResponse([]byte(`{"jsonrpc":"2.0","id":1}`)); err == nil {
		t.Fatal("response without result or error accepted")
	}
}

func TestParseToolsPage(t *testing.T) {
	p, err := ParseToolsPage([]byte(`{"tools":[{"name":"a","inputSchema":{}},{"name":"b"}],"nextCursor":"c"}`))
	if err != nil || len(p.Tools) != 2 || p.NextCursor != "c" {
		t.Fatalf("%+v %v", p, err)
	}
	p, err = ParseToolsPage([]byte(`{"tools":[]}`))
	if err != nil || p.NextCursor != "" {
		t.Fatalf("%+v %v", p, err)
	}
	for _, bad := range []string{`{"tools":[{"description":"no name"}]}`, `{"tools":[1]}`, `{"tools":{}}`, `{"tools":[],"nextCursor":3}`, `[]`} {
		if _, err := ParseToolsPage([]byte(bad)); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestBuilders(t *testing.T) {
	req := AppendRequest(nil, 12, "tools/call", json.RawMessage(`{"name":"x"}`))
	if string(req) != `{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"x"}}` {
		t.Fatalf("%s", req)
	}
	odd := AppendRequest(nil, 1, "a\x01\"\\\xff", nil)
	var m struct{ Method string }
	if err := json.Unmarshal(odd, &m); err != nil || !strings.HasPrefix(m.Method, "a\x01\"\\") {
		t.Fatalf("method with control characters: %s %v", odd, err)
	}
	frame := AppendMCPFrame(nil, "s\"1", []byte(`{"a":1}`))
	if !json.Valid(frame) || !strings.Contains(string(frame), `"type":"mcp","payload":{"a":1}`) {
		t.Fatalf("%s", frame)
	}
	if !json.Valid(ServerHello("x")) || !json.Valid(AppendErrorResponse(nil, json.RawMessage(`"q"`), -32601, "no")) {
		t.Fatal("invalid builder output")
	}
}

func FuzzParseCredentials(f *testing.F) {
	f.Add("Bearer abc", "aa:bb:cc:dd:ee:ff", "uuid", "1", "")
	f.Add("", "", "", "", "device-id=x&authorization=Bearer%20y&client-id=z")
	f.Add("bearer  \t", "\x00", "", "999999999999", "%zz")
	f.Fuzz(func(t *testing.T, auth, dev, client, ver, rawQuery string) {
		h := http.Header{}
		h.Set("Authorization", auth)
		h.Set("Device-Id", dev)
		h.Set("Client-Id", client)
		h.Set("Protocol-Version", ver)
		q, _ := url.ParseQuery(rawQuery)
		c, err := ParseCredentials(h, q)
		if err == nil && (c.Token == "" || c.DeviceID == "") {
			t.Fatalf("accepted without token or device: %+v", c)
		}
		if c.ProtocolVersion < 1 || len(c.ClientID) > 128 {
			t.Fatalf("out of range: %+v", c)
		}
	})
}

func FuzzParseHello(f *testing.F) {
	f.Add([]byte(`{"type":"hello","version":1,"features":{"mcp":true},"transport":"websocket"}`))
	f.Add([]byte(`{"type":"hello","features":[],"version":null}`))
	f.Add([]byte(`{"type":"hello","version":1e99}`))
	f.Add([]byte(`{"type":"hello","version":3,"transport":"udp","features":{"mcp":true},"audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`))
	f.Add([]byte(`{"type":"hello","version":3,"transport":7}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHello(b)
		if err == nil && !json.Valid(b) {
			t.Fatalf("invalid JSON accepted as hello: %+v", h)
		}
	})
}

func FuzzParseFrame(f *testing.F) {
	f.Add([]byte(`{"session_id":"s","type":"mcp","payload":{"jsonrpc":"2.0","id":1,"result":{}}}`))
	f.Add([]byte(`{"type":"mcp","payload":{"jsonrpc":"2.0","method":"notifications/x"}}`))
	f.Add([]byte(`{"type":"mcp","payload":{"id":18446744073709551615,"result":1}}`))
	f.Add([]byte(` {"type":"listen","state":"start"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, err := ParseFrame(b)
		if err != nil {
			return
		}
		if !json.Valid(b) {
			t.Fatal("invalid JSON accepted as frame")
		}
		if fr.Payload == nil {
			return
		}
		m, err := ParseMessage(fr.Payload)
		if err != nil {
			return
		}
		if m.Kind == KindResponse && m.Method != "" || m.Kind != KindResponse && m.Kind != KindNotification && m.Kind != KindRequest {
			t.Fatalf("inconsistent message %+v", m)
		}
		if m.Kind == KindResponse {
			_, _ = ParseResponse(fr.Payload)
		}
	})
}

func FuzzParseResponse(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"result":{"tools":[{"name":"a"}],"nextCursor":"b"}}`))
	f.Add([]byte(`{"jsonrpc":"2.0","id":1,"error":{"message":"x","code":-1}}`))
	f.Add([]byte(`{"error":[1,2]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseResponse(b)
		if err != nil {
			return
		}
		if (r.Error == nil) == (r.Result == nil) {
			t.Fatalf("response must have exactly one of result and error: %+v", r)
		}
		if r.Result != nil {
			_, _ = ParseToolsPage(r.Result)
			_ = ServerInfo(r.Result)
		}
	})
}

func FuzzParseToolsPage(f *testing.F) {
	f.Add([]byte(`{"tools":[{"name":"self.get_device_status","description":"d","inputSchema":{"type":"object","properties":{}}}],"nextCursor":"self.x"}`))
	f.Add([]byte(`{"tools":null,"nextCursor":null}`))
	f.Add([]byte(`{"tools":[{"name":""}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParseToolsPage(b)
		if err != nil {
			return
		}
		for _, tl := range p.Tools {
			if !json.Valid(tl) {
				t.Fatalf("invalid tool JSON %s", tl)
			}
		}
	})
}

func FuzzParseRequest(f *testing.F) {
	f.Add([]byte(`{"jsonrpc":"2.0","id":"x","method":"tools/call","params":{"name":"a","arguments":{}}}`))
	f.Add([]byte(`{"method":"tools/list"}`))
	f.Add([]byte(`{"method":"","params":null}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseRequest(b)
		if err != nil {
			return
		}
		out := AppendRequest(nil, 1, r.Method, r.Params)
		if !json.Valid(out) {
			t.Fatalf("request %q rebuilt as invalid JSON %s", b, out)
		}
	})
}
