package jsonobj

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"testing"
)

func TestRepeatedKey(t *testing.T) {
	for v, want := range map[string]string{
		`{"a":1,"b":2}`:                 "",
		`{"a":1,"a":2}`:                 "a",
		`{"a":1,"\u0061":2}`:            "a",
		` {"a":{"b":[{"c":1,"c":2}]}} `: "a.b.c",
		`[{"x":1},{"x":1}]`:             "",
		`{"a":{"x":1},"b":{"x":1}}`:     "",
		`{"s":"{\"a\":1,\"a\":1}"}`:     "",
		`{"1":0,"2":0,"3":0,"4":0,"5":0,"6":0,"7":0,"8":0,"9":0,"10":0,"3":1}`: "3",
		`"a"`:                  "",
		`12`:                   "",
		`{"k\u00e9":1,"ké":2}`: "ké",
	} {
		path, found := RepeatedKey([]byte(v))
		if found != (want != "") || path != want {
			t.Errorf("RepeatedKey(%s) = %q %v, want %q", v, path, found, want)
		}
	}
}

func TestRepeatedKeyDoesNotAllocate(t *testing.T) {
	raw := []byte(`{"server":"xiaozhi","tool":"self.audio_speaker.set_volume","arguments":{"volume":50,"speaker":{"muted":false}}}`)
	if n := testing.AllocsPerRun(100, func() { RepeatedKey(raw) }); n != 0 {
		t.Errorf("RepeatedKey allocates %.0f times", n)
	}
}

// FuzzRepeatedKey holds RepeatedKey to encoding/json's tokenizer: a valid
// JSON value has a repeated key exactly when the tokens say so.
func FuzzRepeatedKey(f *testing.F) {
	for _, s := range []string{`{"a":1,"a":2}`, `{"a":[{"b":1},{"b":2,"b":3}]}`, `{"\u0061":1,"a":1}`, `[1,{"x":{}}]`, `{"a\ud800":1,"a\udfff":2}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, v []byte) {
		if !json.Valid(v) {
			return
		}
		_, found := RepeatedKey(v)
		if want := tokensRepeatKey(t, v); found != want {
			t.Fatalf("RepeatedKey(%q) found=%v, tokenizer says %v", v, found, want)
		}
	})
}

// tokensRepeatKey finds a repeated key with encoding/json's Decoder.
func tokensRepeatKey(t *testing.T, v []byte) bool {
	type frame struct {
		obj, keyNext bool
		keys         map[string]bool
	}
	var stack []*frame
	valueDone := func() {
		if n := len(stack); n > 0 && stack[n-1].obj {
			stack[n-1].keyNext = true
		}
	}
	dec := json.NewDecoder(bytes.NewReader(v))
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			return false
		}
		if err != nil {
			t.Fatalf("tokenizer: %v", err)
		}
		if n := len(stack); n > 0 && stack[n-1].obj && stack[n-1].keyNext {
			if tok == json.Delim('}') {
				stack = stack[:n-1]
				valueDone()
				continue
			}
			k := tok.(string)
			if stack[n-1].keys[k] {
				return true
			}
			stack[n-1].keys[k], stack[n-1].keyNext = true, false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{obj: true, keyNext: true, keys: map[string]bool{}})
		case json.Delim('['):
			stack = append(stack, &frame{})
		case json.Delim(']'):
			stack = stack[:len(stack)-1]
			valueDone()
		default:
			valueDone()
		}
	}
}
