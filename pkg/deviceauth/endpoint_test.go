package deviceauth

import (
	"strings"
	"testing"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

func FuzzParseEndpointToken(f *testing.F) {
	for _, s := range []string{"calc-host.kid_a.c2ln.1700000000", "aa:bb:cc:dd:ee:ff.tok", ".x", "x.", "no-dot", "UPPER.t", "a b.t"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, token string) {
		device, tok, err := ParseEndpointToken(token)
		if err != nil {
			return
		}
		if c, err := wire.CanonicalDevice(device); err != nil || c != device || tok == "" || strings.Contains(device, ".") {
			t.Fatalf("accepted %q as device %q token %q", token, device, tok)
		}
		if d2, tok2, err := ParseEndpointToken(EndpointToken(device, tok)); err != nil || d2 != device || tok2 != tok {
			t.Fatalf("round trip of %q: %q %q %v", token, d2, tok2, err)
		}
	})
}
