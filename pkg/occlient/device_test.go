package occlient

import (
	"crypto/ed25519"
	"encoding/base64"
	"testing"
)

func TestNormalizeMetadataMatchesJavaScript(t *testing.T) {
	for in, want := range map[string]string{
		" Linux ":      "linux",
		"\ufeffDarwin": "darwin",
		"\u0085Mac":    "\u0085mac", // JS trim keeps U+0085
		"ÄBC":          "Äbc",       // only ASCII is lower-cased
		"":             "",
	} {
		if got := NormalizeMetadata(in); got != want {
			t.Errorf("NormalizeMetadata(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSignDeviceSignsTheV3Payload(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	c := DeviceClaims{ClientID: "node-host", Mode: "node", Role: "node", Scopes: []string{}, Token: "tok", Platform: " Linux", DeviceFamily: "Linux"}
	p := SignDevice(priv, c, "n-1", 1000)
	if p.ID != DeviceID(pub) || p.Nonce != "n-1" || p.SignedAt != 1000 {
		t.Fatalf("proof %+v", p)
	}
	sig, _ := base64.RawURLEncoding.DecodeString(p.Signature)
	want := "v3|" + p.ID + "|node-host|node|node||1000|tok|n-1|linux|linux"
	if got := SignaturePayloadV3(p.ID, "node-host", "node", "node", nil, 1000, "tok", "n-1", " Linux", "Linux"); got != want {
		t.Fatalf("payload %q, want %q", got, want)
	}
	if !ed25519.Verify(pub, []byte(want), sig) {
		t.Fatal("the signature does not verify over the v3 payload")
	}
}
