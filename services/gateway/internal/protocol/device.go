package protocol

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"strings"

	"github.com/xiaoclaw/xiaoclaw/pkg/jsstr"
	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
)

// DeviceFailure says why a device proof was refused, with OpenClaw's
// reason (details.reason), detail code and message.
type DeviceFailure struct {
	Reason  string
	Code    string
	Message string
}

// Device proof failures, in the order OpenClaw checks them.
var (
	DeviceIDMismatch     = DeviceFailure{"device-id-mismatch", "DEVICE_AUTH_DEVICE_ID_MISMATCH", "device identity mismatch"}
	DeviceSignatureStale = DeviceFailure{"device-signature-stale", "DEVICE_AUTH_SIGNATURE_EXPIRED", "device signature expired"}
	DeviceNonceMissing   = DeviceFailure{"device-nonce-missing", "DEVICE_AUTH_NONCE_REQUIRED", "device nonce required"}
	DeviceNonceMismatch  = DeviceFailure{"device-nonce-mismatch", "DEVICE_AUTH_NONCE_MISMATCH", "device nonce mismatch"}
	DeviceSignatureBad   = DeviceFailure{"device-signature", "DEVICE_AUTH_SIGNATURE_INVALID", "device signature invalid"}
	DevicePublicKeyBad   = DeviceFailure{"device-public-key", "DEVICE_AUTH_PUBLIC_KEY_INVALID", "device public key invalid"}
)

// maxBase64DecodeLength bounds key and signature input, as OpenClaw does.
const maxBase64DecodeLength = 4096

// spkiPrefix is the DER prefix of an Ed25519 SubjectPublicKeyInfo.
var spkiPrefix = []byte{0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00}

// DecodePublicKey returns the raw key bytes of a device public key given as
// base64url (OpenClaw's wire form), base64, or an SPKI PEM.
func DecodePublicKey(publicKey string) ([]byte, bool) {
	if strings.Contains(publicKey, "BEGIN") {
		return decodePEMPublicKey(publicKey)
	}
	raw, ok := decodeBase64Loose(publicKey)
	if !ok || len(raw) == 0 {
		return nil, false
	}
	return raw, true
}

func decodePEMPublicKey(s string) ([]byte, bool) {
	block, _ := pem.Decode([]byte(strings.TrimSpace(s)))
	if block == nil {
		return nil, false
	}
	if len(block.Bytes) == len(spkiPrefix)+ed25519.PublicKeySize && bytes.HasPrefix(block.Bytes, spkiPrefix) {
		return block.Bytes[len(spkiPrefix):], true
	}
	key, err := x509.ParsePKIXPublicKey(block.Bytes)
	if err != nil {
		return nil, false
	}
	pub, ok := key.(ed25519.PublicKey)
	return pub, ok
}

// decodeBase64Loose accepts base64url or base64, padded or not, as the
// Node.js decoder OpenClaw uses does for well-formed input.
func decodeBase64Loose(s string) ([]byte, bool) {
	if len(s) == 0 || len(s) > maxBase64DecodeLength {
		return nil, false
	}
	s = strings.TrimRight(s, "=")
	s = strings.NewReplacer("+", "-", "/", "_").Replace(s)
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return nil, false
	}
	return b, true
}

// DeviceIDFromPublicKey is the lower-case hex SHA-256 of the raw key.
func DeviceIDFromPublicKey(publicKey string) (string, bool) {
	raw, ok := DecodePublicKey(publicKey)
	if !ok {
		return "", false
	}
	return occlient.DeviceID(raw), true
}

// DeviceCheck is what a device proof is verified against.
type DeviceCheck struct {
	Params *ConnectParams
	Role   string   // role after defaulting
	Scopes []string // requested scopes, in the order sent
	Nonce  string   // the challenge nonce of this connection
	NowMs  int64
}

// VerifyDevice verifies params.Device exactly as OpenClaw does: id =
// sha256(public key), |now-signedAt| within 120 s, nonce equal to the
// challenge, then an Ed25519 signature over the v3 payload, else the v2
// payload. It returns the payload version that verified ("v3" or "v2").
func VerifyDevice(c DeviceCheck) (string, *DeviceFailure) {
	d := c.Params.Device
	id, ok := DeviceIDFromPublicKey(Str(d.PublicKey))
	if !ok || id != Str(d.ID) {
		return "", &DeviceIDMismatch
	}
	if d.SignedAt == nil || abs64(c.NowMs-*d.SignedAt) > DeviceSignatureSkewMs {
		return "", &DeviceSignatureStale
	}
	nonce := jsstr.Trim(Str(d.Nonce))
	if nonce == "" {
		return "", &DeviceNonceMissing
	}
	if nonce != c.Nonce {
		return "", &DeviceNonceMismatch
	}
	raw, ok := DecodePublicKey(Str(d.PublicKey))
	if !ok || len(raw) != ed25519.PublicKeySize {
		// OpenClaw derives the id from any key bytes but can only verify a
		// 32-byte key, so a wrong-length key fails as a bad signature.
		return "", &DeviceSignatureBad
	}
	sig, ok := decodeBase64Loose(Str(d.Signature))
	if !ok {
		return "", &DeviceSignatureBad
	}
	p := c.Params
	client := p.Client
	token := p.SignatureToken()
	v3 := occlient.SignaturePayloadV3(Str(d.ID), Str(client.ID), Str(client.Mode), c.Role, c.Scopes, *d.SignedAt, token, nonce,
		Str(client.Platform), Str(client.DeviceFamily))
	if ed25519.Verify(raw, []byte(v3), sig) {
		return "v3", nil
	}
	v2 := occlient.SignaturePayloadV2(Str(d.ID), Str(client.ID), Str(client.Mode), c.Role, c.Scopes, *d.SignedAt, token, nonce)
	if ed25519.Verify(raw, []byte(v2), sig) {
		return "v2", nil
	}
	return "", &DeviceSignatureBad
}

func abs64(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}
