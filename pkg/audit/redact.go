package audit

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// DefaultSensitiveKeys are the words whose values are masked in every
// tool's arguments. A key matches when one of its words (split at '_', '-',
// '.', spaces and lower-to-upper case changes) or the whole key with those
// separators removed equals one of them, ignoring case: "token",
// "access_token", "apiKey", "X-Api-Key" and "PASSWORD" match, "monkey" and
// "tokenizer" do not.
var DefaultSensitiveKeys = []string{
	"token", "password", "passwd", "pwd", "passphrase", "secret", "key", "apikey",
	"authorization", "auth", "credential", "credentials", "cookie", "session", "privatekey", "pin", "otp",
}

// Redaction says what to mask in stored tool arguments.
type Redaction struct {
	// Keys are further words masked for every tool, besides
	// DefaultSensitiveKeys.
	Keys []string
	// Tools maps a tool name (or, for calls that are not MCP tool calls, a
	// command) to words masked only in its arguments. The single word "*"
	// drops the tool's arguments altogether.
	Tools map[string][]string
	// MaxArgsBytes caps stored arguments after masking; larger arguments
	// are stored as {"_omitted":"too large","bytes":N,"sha256":"…"}.
	// Default 4096.
	MaxArgsBytes int
}

// redactor is a compiled Redaction.
type redactor struct {
	common   map[string]bool
	tools    map[string]map[string]bool
	dropAll  map[string]bool
	maxBytes int
	// needles are the lower-case words searched for in the raw bytes: no
	// hit (and no escape sequence) means nothing to mask.
	needles [][]byte
}

func (r Redaction) compile() *redactor {
	c := &redactor{common: map[string]bool{}, tools: map[string]map[string]bool{}, dropAll: map[string]bool{},
		maxBytes: r.MaxArgsBytes}
	if c.maxBytes <= 0 {
		c.maxBytes = defaultMaxArgsBytes
	}
	add := func(set map[string]bool, w string) {
		w = strings.ToLower(strings.TrimSpace(w))
		if w != "" {
			set[w] = true
			c.needles = append(c.needles, []byte(w))
		}
	}
	for _, w := range DefaultSensitiveKeys {
		add(c.common, w)
	}
	for _, w := range r.Keys {
		add(c.common, w)
	}
	for tool, ws := range r.Tools {
		set := map[string]bool{}
		for _, w := range ws {
			if w == "*" {
				c.dropAll[tool] = true
				continue
			}
			add(set, w)
		}
		c.tools[tool] = set
	}
	return c
}

// Redact masks sensitive values in args (JSON) for tool and caps the size.
// It never returns the input's secrets and always returns valid JSON (or
// nil for no arguments).
func (r Redaction) Redact(tool string, args json.RawMessage) json.RawMessage {
	return r.compile().apply(tool, args)
}

func (c *redactor) apply(tool string, args json.RawMessage) json.RawMessage {
	args = bytes.TrimSpace(args)
	if len(args) == 0 || string(args) == "null" {
		return nil
	}
	if c.dropAll[tool] {
		return json.RawMessage(`{"_omitted":"redacted"}`)
	}
	if !json.Valid(args) {
		return json.RawMessage(`{"_omitted":"not JSON","bytes":` + strconv.Itoa(len(args)) + `}`)
	}
	out := args
	if c.mayHold(args) {
		var v any
		d := json.NewDecoder(bytes.NewReader(args))
		d.UseNumber()
		if err := d.Decode(&v); err != nil {
			return json.RawMessage(`{"_omitted":"not JSON","bytes":` + strconv.Itoa(len(args)) + `}`)
		}
		v = c.walk(v, c.tools[tool])
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			return json.RawMessage(`{"_omitted":"not JSON","bytes":` + strconv.Itoa(len(args)) + `}`)
		}
		out = bytes.TrimRight(b.Bytes(), "\n")
	}
	if len(out) > c.maxBytes {
		sum := sha256.Sum256(out)
		return json.RawMessage(`{"_omitted":"too large","bytes":` + strconv.Itoa(len(out)) +
			`,"sha256":"` + hex.EncodeToString(sum[:]) + `"}`)
	}
	return out
}

// mayHold reports whether raw JSON could contain a key to mask or a NUL:
// any backslash (an escape may spell a key or a NUL) or any sensitive word.
// False lets the common small argument object through without a decode.
func (c *redactor) mayHold(raw []byte) bool {
	if bytes.IndexByte(raw, '\\') >= 0 || !utf8.Valid(raw) {
		return true
	}
	lower := bytes.ToLower(raw)
	for _, n := range c.needles {
		if bytes.Contains(lower, n) {
			return true
		}
	}
	return false
}

// walk masks the values of sensitive keys at any depth and replaces NULs in
// keys and strings (PostgreSQL's jsonb refuses \u0000).
func (c *redactor) walk(v any, extra map[string]bool) any {
	switch x := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, val := range x {
			clean := strings.ReplaceAll(k, "\x00", "\uFFFD")
			if c.sensitive(k, extra) {
				out[clean] = redactedValue
				continue
			}
			out[clean] = c.walk(val, extra)
		}
		return out
	case []any:
		for i := range x {
			x[i] = c.walk(x[i], extra)
		}
		return x
	case string:
		return strings.ReplaceAll(x, "\x00", "\uFFFD")
	}
	return v
}

func (c *redactor) sensitive(key string, extra map[string]bool) bool {
	hit := func(w string) bool { return c.common[w] || extra[w] }
	var joined strings.Builder
	for _, w := range keyWords(key) {
		if hit(w) {
			return true
		}
		joined.WriteString(w)
	}
	return hit(joined.String())
}

// keyWords splits a key into lower-case words at separators and at
// lower-to-upper case changes ("apiKey" → api, key; "X-Api-Key" → x, api, key).
func keyWords(key string) []string {
	var words []string
	var cur []rune
	flush := func() {
		if len(cur) > 0 {
			words = append(words, strings.ToLower(string(cur)))
			cur = cur[:0]
		}
	}
	var prev rune
	for _, r := range key {
		switch {
		case r == '_' || r == '-' || r == '.' || r == ':' || r == '/' || unicode.IsSpace(r) || r == 0:
			flush()
		case unicode.IsUpper(r) && (unicode.IsLower(prev) || unicode.IsDigit(prev)):
			flush()
			cur = append(cur, r)
		default:
			cur = append(cur, r)
		}
		prev = r
	}
	flush()
	return words
}
