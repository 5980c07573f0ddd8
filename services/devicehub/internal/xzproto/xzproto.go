// Package xzproto parses and builds the XiaoZhi device protocol messages
// the devicehub exchanges with devices: upgrade credentials, the hello
// handshake, the {"type":"mcp","payload":…} envelope, JSON-RPC 2.0 messages
// and tools/list pages. Every parser here reads untrusted device bytes and
// returns an error instead of panicking; each has a fuzz test.
package xzproto

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// ErrMalformed wraps every parse error of device input.
var ErrMalformed = errors.New("malformed device message")

func malformed(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrMalformed, fmt.Sprintf(format, a...))
}

// Credentials are what a device presents on the WebSocket upgrade.
type Credentials struct {
	Token           string // bearer token without the scheme
	DeviceID        string // Device-Id as sent
	ClientID        string // Client-Id as sent (may be empty)
	ProtocolVersion int    // Protocol-Version; 1 when absent or unparsable
}

// Credential errors; the caller answers each with 401 and logs the reason.
var (
	ErrNoToken    = errors.New("no bearer token")
	ErrNoDeviceID = errors.New("no device id")
)

// ParseCredentials reads the upgrade credentials from the headers
// (Authorization, Device-Id, Client-Id, Protocol-Version), falling back to
// the query parameters authorization, device-id and client-id that browser
// clients use. The authorization value is "Bearer <token>" (scheme
// case-insensitive) or, in the query only, the bare token.
func ParseCredentials(h http.Header, q url.Values) (Credentials, error) {
	c := Credentials{ProtocolVersion: 1}
	if v := strings.TrimSpace(h.Get("Protocol-Version")); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 && n < 256 {
			c.ProtocolVersion = n
		}
	}
	c.DeviceID = strings.TrimSpace(h.Get("Device-Id"))
	if c.DeviceID == "" {
		c.DeviceID = strings.TrimSpace(q.Get("device-id"))
	}
	c.ClientID = strings.TrimSpace(h.Get("Client-Id"))
	if c.ClientID == "" {
		c.ClientID = strings.TrimSpace(q.Get("client-id"))
	}
	if len(c.ClientID) > 128 {
		c.ClientID = c.ClientID[:128]
	}
	if auth := h.Get("Authorization"); auth != "" {
		c.Token = bearer(auth)
	} else if auth := q.Get("authorization"); auth != "" {
		c.Token = bearer(auth)
		if c.Token == "" && !strings.ContainsAny(auth, " \t") {
			c.Token = auth
		}
	}
	if c.Token == "" {
		return c, ErrNoToken
	}
	if c.DeviceID == "" {
		return c, ErrNoDeviceID
	}
	return c, nil
}

// bearer returns the token of a "Bearer <token>" value, or "".
func bearer(v string) string {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(v), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}

// Hello is what the devicehub reads from a device's hello. The frame itself
// is kept verbatim by the caller.
type Hello struct {
	Version   int    // 0 when absent
	Transport string // "" when absent (browser clients omit it)
	MCP       bool   // features.mcp
}

// ParseHello parses a text frame that must be a hello: a JSON object with
// "type":"hello". Unknown fields are ignored; version and transport are optional.
func ParseHello(frame []byte) (Hello, error) {
	var m struct {
		Type      string          `json:"type"`
		Version   json.RawMessage `json:"version"`
		Transport json.RawMessage `json:"transport"`
		Features  json.RawMessage `json:"features"`
	}
	if err := json.Unmarshal(frame, &m); err != nil {
		return Hello{}, malformed("hello is not a JSON object: %v", err)
	}
	if m.Type != "hello" {
		return Hello{}, malformed("expected a hello, got type %q", truncate(m.Type))
	}
	var h Hello
	if len(m.Version) > 0 && string(m.Version) != "null" {
		if err := json.Unmarshal(m.Version, &h.Version); err != nil {
			return Hello{}, malformed("hello version is not an integer")
		}
	}
	if len(m.Transport) > 0 && string(m.Transport) != "null" {
		if err := json.Unmarshal(m.Transport, &h.Transport); err != nil {
			return Hello{}, malformed("hello transport is not a string")
		}
	}
	if len(m.Features) > 0 && m.Features[0] == '{' {
		var f map[string]json.RawMessage
		if err := json.Unmarshal(m.Features, &f); err == nil {
			h.MCP = string(f["mcp"]) == "true"
		}
	}
	return h, nil
}

// Frame is one JSON text frame from a device, split into its envelope.
type Frame struct {
	Type      string          // "hello", "mcp", "listen", "abort", …; "" when absent
	SessionID string          // the session id the device echoes
	Payload   json.RawMessage // for "mcp": the JSON-RPC message, verbatim
}

// ParseFrame parses a device text frame. The frame must be a JSON object;
// type, session_id and payload are optional, but must be of the right type
// when present.
func ParseFrame(frame []byte) (Frame, error) {
	var f struct {
		Type      *string         `json:"type"`
		SessionID *string         `json:"session_id"`
		Payload   json.RawMessage `json:"payload"`
	}
	if len(frame) == 0 || firstByte(frame) != '{' {
		return Frame{}, malformed("frame is not a JSON object")
	}
	if err := json.Unmarshal(frame, &f); err != nil {
		return Frame{}, malformed("frame: %v", err)
	}
	var out Frame
	if f.Type != nil {
		out.Type = *f.Type
	}
	if f.SessionID != nil {
		out.SessionID = *f.SessionID
	}
	if len(f.Payload) > 0 && string(f.Payload) != "null" {
		out.Payload = f.Payload
	}
	return out, nil
}

// Kind classifies a JSON-RPC message.
type Kind int

// JSON-RPC message kinds.
const (
	KindResponse     Kind = iota + 1 // id, no method
	KindNotification                 // method, no id
	KindRequest                      // method and id
)

// Message is the routing view of one JSON-RPC message.
type Message struct {
	Kind   Kind
	Method string          // requests and notifications
	ID     json.RawMessage // verbatim; nil for notifications
	// NumID is the id as a non-negative integer and NumOK reports whether
	// it is one (only such ids can answer a request of ours).
	NumID uint64
	NumOK bool
}

// ParseMessage classifies a JSON-RPC payload: a response (id without
// method), a notification (method without id) or a request (both).
// Responses without "jsonrpc" are accepted, as some hosts omit it.
func ParseMessage(payload []byte) (Message, error) {
	if len(payload) == 0 || firstByte(payload) != '{' {
		return Message{}, malformed("JSON-RPC message is not an object")
	}
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method *string         `json:"method"`
	}
	if err := json.Unmarshal(payload, &m); err != nil {
		return Message{}, malformed("JSON-RPC message: %v", err)
	}
	hasID := len(m.ID) > 0 && string(m.ID) != "null"
	var out Message
	switch {
	case m.Method != nil && hasID:
		out.Kind = KindRequest
	case m.Method != nil:
		out.Kind = KindNotification
	case hasID:
		out.Kind = KindResponse
	default:
		return Message{}, malformed("JSON-RPC message has neither id nor method")
	}
	if m.Method != nil {
		out.Method = *m.Method
	}
	if hasID {
		out.ID = m.ID
		out.NumID, out.NumOK = numericID(m.ID)
	}
	return out, nil
}

// numericID reads an id that is a JSON number with an integral,
// non-negative value (1, 1.0 and 1e0 alike).
func numericID(raw json.RawMessage) (uint64, bool) {
	if n, err := strconv.ParseUint(string(raw), 10, 64); err == nil {
		return n, true
	}
	if len(raw) == 0 || !(raw[0] >= '0' && raw[0] <= '9') {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(raw), 64)
	if err != nil || f < 0 || f > 1<<53 || f != float64(uint64(f)) {
		return 0, false
	}
	return uint64(f), true
}

// RPCError is a JSON-RPC error object. Devices send only a message; Code
// is nil then.
type RPCError struct {
	Code    *int64          `json:"code,omitempty"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

func (e *RPCError) Error() string {
	if e.Code != nil {
		return fmt.Sprintf("%s (code %d)", e.Message, *e.Code)
	}
	return e.Message
}

// Response is a parsed JSON-RPC response: Result, or Error when it failed.
type Response struct {
	Result json.RawMessage
	Error  *RPCError
}

// ParseResponse parses a JSON-RPC response. A response carries a result
// or an error object (with at least a message); anything else is malformed.
func ParseResponse(payload []byte) (Response, error) {
	var m struct {
		Result json.RawMessage `json:"result"`
		Error  json.RawMessage `json:"error"`
	}
	if len(payload) == 0 || firstByte(payload) != '{' {
		return Response{}, malformed("response is not an object")
	}
	if err := json.Unmarshal(payload, &m); err != nil {
		return Response{}, malformed("response: %v", err)
	}
	if len(m.Error) > 0 && string(m.Error) != "null" {
		var e RPCError
		if firstByte(m.Error) != '{' || json.Unmarshal(m.Error, &e) != nil {
			// Keep the device's words even when the error is not an object.
			return Response{Error: &RPCError{Message: truncate(string(m.Error))}}, nil
		}
		return Response{Error: &e}, nil
	}
	if len(m.Result) == 0 {
		return Response{}, malformed("response has neither result nor error")
	}
	return Response{Result: m.Result}, nil
}

// ToolsPage is one tools/list result.
type ToolsPage struct {
	Tools      []json.RawMessage // each a tool object, verbatim
	NextCursor string            // "" on the last page
}

// ParseToolsPage parses a tools/list result: {"tools":[…], "nextCursor"?}.
// Each tool must be an object with a non-empty string name; an empty or
// null nextCursor means the last page.
func ParseToolsPage(result []byte) (ToolsPage, error) {
	var m struct {
		Tools      []json.RawMessage `json:"tools"`
		NextCursor json.RawMessage   `json:"nextCursor"`
	}
	if len(result) == 0 || firstByte(result) != '{' {
		return ToolsPage{}, malformed("tools/list result is not an object")
	}
	if err := json.Unmarshal(result, &m); err != nil {
		return ToolsPage{}, malformed("tools/list result: %v", err)
	}
	var p ToolsPage
	for i, t := range m.Tools {
		var tool struct {
			Name string `json:"name"`
		}
		if firstByte(t) != '{' || json.Unmarshal(t, &tool) != nil || tool.Name == "" {
			return ToolsPage{}, malformed("tool %d has no name", i)
		}
	}
	p.Tools = m.Tools
	if len(m.NextCursor) > 0 && string(m.NextCursor) != "null" {
		if err := json.Unmarshal(m.NextCursor, &p.NextCursor); err != nil {
			return ToolsPage{}, malformed("nextCursor is not a string")
		}
	}
	return p, nil
}

// ServerInfo returns the serverInfo object of an initialize result, or nil.
func ServerInfo(initResult []byte) json.RawMessage {
	var m struct {
		ServerInfo json.RawMessage `json:"serverInfo"`
	}
	if json.Unmarshal(initResult, &m) != nil || firstByte(m.ServerInfo) != '{' {
		return nil
	}
	return m.ServerInfo
}

// Request is a JSON-RPC request as a caller hands it to the devicehub: a
// method and optional object params; the devicehub assigns the id.
type Request struct {
	Method string
	Params json.RawMessage // nil when absent
}

// ParseRequest parses a caller's JSON-RPC request. Any id in it is ignored
// (the devicehub assigns its own); params must be an object when present,
// because devices drop anything else.
func ParseRequest(body []byte) (Request, error) {
	var m struct {
		Method *string         `json:"method"`
		Params json.RawMessage `json:"params"`
	}
	if len(body) == 0 || firstByte(body) != '{' {
		return Request{}, malformed("request is not a JSON object")
	}
	if err := json.Unmarshal(body, &m); err != nil {
		return Request{}, malformed("request: %v", err)
	}
	if m.Method == nil || *m.Method == "" {
		return Request{}, malformed("request has no method")
	}
	r := Request{Method: *m.Method}
	if len(m.Params) > 0 && string(m.Params) != "null" {
		if firstByte(m.Params) != '{' {
			return Request{}, malformed("params must be an object")
		}
		r.Params = m.Params
	}
	return r, nil
}

// AppendRequest appends a JSON-RPC request with a numeric id.
func AppendRequest(dst []byte, id uint64, method string, params json.RawMessage) []byte {
	dst = append(dst, `{"jsonrpc":"2.0","id":`...)
	dst = strconv.AppendUint(dst, id, 10)
	dst = append(dst, `,"method":`...)
	dst = appendJSONString(dst, method)
	if len(params) > 0 {
		dst = append(dst, `,"params":`...)
		dst = append(dst, params...)
	}
	return append(dst, '}')
}

// AppendNotification appends a JSON-RPC notification.
func AppendNotification(dst []byte, method string, params json.RawMessage) []byte {
	dst = append(dst, `{"jsonrpc":"2.0","method":`...)
	dst = appendJSONString(dst, method)
	if len(params) > 0 {
		dst = append(dst, `,"params":`...)
		dst = append(dst, params...)
	}
	return append(dst, '}')
}

// AppendErrorResponse appends a JSON-RPC error response to id (verbatim).
func AppendErrorResponse(dst []byte, id json.RawMessage, code int, message string) []byte {
	dst = append(dst, `{"jsonrpc":"2.0","id":`...)
	dst = append(dst, id...)
	dst = append(dst, `,"error":{"code":`...)
	dst = strconv.AppendInt(dst, int64(code), 10)
	dst = append(dst, `,"message":`...)
	dst = appendJSONString(dst, message)
	return append(dst, "}}"...)
}

// AppendMCPFrame wraps a JSON-RPC payload in the XiaoZhi envelope.
func AppendMCPFrame(dst []byte, sessionID string, payload []byte) []byte {
	dst = append(dst, `{"session_id":`...)
	dst = appendJSONString(dst, sessionID)
	dst = append(dst, `,"type":"mcp","payload":`...)
	dst = append(dst, payload...)
	return append(dst, '}')
}

// ServerHello renders the server hello for a WebSocket session: the
// transport the firmware requires, the session id it echoes, and the audio
// parameters of the (never sent) downlink audio.
func ServerHello(sessionID string) []byte {
	b := make([]byte, 0, 160)
	b = append(b, `{"type":"hello","transport":"websocket","session_id":`...)
	b = appendJSONString(b, sessionID)
	b = append(b, `,"audio_params":{"format":"opus","sample_rate":24000,"channels":1,"frame_duration":60}}`...)
	return b
}

// appendJSONString appends s as a JSON string (Go's strconv quoting is not
// JSON for control characters and invalid UTF-8).
func appendJSONString(dst []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			q, _ := json.Marshal(s) // invalid UTF-8 becomes U+FFFD
			return append(dst, q...)
		}
	}
	dst = append(dst, '"')
	dst = append(dst, s...)
	return append(dst, '"')
}

func firstByte(b []byte) byte {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 {
		return 0
	}
	return b[0]
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// MQTTClientID is an XiaoZhi MQTT client id,
// "GID_<group>@@@<mac with _>@@@<uuid>", split into its parts.
type MQTTClientID struct {
	Group  string // without the GID_ prefix
	Device string // the MAC as sent, e.g. aa_bb_cc_dd_ee_ff
	UUID   string // the device's Client-Id (or its MAC on older servers)
}

// MaxMQTTClientID caps the client id a device may present.
const MaxMQTTClientID = 256

// ParseMQTTClientID splits an XiaoZhi MQTT client id. The group may be
// empty; the device part must be non-empty (the caller canonicalises it);
// no part may contain "@@@".
func ParseMQTTClientID(id string) (MQTTClientID, error) {
	if len(id) > MaxMQTTClientID {
		return MQTTClientID{}, malformed("MQTT client id longer than %d bytes", MaxMQTTClientID)
	}
	parts := strings.Split(id, "@@@")
	if len(parts) != 3 {
		return MQTTClientID{}, malformed("MQTT client id is not GID_<group>@@@<mac>@@@<uuid>")
	}
	group, ok := strings.CutPrefix(parts[0], "GID_")
	if !ok {
		return MQTTClientID{}, malformed("MQTT client id does not start with GID_")
	}
	if parts[1] == "" {
		return MQTTClientID{}, malformed("MQTT client id has no device part")
	}
	return MQTTClientID{Group: group, Device: parts[1], UUID: parts[2]}, nil
}

// P2PTopic is the downlink topic of a device over MQTT: devices/p2p/<mac_>,
// where mac_ is the device part of its client id.
func P2PTopic(device string) string { return "devices/p2p/" + device }

// UDPEndpoint is the udp block of the server hello over MQTT.
type UDPEndpoint struct {
	Server string // host the device "connects" its UDP socket to
	Port   int
	Key    [16]byte // AES-128-CTR key
	Nonce  [16]byte // counter block template
}

// ServerHelloUDP renders the server hello for an MQTT session: transport
// "udp" and a complete udp block, both of which the firmware requires.
func ServerHelloUDP(sessionID string, u UDPEndpoint) []byte {
	b := make([]byte, 0, 320)
	b = append(b, `{"type":"hello","transport":"udp","session_id":`...)
	b = appendJSONString(b, sessionID)
	b = append(b, `,"audio_params":{"format":"opus","sample_rate":24000,"channels":1,"frame_duration":60},"udp":{"server":`...)
	b = appendJSONString(b, u.Server)
	b = append(b, `,"port":`...)
	b = strconv.AppendInt(b, int64(u.Port), 10)
	b = append(b, `,"key":"`...)
	b = hex.AppendEncode(b, u.Key[:])
	b = append(b, `","nonce":"`...)
	b = hex.AppendEncode(b, u.Nonce[:])
	b = append(b, `","encryption":"aes-128-ctr"}}`...)
	return b
}

// Goodbye renders the server goodbye that ends the device's audio channel;
// the firmware honours it only when session_id matches its own.
func Goodbye(sessionID string) []byte {
	b := make([]byte, 0, 64)
	b = append(b, `{"type":"goodbye","session_id":`...)
	b = appendJSONString(b, sessionID)
	return append(b, '}')
}
