package audit_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/xiaoclaw/xiaoclaw/pkg/audit"
)

func TestRedact(t *testing.T) {
	r := audit.Redaction{
		Keys:         []string{"ssn"},
		Tools:        map[string][]string{"wifi.join": {"ssid"}, "vault.read": {"*"}},
		MaxArgsBytes: 200,
	}
	cases := []struct {
		tool, in, want string
	}{
		{"x", `{"volume":30,"name":"kitchen"}`, `{"volume":30,"name":"kitchen"}`}, // untouched, order kept
		{"x", `{"Token":"t","PASSWORD":"p","api_key":"k","apiKey":"k","X-Api-Key":"k","access_token":"a","volume":1}`,
			`{"PASSWORD":"[REDACTED]","Token":"[REDACTED]","X-Api-Key":"[REDACTED]","access_token":"[REDACTED]","apiKey":"[REDACTED]","api_key":"[REDACTED]","volume":1}`},
		{"x", `{"monkey":"banana","tokenizer":"bpe","keyboard":"us"}`, `{"keyboard":"us","monkey":"banana","tokenizer":"bpe"}`},
		{"x", `{"headers":{"Authorization":"Bearer abc","accept":"*/*"},"list":[{"secret":{"deep":1}},2]}`,
			`{"headers":{"Authorization":"[REDACTED]","accept":"*/*"},"list":[{"secret":"[REDACTED]"},2]}`},
		{"x", `{"\u0074oken":"escaped key","s":"nul\u0000"}`, `{"s":"nul` + "\uFFFD" + `","token":"[REDACTED]"}`},
		{"x", `{"ssn":"123"}`, `{"ssn":"[REDACTED]"}`},
		{"wifi.join", `{"ssid":"home","psk":"x"}`, `{"psk":"x","ssid":"[REDACTED]"}`},
		{"other", `{"ssid":"home"}`, `{"ssid":"home"}`},
		{"vault.read", `{"path":"a"}`, `{"_omitted":"redacted"}`},
		{"x", `not json`, `{"_omitted":"not JSON","bytes":8}`},
		{"x", ``, ``},
		{"x", `null`, ``},
		{"x", `[1,2,3]`, `[1,2,3]`},
		{"x", `"<b>&"`, `"<b>&"`},
	}
	for _, c := range cases {
		got := r.Redact(c.tool, json.RawMessage(c.in))
		if string(got) != c.want {
			t.Errorf("Redact(%s, %s)\n got %s\nwant %s", c.tool, c.in, got, c.want)
		}
	}
	big := `{"blob":"` + strings.Repeat("a", 300) + `"}`
	got := string(r.Redact("x", json.RawMessage(big)))
	if !strings.HasPrefix(got, `{"_omitted":"too large","bytes":311,"sha256":"`) {
		t.Errorf("oversized args: %s", got)
	}
}

// FuzzRedact: tool arguments come from operators. Whatever they are, the
// output is valid JSON within the cap, holds no value of a sensitive key
// and no NUL.
func FuzzRedact(f *testing.F) {
	for _, s := range []string{`{"token":"SECRETVALUE"}`, `{"a":{"Password":["SECRETVALUE"]}}`, `[{"apiKey":"SECRETVALUE"}]`,
		`{"\u0070assword":"SECRETVALUE"}`, `"x"`, `1e999`, `{"a":"\ud800"}`, `{"k":` + strings.Repeat("[", 50), "\xff"} {
		f.Add("tool", s)
	}
	r := audit.Redaction{MaxArgsBytes: 512}
	f.Fuzz(func(t *testing.T, tool, in string) {
		out := r.Redact(tool, json.RawMessage(in))
		if len(out) == 0 {
			return
		}
		if !json.Valid(out) || len(out) > 512 && !bytes.HasPrefix(out, []byte(`{"_omitted"`)) {
			t.Fatalf("bad output %q from %q", out, in)
		}
		if bytes.Contains(out, []byte(`\u0000`)) {
			t.Fatalf("NUL kept: %s", out)
		}
		var v any
		if json.Unmarshal(out, &v) == nil && holdsSecret(v) {
			t.Fatalf("secret kept: %s from %s", out, in)
		}
	})
}

// holdsSecret reports a "token" or "password" key whose value is not masked.
func holdsSecret(v any) bool {
	switch x := v.(type) {
	case map[string]any:
		for k, val := range x {
			if lk := strings.ToLower(k); (lk == "token" || lk == "password") && val != "[REDACTED]" {
				return true
			}
			if holdsSecret(val) {
				return true
			}
		}
	case []any:
		for _, e := range x {
			if holdsSecret(e) {
				return true
			}
		}
	}
	return false
}
