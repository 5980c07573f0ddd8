package wire

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func TestCanonicalDevice(t *testing.T) {
	cases := []struct {
		in, want string
		ok       bool
	}{
		{"AA:BB:cc:dd:ee:0f", "aabbccddee0f", true},
		{"aa_bb_cc_dd_ee_0f", "aabbccddee0f", true}, // MQTT client ids use '_'
		{"aa-bb-cc-dd-ee-0f", "aabbccddee0f", true},
		{"Sensor_01", "sensor_01", true},
		{"aa:bb:cc:dd:ee", "", false}, // ':' only allowed in a full MAC
		{"", "", false},
		{"dev.1", "", false},
		{"dev*", "", false},
		{"dev>", "", false},
		{"aa:bb_cc:dd:ee:ff", "", false}, // mixed separators
		{strings.Repeat("a", 65), "", false},
	}
	for _, c := range cases {
		got, err := CanonicalDevice(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("CanonicalDevice(%q) = %q, %v; want %q ok=%v", c.in, got, err, c.want, c.ok)
		}
	}
}

func TestNodeIDRoundTrip(t *testing.T) {
	dev, _ := CanonicalDevice("aa:bb:cc:dd:ee:ff")
	id := DeviceNodeID(dev)
	if id != "xz-aabbccddeeff" {
		t.Fatalf("node id %q", id)
	}
	back, ok := DeviceFromNodeID(id)
	if !ok || back != dev {
		t.Fatalf("DeviceFromNodeID(%q) = %q %v", id, back, ok)
	}
	for _, bad := range []string{"xz-", "abc", "xz-AB", "xz-a.b"} {
		if _, ok := DeviceFromNodeID(bad); ok {
			t.Errorf("DeviceFromNodeID(%q) accepted", bad)
		}
	}
}

func TestValidTenant(t *testing.T) {
	for _, ok := range []string{"dev", "acme-eu", "t1"} {
		if err := ValidTenant(ok); err != nil {
			t.Errorf("ValidTenant(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-a", "A", "a.b", "a*", "a>", "_sys", strings.Repeat("a", 64)} {
		if ValidTenant(bad) == nil {
			t.Errorf("ValidTenant(%q) accepted", bad)
		}
	}
}

func TestSubjects(t *testing.T) {
	if s := DeviceRPC("dev", "aabbccddeeff"); s != "xc.dev.dev.aabbccddeeff.rpc" {
		t.Fatal(s)
	}
	tn, d, ok := DeviceFromSubject(DeviceState("acme", "aabbccddeeff"))
	if !ok || tn != "acme" || d != "aabbccddeeff" {
		t.Fatalf("DeviceFromSubject: %q %q %v", tn, d, ok)
	}
	if _, ok := TenantFromSubject(SubjectHubResync); ok {
		t.Fatal("system subject must not parse as a tenant subject")
	}
	if tn, ok := TenantFromSubject(NodeInvoke("acme")); !ok || tn != "acme" {
		t.Fatal("NodeInvoke tenant")
	}
}

func TestDeadlineHeader(t *testing.T) {
	h := nats.Header{}
	SetTimeout(h, time.Now().Add(2*time.Second))
	d := time.Until(Deadline(h, time.Minute))
	if d <= time.Second || d > 2*time.Second {
		t.Fatalf("deadline %v, want about 2s", d)
	}
	// The receiver's cap wins over a longer request.
	if d := time.Until(Deadline(h, 500*time.Millisecond)); d > 500*time.Millisecond {
		t.Fatalf("cap not applied: %v", d)
	}
	h.Set(HeaderTimeout, "garbage")
	if d := time.Until(Deadline(h, time.Second)); d <= 0 || d > time.Second {
		t.Fatalf("bad header must fall back to the cap: %v", d)
	}
}

// FuzzCanonicalDevice: ids from devices are untrusted; whatever is accepted
// must be a safe subject token and canonical.
func FuzzCanonicalDevice(f *testing.F) {
	for _, s := range []string{"aa:bb:cc:dd:ee:ff", "AA_BB_CC_DD_EE_FF", "x", "a.b", "*", ">", " ", "aa:bb:cc:dd:ee:f\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c, err := CanonicalDevice(s)
		if err != nil {
			return
		}
		if c == "" || strings.ContainsAny(c, ".*> \t\r\n:") || len(c) > maxIDLen {
			t.Fatalf("unsafe canonical id %q from %q", c, s)
		}
		if again, err := CanonicalDevice(c); err != nil || again != c {
			t.Fatalf("not idempotent: %q -> %q (%v)", c, again, err)
		}
		if _, ok := DeviceFromNodeID(DeviceNodeID(c)); !ok {
			t.Fatalf("node id of %q does not parse back", c)
		}
	})
}
