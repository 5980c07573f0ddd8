package protocol

import (
	"strconv"
	"unicode/utf8"
)

// AppendString appends s as a JSON string. Invalid UTF-8 becomes U+FFFD and
// U+2028/U+2029 are escaped, as encoding/json does; HTML characters are
// left alone (nothing here is embedded in HTML).
func AppendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// AppendStringBytes is AppendString for a byte slice.
func AppendStringBytes(dst []byte, b []byte) []byte {
	// The conversion does not allocate: the compiler sees the string does
	// not escape AppendString.
	return AppendString(dst, string(b))
}

const hexDigits = "0123456789abcdef"

// AppendResponse appends a successful "res" frame; payload must be valid
// JSON (nil means no payload key).
func AppendResponse(dst []byte, id string, payload []byte) []byte {
	dst = append(dst, `{"type":"res","id":`...)
	dst = AppendString(dst, id)
	dst = append(dst, `,"ok":true`...)
	if len(payload) > 0 {
		dst = append(dst, `,"payload":`...)
		dst = append(dst, payload...)
	}
	return append(dst, '}')
}

// AppendErrorResponse appends a failed "res" frame.
func AppendErrorResponse(dst []byte, id string, e *Error) []byte {
	dst = append(dst, `{"type":"res","id":`...)
	dst = AppendString(dst, id)
	dst = append(dst, `,"ok":false,"error":`...)
	dst = AppendError(dst, e)
	return append(dst, '}')
}

// AppendError appends an ErrorShape object.
func AppendError(dst []byte, e *Error) []byte {
	dst = append(dst, `{"code":`...)
	dst = AppendString(dst, e.Code)
	dst = append(dst, `,"message":`...)
	dst = AppendString(dst, e.Message)
	if len(e.Details) > 0 {
		dst = append(dst, `,"details":`...)
		dst = append(dst, e.Details...)
	}
	if e.Retryable {
		dst = append(dst, `,"retryable":true`...)
	}
	if e.RetryAfterMs > 0 {
		dst = append(dst, `,"retryAfterMs":`...)
		dst = strconv.AppendInt(dst, e.RetryAfterMs, 10)
	}
	return append(dst, '}')
}

// NoSeq marks an event sent to one connection only (no seq key).
const NoSeq = -1

// AppendEvent appends an "event" frame; payload nil omits the key and seq
// NoSeq omits the seq.
func AppendEvent(dst []byte, event string, payload []byte, seq int64) []byte {
	dst = AppendEventPrefix(dst, event, payload)
	return AppendEventSeq(dst, seq)
}

// AppendEventPrefix appends an event frame up to (not including) its seq,
// so a broadcast encodes the payload once and each connection adds its seq.
func AppendEventPrefix(dst []byte, event string, payload []byte) []byte {
	dst = append(dst, `{"type":"event","event":`...)
	dst = AppendString(dst, event)
	if len(payload) > 0 {
		dst = append(dst, `,"payload":`...)
		dst = append(dst, payload...)
	}
	return dst
}

// AppendEventSeq completes a frame begun with AppendEventPrefix.
func AppendEventSeq(dst []byte, seq int64) []byte {
	if seq != NoSeq {
		dst = append(dst, `,"seq":`...)
		dst = strconv.AppendInt(dst, seq, 10)
	}
	return append(dst, '}')
}

// Challenge is the connect.challenge payload.
func Challenge(nonce string, tsMs int64) []byte {
	b := AppendString([]byte(`{"nonce":`), nonce)
	b = append(b, `,"ts":`...)
	b = strconv.AppendInt(b, tsMs, 10)
	return append(b, '}')
}

// Tick is the tick payload.
func Tick(tsMs int64) []byte {
	return append(strconv.AppendInt([]byte(`{"ts":`), tsMs, 10), '}')
}

// Shutdown is the shutdown payload.
func Shutdown(reason string, restartExpectedMs int64) []byte {
	b := AppendString([]byte(`{"reason":`), reason)
	if restartExpectedMs > 0 {
		b = append(b, `,"restartExpectedMs":`...)
		b = strconv.AppendInt(b, restartExpectedMs, 10)
	}
	return append(b, '}')
}

// Hello is the hello-ok payload.
type Hello struct {
	Type     string      `json:"type"`
	Protocol int         `json:"protocol"`
	Server   HelloServer `json:"server"`
	Features Features    `json:"features"`
	Snapshot Snapshot    `json:"snapshot"`
	Auth     HelloAuth   `json:"auth"`
	Policy   Policy      `json:"policy"`
}

// HelloServer names the server and this connection.
type HelloServer struct {
	Version string `json:"version"`
	ConnID  string `json:"connId"`
}

// Features lists the methods and events the gateway offers.
type Features struct {
	Methods []string `json:"methods"`
	Events  []string `json:"events"`
}

// Snapshot is the minimal state snapshot; presence and health are empty.
type Snapshot struct {
	Presence     []struct{}   `json:"presence"`
	Health       struct{}     `json:"health"`
	StateVersion StateVersion `json:"stateVersion"`
	UptimeMs     int64        `json:"uptimeMs"`
	AuthMode     string       `json:"authMode,omitempty"`
}

// StateVersion is the snapshot's version counters.
type StateVersion struct {
	Presence int64 `json:"presence"`
	Health   int64 `json:"health"`
}

// HelloAuth tells the client which role and scopes it was granted.
type HelloAuth struct {
	Method string   `json:"method,omitempty"` // v4 only
	Role   string   `json:"role"`
	Scopes []string `json:"scopes"`
}

// Policy is the connection policy the client must respect.
type Policy struct {
	MaxPayload       int64 `json:"maxPayload"`
	MaxBufferedBytes int64 `json:"maxBufferedBytes"`
	TickIntervalMs   int64 `json:"tickIntervalMs"`
}

// Encode marshals the hello payload.
func (h *Hello) Encode() []byte {
	if h.Snapshot.Presence == nil {
		h.Snapshot.Presence = []struct{}{}
	}
	if h.Auth.Scopes == nil {
		h.Auth.Scopes = []string{}
	}
	return mustJSON(h)
}
