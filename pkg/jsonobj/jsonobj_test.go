package jsonobj

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestWalk(t *testing.T) {
	raw := []byte(` { "a" : 1 ,"b":"x,}\"]","c":{"d":[1,{"e":"}"}]},"f":[],"g\u0068":null,"i":true, "j":-1.5e3 } `)
	var got []string
	err := Walk(raw, func(m Member) bool {
		got = append(got, m.Name()+"="+string(m.Value))
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`a=1`, `b="x,}\"]"`, `c={"d":[1,{"e":"}"}]}`, `f=[]`, `gh=null`, `i=true`, `j=-1.5e3`}
	if len(got) != len(want) {
		t.Fatalf("got %q", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("member %d = %q, want %q", i, got[i], want[i])
		}
	}
	for _, bad := range []string{``, `[]`, `"x"`, `{`, `{"a":1}x`, `{"a"}`, `1`} {
		if Walk([]byte(bad), func(Member) bool { return true }) == nil {
			t.Errorf("Walk(%q) accepted", bad)
		}
	}
	n := 0
	_ = Walk([]byte(`{"a":1,"b":2}`), func(Member) bool { n++; return false })
	if n != 1 {
		t.Errorf("walk did not stop: %d", n)
	}
	if err := Walk([]byte(`{}`), func(Member) bool { t.Error("member in {}"); return true }); err != nil {
		t.Error(err)
	}
}

func TestWalkDoesNotAllocate(t *testing.T) {
	raw := []byte(`{"name":"self.audio_speaker.set_volume","arguments":{"volume":50}}`)
	allocs := testing.AllocsPerRun(100, func() {
		_ = Walk(raw, func(m Member) bool { return m.Is("name") || true })
	})
	if allocs != 0 {
		t.Errorf("Walk allocates %.0f times", allocs)
	}
}

func TestString(t *testing.T) {
	for raw, want := range map[string]string{`"a"`: "a", `"a\"b"`: `a"b`, `"\u00e9"`: "é"} {
		if s, ok := String([]byte(raw)); !ok || s != want {
			t.Errorf("String(%s) = %q %v", raw, s, ok)
		}
	}
	if _, ok := String([]byte(`1`)); ok {
		t.Error("String accepted a number")
	}
}

// FuzzWalk checks Walk against encoding/json: the same members, the same
// values (last one wins for a repeated key, as encoding/json decodes).
func FuzzWalk(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `{"a":"\"}","b":[{"c":"]"}]}`, `{"\u0061":1,"a":2}`, ` {} `, `{"a":{"b":{"c":[]}}}`, `[1]`, `{"a":1,}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		walked := map[string]json.RawMessage{}
		err := Walk(raw, func(m Member) bool {
			walked[m.Name()] = m.Value
			return true
		})
		var want map[string]json.RawMessage
		jerr := json.Unmarshal(raw, &want)
		if jerr != nil || want == nil {
			if err == nil && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
				t.Fatalf("Walk accepted %q that encoding/json refuses as an object", raw)
			}
			return
		}
		if err != nil {
			t.Fatalf("Walk refused %q: %v", raw, err)
		}
		if len(walked) != len(want) {
			t.Fatalf("%q: %d members, want %d", raw, len(walked), len(want))
		}
		for k, v := range want {
			if !bytes.Equal(walked[k], bytes.TrimSpace(v)) {
				t.Fatalf("%q: member %q = %q, want %q", raw, k, walked[k], v)
			}
		}
	})
}
