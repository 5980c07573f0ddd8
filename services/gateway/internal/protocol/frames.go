// Package protocol is the OpenClaw gateway protocol (v3 and v4) as the
// xiaoclaw gateway speaks it: parsing of the frames a client sends, connect
// params and their validation, device-signature verification, the error
// catalogue with OpenClaw's codes, messages and details, and allocation-light
// encoders for the frames the gateway sends.
//
// Every object the gateway emits is closed: absent fields are omitted, never
// null, because the stock client drops frames with nulls or extra keys.
package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
)

// Protocol versions the gateway negotiates.
const (
	V3 = 3 // S-era clients, and current node hosts after their fallback
	V4 = 4 // current release
)

// Limits and timings OpenClaw advertises; the gateway's defaults follow them.
const (
	// MaxPreauthPayload caps every frame before hello-ok; a larger frame
	// closes the socket with 1009 "preauth payload too large".
	MaxPreauthPayload = 64 << 10
	// DeviceSignatureSkewMs is how far device.signedAt may be from now.
	DeviceSignatureSkewMs = 120_000
)

// WebSocket close codes and reasons OpenClaw uses.
const (
	CloseNormal          = 1000
	CloseProtocolError   = 1002
	ClosePolicyViolation = 1008
	CloseTooBig          = 1009
	CloseServiceRestart  = 1012

	ReasonPreauthTooLarge      = "preauth payload too large"
	ReasonPayloadTooLarge      = "payload too large"
	ReasonProtocolMismatch     = "protocol mismatch"
	ReasonInvalidRole          = "invalid role"
	ReasonServiceRestart       = "service restart"
	ReasonSlowConsumer         = "slow consumer"
	ReasonRepeatedUnauthorized = "repeated unauthorized calls"
	ReasonDeviceRequired       = "device identity required"
	ReasonReplaced             = "node replaced by a newer connection"
	// ReasonHandshakeTimeout prefixes the close reason of a socket that
	// did not complete connect in time (OpenClaw sends an empty close
	// frame, which tells the client nothing).
	ReasonHandshakeTimeout = "handshake timeout"
	// ReasonTooManyInflight closes a connection that keeps sending
	// requests at twice its in-flight cap.
	ReasonTooManyInflight = "too many requests in flight"

	// CloseAuthChanged closes a connection whose credential no longer
	// holds (revoked token, suspended tenant), as OpenClaw does when its
	// shared secret rotates.
	CloseAuthChanged  = 4001
	ReasonAuthChanged = "gateway auth changed"
)

// Request is a parsed "req" frame. Params stays raw: each method decodes it
// into its own type, so a frame is parsed once.
type Request struct {
	ID     string
	Method string
	Params json.RawMessage
	// Traceparent is the W3C trace context of protocol v4 frames ("" when
	// absent or not a string); its validity is the tracer's business.
	Traceparent string
}

// FrameError says why bytes are not a valid request frame. ID is the frame's
// id when it had a string one, for the error response.
type FrameError struct {
	ID  string
	Msg string
}

func (e *FrameError) Error() string { return e.Msg }

// wireRequest mirrors RequestFrame; pointers tell missing from empty.
type wireRequest struct {
	Type   *string         `json:"type"`
	ID     *string         `json:"id"`
	Method *string         `json:"method"`
	Params json.RawMessage `json:"params"`
	// Traceparent stays raw: a value of the wrong type is ignored rather
	// than failing the frame.
	Traceparent json.RawMessage `json:"traceparent"`
}

// ParseRequest parses one client frame. Unknown keys are ignored (newer
// clients add fields such as traceparent); everything else is checked as
// OpenClaw's RequestFrame schema does.
func ParseRequest(data []byte) (Request, *FrameError) {
	var w wireRequest
	if err := json.Unmarshal(data, &w); err != nil {
		fe := &FrameError{Msg: DescribeJSONError(err)}
		if w.ID != nil {
			fe.ID = *w.ID
		}
		return Request{}, fe
	}
	fe := &FrameError{}
	if w.ID != nil {
		fe.ID = *w.ID
	}
	switch {
	case w.Type == nil:
		fe.Msg = "must have required property 'type'"
	case *w.Type != "req":
		fe.Msg = "at /type: must be equal to constant"
	case w.ID == nil:
		fe.Msg = "must have required property 'id'"
	case *w.ID == "":
		fe.Msg = "at /id: must NOT have fewer than 1 characters"
	case w.Method == nil:
		fe.Msg = "must have required property 'method'"
	case *w.Method == "":
		fe.Msg = "at /method: must NOT have fewer than 1 characters"
	default:
		p := w.Params
		if isNull(p) {
			p = nil
		}
		return Request{ID: *w.ID, Method: *w.Method, Params: p, Traceparent: traceparent(w.Traceparent)}, nil
	}
	return Request{}, fe
}

// traceparent returns a JSON string value that needs no unescaping (a
// valid traceparent never does), else "". Longer values than the v4 schema
// allows are dropped unread.
func traceparent(raw json.RawMessage) string {
	if len(raw) < 2 || len(raw) > 2+maxTraceparentLen || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return ""
	}
	v := raw[1 : len(raw)-1]
	for _, c := range v {
		if c == '\\' || c == '"' || c < 0x20 {
			return ""
		}
	}
	return string(v)
}

// maxTraceparentLen is the v4 schema's limit of RequestFrame.traceparent.
const maxTraceparentLen = 128

func isNull(raw json.RawMessage) bool {
	return len(raw) == 4 && string(raw) == "null"
}

// DescribeJSONError turns a decoding error into the wording OpenClaw's
// schema validation uses ("at /client/id: must be string").
func DescribeJSONError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		where := ""
		if te.Field != "" {
			where = "at /" + strings.ReplaceAll(te.Field, ".", "/") + ": "
		}
		return where + "must be " + jsonKind(te.Type)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return "invalid JSON: " + se.Error()
	}
	return "invalid JSON: " + err.Error()
}

func jsonKind(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Slice, reflect.Array:
		return "array"
	default:
		return "object"
	}
}

// DecodeParams decodes method params into v. Absent params decode as {}.
// The error message is OpenClaw's "invalid <method> params: ...".
func DecodeParams(method string, params json.RawMessage, v any) *Error {
	if len(params) == 0 {
		params = emptyObject
	}
	if t := firstByte(params); t != '{' {
		return InvalidParams(method, "must be object")
	}
	if err := json.Unmarshal(params, v); err != nil {
		return InvalidParams(method, DescribeJSONError(err))
	}
	return nil
}

var emptyObject = json.RawMessage("{}")

func firstByte(b []byte) byte {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 {
		return 0
	}
	return b[0]
}
