package wire

import (
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
)

func TestInflightLimitsHeader(t *testing.T) {
	h := nats.Header{}
	SetInflightLimits(h, InflightLimits{})
	if _, ok := h[HeaderInflightLimits]; ok {
		t.Fatal("default limits must not add a header")
	}
	want := InflightLimits{Tenant: 200, Device: 4}
	SetInflightLimits(h, want)
	if v := h.Get(HeaderInflightLimits); v != "200,4" {
		t.Fatalf("header = %q", v)
	}
	got, err := ParseInflightLimits(h.Get(HeaderInflightLimits))
	if err != nil || got != want {
		t.Fatalf("parse = %+v, %v", got, err)
	}
	if got, err := ParseInflightLimits(""); err != nil || got != (InflightLimits{}) {
		t.Fatalf("absent header = %+v, %v", got, err)
	}
	for _, bad := range []string{"200", "200,", ",4", "-1,4", "1,-4", "+1,4", " 1,4", "1,4,5", "1000001,1", "1,99999999999999999999", "a,b", "1,4 "} {
		if l, err := ParseInflightLimits(bad); err == nil {
			t.Errorf("ParseInflightLimits(%q) = %+v, want an error", bad, l)
		}
	}
	if l, err := ParseInflightLimits("1000000,0"); err != nil || l.Tenant != MaxInflightLimit {
		t.Errorf("max limit = %+v, %v", l, err)
	}
}

func FuzzParseInflightLimits(f *testing.F) {
	for _, s := range []string{"", "200,4", "0,0", "1000000,1000000", "1000001,0", "-1,2", "1,,2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		l, err := ParseInflightLimits(v)
		if err != nil {
			return
		}
		if l.Tenant < 0 || l.Tenant > MaxInflightLimit || l.Device < 0 || l.Device > MaxInflightLimit {
			t.Fatalf("%q parsed to out-of-range %+v", v, l)
		}
		if v == "" {
			return
		}
		// Accepted values are exactly the canonical form.
		if canon := strconv.Itoa(l.Tenant) + "," + strconv.Itoa(l.Device); canon != v {
			// leading zeros are accepted; they parse to the same numbers
			back, err := ParseInflightLimits(canon)
			if err != nil || back != l {
				t.Fatalf("%q -> %+v does not round-trip through %q", v, l, canon)
			}
		}
	})
}
