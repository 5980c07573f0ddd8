package xzproto

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
)

// Limits of the OTA endpoints' untrusted input, well above what firmware sends.
const (
	MaxOTABody      = 64 << 10
	MaxActivateBody = 4 << 10
)

// OTARequest is what the devicehub reads from a firmware OTA request
// (POST /xiaozhi/ota/): headers first, the JSON body as fallback.
type OTARequest struct {
	DeviceID          string // Device-Id, else body mac_address
	ClientID          string // Client-Id, else body uuid
	ActivationVersion int    // Activation-Version; 1 when absent
	SerialNumber      string // Serial-Number (activation version 2)
	UserAgent         string // "<board>/<version>"
	FirmwareVersion   string // body application.version, else the User-Agent's version
	Board             string // body board.type
}

// ParseOTARequest validates an OTA request. The body must be a JSON object
// (the firmware's system info); the fields read must have the right type.
// Device and client ids must be present in a header or the body, agree
// when both are given, and be short printable tokens.
func ParseOTARequest(h http.Header, body []byte) (OTARequest, error) {
	var r OTARequest
	if len(body) > MaxOTABody {
		return r, malformed("body larger than %d bytes", MaxOTABody)
	}
	if firstByte(body) != '{' {
		return r, malformed("body is not a JSON object")
	}
	var b struct {
		MAC         *string `json:"mac_address"`
		UUID        *string `json:"uuid"`
		Application *struct {
			Version *string `json:"version"`
		} `json:"application"`
		Board *struct {
			Type *string `json:"type"`
		} `json:"board"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return r, malformed("body: %v", err)
	}
	r.DeviceID = strings.TrimSpace(h.Get("Device-Id"))
	if b.MAC != nil {
		if r.DeviceID == "" {
			r.DeviceID = *b.MAC
		} else if !sameMAC(r.DeviceID, *b.MAC) {
			return r, malformed("Device-Id and mac_address disagree")
		}
	}
	if !validToken(r.DeviceID, 64) {
		return r, malformed("Device-Id missing or invalid")
	}
	r.ClientID = strings.TrimSpace(h.Get("Client-Id"))
	if r.ClientID == "" && b.UUID != nil {
		r.ClientID = *b.UUID
	}
	if !validToken(r.ClientID, 64) {
		return r, malformed("Client-Id missing or invalid")
	}
	r.ActivationVersion = 1
	if v := strings.TrimSpace(h.Get("Activation-Version")); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 9 {
			return r, malformed("Activation-Version is not 1 or 2")
		}
		r.ActivationVersion = n
	}
	r.SerialNumber = h.Get("Serial-Number")
	if len(r.SerialNumber) > 128 {
		return r, malformed("Serial-Number too long")
	}
	r.UserAgent = h.Get("User-Agent")
	if len(r.UserAgent) > 256 {
		r.UserAgent = r.UserAgent[:256]
	}
	if b.Application != nil && b.Application.Version != nil {
		r.FirmwareVersion = *b.Application.Version
	} else if _, v, ok := strings.Cut(r.UserAgent, "/"); ok {
		r.FirmwareVersion = v
	}
	if len(r.FirmwareVersion) > 64 {
		return r, malformed("firmware version too long")
	}
	if b.Board != nil && b.Board.Type != nil {
		r.Board = *b.Board.Type
		if len(r.Board) > 64 {
			return r, malformed("board type too long")
		}
	}
	return r, nil
}

// ActivateRequest is the body of POST /xiaozhi/ota/activate: empty ({})
// for devices without a serial number, else the HMAC answer to the
// challenge. Some clients wrap it as {"Payload":{…}}.
type ActivateRequest struct {
	Algorithm    string `json:"algorithm"`
	SerialNumber string `json:"serial_number"`
	Challenge    string `json:"challenge"`
	HMAC         string `json:"hmac"`
}

// ParseActivateRequest accepts an empty body, a bare object or one wrapped
// in "Payload"; every field present must be a string of at most 256 bytes.
func ParseActivateRequest(body []byte) (ActivateRequest, error) {
	var r ActivateRequest
	if len(body) > MaxActivateBody {
		return r, malformed("body larger than %d bytes", MaxActivateBody)
	}
	if firstByte(body) == 0 {
		return r, nil
	}
	if firstByte(body) != '{' {
		return r, malformed("body is not a JSON object")
	}
	var wrapped struct {
		Payload json.RawMessage `json:"Payload"`
	}
	if err := json.Unmarshal(body, &wrapped); err != nil {
		return r, malformed("body: %v", err)
	}
	if len(wrapped.Payload) > 0 && string(wrapped.Payload) != "null" {
		if firstByte(wrapped.Payload) != '{' {
			return r, malformed("Payload is not a JSON object")
		}
		body = wrapped.Payload
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return ActivateRequest{}, malformed("activation fields must be strings")
	}
	for _, f := range []string{r.Algorithm, r.SerialNumber, r.Challenge, r.HMAC} {
		if len(f) > 256 {
			return ActivateRequest{}, malformed("activation field longer than 256 bytes")
		}
	}
	return r, nil
}

// sameMAC compares two MAC spellings (":" / "_" / "-", any case).
func sameMAC(a, b string) bool {
	norm := func(s string) string {
		return strings.NewReplacer(":", "", "_", "", "-", "").Replace(strings.ToLower(strings.TrimSpace(s)))
	}
	return norm(a) == norm(b)
}

// validToken: 1-max bytes of letters, digits and - _ : .
func validToken(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == ':' || c == '.') {
			return false
		}
	}
	return true
}
