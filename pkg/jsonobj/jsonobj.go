// Package jsonobj walks the members of a JSON object without decoding it:
// keys and values come back as sub-slices of the input, so the shim and the
// tool-call parser (pkg/toolcall) can pick a few fields out of a message and
// pass the rest on as raw bytes without an allocation.
//
// The input is checked with json.Valid first; the walk itself only has to
// find boundaries in text already known to be well-formed.
package jsonobj

import (
	"bytes"
	"encoding/json"
	"errors"
)

// ErrNotObject is returned for input that is not one valid JSON object.
var ErrNotObject = errors.New("not a JSON object")

// Member is one member of an object.
type Member struct {
	// Key is the key as written, without its quotes; it may hold escapes
	// (see Escaped and Name).
	Key []byte
	// Escaped reports a backslash or a non-ASCII byte in Key: Name then
	// decodes it as encoding/json does (invalid UTF-8 becomes U+FFFD).
	Escaped bool
	// Value is the raw value, without surrounding white space.
	Value []byte
}

// Name returns the key as a string, with escapes resolved.
func (m Member) Name() string {
	if !m.Escaped {
		return string(m.Key)
	}
	var s string
	q := make([]byte, 0, len(m.Key)+2)
	q = append(append(append(q, '"'), m.Key...), '"')
	_ = json.Unmarshal(q, &s) // valid: the object passed json.Valid
	return s
}

// Is reports whether the key equals name.
func (m Member) Is(name string) bool {
	if !m.Escaped {
		return string(m.Key) == name // no allocation: the compiler compares in place
	}
	return m.Name() == name
}

// Walk calls fn for each member of the object in raw, in order, until fn
// returns false. It returns ErrNotObject when raw is not a valid JSON object.
func Walk(raw []byte, fn func(Member) bool) error {
	if !json.Valid(raw) {
		return ErrNotObject
	}
	i := skipSpace(raw, 0)
	if i >= len(raw) || raw[i] != '{' {
		return ErrNotObject
	}
	i++
	for {
		i = skipSpace(raw, i)
		if raw[i] == '}' {
			return nil
		}
		if raw[i] == ',' {
			i = skipSpace(raw, i+1)
		}
		end, escaped := stringEnd(raw, i)
		m := Member{Key: raw[i+1 : end-1], Escaped: escaped}
		i = skipSpace(raw, end)
		i = skipSpace(raw, i+1) // the ':'
		vend := valueEnd(raw, i)
		m.Value = raw[i:vend]
		if !fn(m) {
			return nil
		}
		i = vend
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index after the closing quote of the string that
// starts at b[i], and whether it holds a backslash or a non-ASCII byte.
func stringEnd(b []byte, i int) (int, bool) {
	escaped := false
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '\\':
			escaped = true
			j++
		case c == '"':
			return j + 1, escaped
		case c >= 0x80:
			escaped = true
		}
	}
	return len(b), escaped
}

// valueEnd returns the index after the value that starts at b[i].
func valueEnd(b []byte, i int) int {
	switch b[i] {
	case '"':
		end, _ := stringEnd(b, i)
		return end
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end, _ := stringEnd(b, j)
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return len(b)
	}
	j := i // a number, true, false or null
	for ; j < len(b); j++ {
		switch b[j] {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
			return j
		}
	}
	return j
}

// IsString reports whether a raw value is a JSON string.
func IsString(v []byte) bool { return len(v) > 0 && v[0] == '"' }

// IsObject reports whether a raw value is a JSON object.
func IsObject(v []byte) bool { return len(v) > 0 && v[0] == '{' }

// IsNull reports whether a raw value is null.
func IsNull(v []byte) bool { return string(v) == "null" }

// IsBool reports whether a raw value is true or false.
func IsBool(v []byte) bool { return string(v) == "true" || string(v) == "false" }

// String returns the value of a raw JSON string (escapes resolved, invalid
// UTF-8 replaced as encoding/json does) and false when v is not a string.
func String(v []byte) (string, bool) {
	if !IsString(v) || len(v) < 2 {
		return "", false
	}
	if _, escaped := stringEnd(v, 0); !escaped {
		return string(v[1 : len(v)-1]), true
	}
	var s string
	if json.Unmarshal(v, &s) != nil {
		return "", false
	}
	return s, true
}

// RepeatedKey returns the first key that appears twice in one object
// anywhere in the JSON value v (objects nested in objects and in arrays
// included), as the dotted path of keys leading to it ("speaker.muted";
// array elements add no step). Keys are compared as decoders see them,
// escapes resolved, so "a" and "\u0061" are the same key. Decoders
// disagree on which of two equal keys counts (encoding/json and
// JavaScript take the last, cJSON the first), so a message with one
// means different things to different readers. v must be valid JSON, such
// as a Member.Value of a walked object.
func RepeatedKey(v []byte) (path string, found bool) {
	_, path, found = repeatedKey(v, skipSpace(v, 0))
	return path, found
}

// repeatedKey scans the value at b[i] and returns the index after it.
func repeatedKey(b []byte, i int) (end int, path string, found bool) {
	switch b[i] {
	case '{':
		var keys keySet
		i++
		for {
			i = skipSpace(b, i)
			if b[i] == '}' {
				return i + 1, "", false
			}
			if b[i] == ',' {
				i = skipSpace(b, i+1)
			}
			kend, escaped := stringEnd(b, i)
			m := Member{Key: b[i+1 : kend-1], Escaped: escaped}
			if escaped {
				m.Key = []byte(m.Name())
			}
			if keys.repeated(m.Key) {
				return 0, string(m.Key), true
			}
			i = skipSpace(b, skipSpace(b, kend)+1) // past the ':'
			var sub string
			if i, sub, found = repeatedKey(b, i); found {
				return 0, string(m.Key) + "." + sub, true
			}
		}
	case '[':
		i++
		for {
			i = skipSpace(b, i)
			if b[i] == ']' {
				return i + 1, "", false
			}
			if b[i] == ',' {
				i = skipSpace(b, i+1)
			}
			if i, path, found = repeatedKey(b, i); found {
				return 0, path, true
			}
		}
	}
	return valueEnd(b, i), "", false
}

// keySet holds the keys of one object: a few in place, more in a map.
type keySet struct {
	small [8][]byte
	n     int
	big   map[string]struct{}
}

// repeated adds k and reports whether it was there already.
func (s *keySet) repeated(k []byte) bool {
	if s.big != nil {
		if _, ok := s.big[string(k)]; ok {
			return true
		}
		s.big[string(k)] = struct{}{}
		return false
	}
	for _, x := range s.small[:s.n] {
		if bytes.Equal(x, k) {
			return true
		}
	}
	if s.n < len(s.small) {
		s.small[s.n] = k
		s.n++
		return false
	}
	s.big = make(map[string]struct{}, 4*len(s.small))
	for _, x := range s.small {
		s.big[string(x)] = struct{}{}
	}
	s.big[string(k)] = struct{}{}
	return false
}
