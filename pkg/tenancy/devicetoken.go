package tenancy

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Device credentials (docs/policy.md has the full description):
//
// WebSocket bearer token: "<kid>.<sig>.<ts>", where ts is the Unix time in
// seconds when the token was minted and sig is the unpadded base64url
// HMAC-SHA256, keyed with the device key's secret, of
// "<client-id>|<device-id>|<ts>" (the Client-Id and Device-Id headers
// exactly as the device sends them). The xiaozhi-esp32-server form
// "<sig>.<ts>" (no key id) is accepted for one configured tenant, by trying
// that tenant's active keys.
//
// MQTT: username = standard base64 of a JSON object carrying the key id,
// {"kid":"dk_…"}; password = standard base64 of HMAC-SHA256(secret,
// client_id + "|" + username). A username without "kid" is the
// xiaozhi-esp32-server convention and is tried against the configured
// tenant's active keys.

// Limits on untrusted credential strings, well above real sizes.
const (
	maxDeviceTokenLen = 512
	maxUsernameLen    = 1024
	maxClientIDLen    = 256
)

// DeviceToken is a parsed WebSocket bearer token.
type DeviceToken struct {
	KeyID string // "" for the xiaozhi-esp32-server form
	Sig   []byte // the HMAC, decoded
	TS    int64  // Unix seconds
}

// ParseDeviceToken parses "<kid>.<sig>.<ts>" or "<sig>.<ts>".
func ParseDeviceToken(s string) (DeviceToken, error) {
	if len(s) > maxDeviceTokenLen {
		return DeviceToken{}, fmt.Errorf("%w: device token too long", ErrInvalid)
	}
	parts := strings.Split(s, ".")
	var t DeviceToken
	switch len(parts) {
	case 2:
	case 3:
		if !ValidDeviceKeyID(parts[0]) {
			return DeviceToken{}, fmt.Errorf("%w: device token key id is malformed", ErrInvalid)
		}
		t.KeyID = parts[0]
		parts = parts[1:]
	default:
		return DeviceToken{}, fmt.Errorf("%w: device token is not [<kid>.]<sig>.<ts>", ErrInvalid)
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[0])
	if err != nil || len(sig) != sha256.Size {
		return DeviceToken{}, fmt.Errorf("%w: device token signature is not a base64url HMAC-SHA256", ErrInvalid)
	}
	ts, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || ts <= 0 || parts[1][0] == '+' {
		return DeviceToken{}, fmt.Errorf("%w: device token timestamp is not a positive integer", ErrInvalid)
	}
	t.Sig, t.TS = sig, ts
	return t, nil
}

// deviceTokenMAC is the HMAC a device token carries.
func deviceTokenMAC(secret, clientID, deviceID string, ts int64) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(clientID + "|" + deviceID + "|" + strconv.FormatInt(ts, 10)))
	return m.Sum(nil)
}

// FormatDeviceToken mints "<kid>.<sig>.<ts>" for the key, or the
// xiaozhi-esp32-server form "<sig>.<ts>" when kid is empty.
func FormatDeviceToken(kid, secret, clientID, deviceID string, at time.Time) string {
	ts := at.Unix()
	sig := base64.RawURLEncoding.EncodeToString(deviceTokenMAC(secret, clientID, deviceID, ts))
	tok := sig + "." + strconv.FormatInt(ts, 10)
	if kid != "" {
		tok = kid + "." + tok
	}
	return tok
}

// MQTTUsername is the decoded MQTT username.
type MQTTUsername struct {
	KeyID string `json:"kid,omitempty"`
}

// ParseMQTTUsername decodes a base64 JSON object username and returns its
// key id ("" if it names none). Other members (e.g. "ip") are ignored.
func ParseMQTTUsername(username string) (string, error) {
	if username == "" || len(username) > maxUsernameLen {
		return "", fmt.Errorf("%w: MQTT username must be 1-%d characters", ErrInvalid, maxUsernameLen)
	}
	raw, err := base64.StdEncoding.DecodeString(username)
	if err != nil {
		return "", fmt.Errorf("%w: MQTT username is not base64", ErrInvalid)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return "", fmt.Errorf("%w: MQTT username is not a base64 JSON object", ErrInvalid)
	}
	kidRaw, ok := fields["kid"]
	if !ok {
		return "", nil
	}
	var kid string
	if err := json.Unmarshal(kidRaw, &kid); err != nil || !ValidDeviceKeyID(kid) {
		return "", fmt.Errorf("%w: MQTT username kid is malformed", ErrInvalid)
	}
	return kid, nil
}

// FormatMQTTUsername encodes the username naming key kid.
func FormatMQTTUsername(kid string) string {
	b, _ := json.Marshal(MQTTUsername{KeyID: kid})
	return base64.StdEncoding.EncodeToString(b)
}

// MQTTPassword is base64(HMAC-SHA256(secret, clientID + "|" + username)).
func MQTTPassword(secret, clientID, username string) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(clientID + "|" + username))
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// ParseMQTTPassword decodes a password to the HMAC it must carry.
func ParseMQTTPassword(password string) ([]byte, error) {
	if len(password) > 64 {
		return nil, fmt.Errorf("%w: MQTT password too long", ErrInvalid)
	}
	sig, err := base64.StdEncoding.DecodeString(password)
	if err != nil || len(sig) != sha256.Size {
		return nil, fmt.Errorf("%w: MQTT password is not a base64 HMAC-SHA256", ErrInvalid)
	}
	return sig, nil
}

// DeviceFromMQTTClientID returns the device id in an XiaoZhi MQTT client id
// "GID_<group>@@@<mac with _>@@@<uuid>", or "" if it has another form.
func DeviceFromMQTTClientID(clientID string) string {
	parts := strings.Split(clientID, "@@@")
	if len(parts) != 3 || len(clientID) > maxClientIDLen {
		return ""
	}
	return parts[1]
}
