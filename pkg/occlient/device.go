package occlient

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/xiaoclaw/xiaoclaw/pkg/jsstr"
)

// DeviceClaims are the connect fields a device proof binds.
type DeviceClaims struct {
	ClientID, Mode, Role string
	Scopes               []string
	// Token is the auth token sent (else the device or bootstrap token).
	Token                  string
	Platform, DeviceFamily string
}

// DeviceProof is connect's params.device.
type DeviceProof struct {
	ID        string `json:"id"`
	PublicKey string `json:"publicKey"`
	Signature string `json:"signature"`
	SignedAt  int64  `json:"signedAt"`
	Nonce     string `json:"nonce"`
}

// SignDevice makes the v3 device proof of claims over the challenge nonce,
// as the stock CLI and node host do.
func SignDevice(priv ed25519.PrivateKey, c DeviceClaims, nonce string, signedAtMs int64) DeviceProof {
	pub := priv.Public().(ed25519.PublicKey)
	id := DeviceID(pub)
	payload := SignaturePayloadV3(id, c.ClientID, c.Mode, c.Role, c.Scopes, signedAtMs, c.Token, nonce, c.Platform, c.DeviceFamily)
	return DeviceProof{
		ID:        id,
		PublicKey: base64.RawURLEncoding.EncodeToString(pub),
		Signature: base64.RawURLEncoding.EncodeToString(ed25519.Sign(priv, []byte(payload))),
		SignedAt:  signedAtMs,
		Nonce:     nonce,
	}
}

// DeviceID is the device id of a public key: its lower-case hex SHA-256.
func DeviceID(pub []byte) string {
	sum := sha256.Sum256(pub)
	return hex.EncodeToString(sum[:])
}

// SignaturePayloadV3 is the string a v3 device signature covers; a gateway
// verifies against it.
func SignaturePayloadV3(deviceID, clientID, clientMode, role string, scopes []string, signedAtMs int64, token, nonce, platform, deviceFamily string) string {
	return "v3" + signaturePayloadBody(deviceID, clientID, clientMode, role, scopes, signedAtMs, token, nonce) +
		"|" + NormalizeMetadata(platform) + "|" + NormalizeMetadata(deviceFamily)
}

// SignaturePayloadV2 is the string a v2 device signature (older clients)
// covers.
func SignaturePayloadV2(deviceID, clientID, clientMode, role string, scopes []string, signedAtMs int64, token, nonce string) string {
	return "v2" + signaturePayloadBody(deviceID, clientID, clientMode, role, scopes, signedAtMs, token, nonce)
}

func signaturePayloadBody(deviceID, clientID, clientMode, role string, scopes []string, signedAtMs int64, token, nonce string) string {
	var b strings.Builder
	for _, f := range [...]string{deviceID, clientID, clientMode, role, strings.Join(scopes, ","), strconv.FormatInt(signedAtMs, 10), token, nonce} {
		b.WriteByte('|')
		b.WriteString(f)
	}
	return b.String()
}

// NormalizeMetadata trims (as JavaScript does) and ASCII-lower-cases
// platform and deviceFamily, as OpenClaw does before binding them into a v3
// signature.
func NormalizeMetadata(v string) string {
	b := []byte(jsstr.Trim(v))
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + ('a' - 'A')
		}
	}
	return string(b)
}
