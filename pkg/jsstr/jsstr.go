// Package jsstr reproduces the JavaScript string operations OpenClaw applies
// to protocol fields, where Go's own differ: the OpenClaw client, the
// gateway's protocol checks and the tool-call parser must trim exactly as the
// Node.js peers do, or a signature or a name compares unequal.
package jsstr

import "strings"

// IsSpace reports whether r is in JavaScript's String.prototype.trim set
// (WhiteSpace and LineTerminator), which differs from unicode.IsSpace at
// U+0085 (kept) and U+FEFF (trimmed).
func IsSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0xa0, 0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000, 0xfeff:
		return true
	}
	return r >= 0x2000 && r <= 0x200a
}

// Trim is JavaScript's s.trim().
func Trim(s string) string { return strings.TrimFunc(s, IsSpace) }
