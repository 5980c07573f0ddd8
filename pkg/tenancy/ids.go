package tenancy

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"fmt"
	"strings"
)

// Id prefixes. Ids are a prefix plus 16 characters of lower-case base32
// (80 random bits), so they never contain '.', '_' after the prefix, or '-'.
const (
	PrefixToken     = "tok_"
	PrefixDeviceKey = "dk_"
	PrefixRule      = "rul_"
)

// TokenPrefix starts every operator API token: xco_<id>_<secret>, where
// <id> is the token id without "tok_" and <secret> is 52 characters of
// base32 (256 random bits).
const TokenPrefix = "xco_"

const (
	idChars     = 16
	secretChars = 52
)

var b32 = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

func randomB32(bytes int) string {
	b := make([]byte, bytes)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go ≥1.24)
	return b32.EncodeToString(b)
}

func newID(prefix string) string { return prefix + randomB32(10) }

// NewRuleID returns a fresh rule id "rul_…".
func NewRuleID() string { return newID(PrefixRule) }

// isB32 reports whether s is n characters of the id alphabet.
func isB32(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '2' && c <= '7') {
			return false
		}
	}
	return true
}

// ValidTokenID reports whether id has the form of an operator token id.
func ValidTokenID(id string) bool {
	rest, ok := strings.CutPrefix(id, PrefixToken)
	return ok && isB32(rest, idChars)
}

// ValidDeviceKeyID reports whether id has the form of a device key id.
func ValidDeviceKeyID(id string) bool {
	rest, ok := strings.CutPrefix(id, PrefixDeviceKey)
	return ok && isB32(rest, idChars)
}

// ValidRuleID reports whether id has the form of a rule id.
func ValidRuleID(id string) bool {
	rest, ok := strings.CutPrefix(id, PrefixRule)
	return ok && isB32(rest, idChars)
}

// newOperatorToken returns a fresh token id and the token string.
func newOperatorToken() (id, token string) {
	raw := randomB32(10)
	return PrefixToken + raw, TokenPrefix + raw + "_" + randomB32(32)
}

// ParseOperatorToken returns the token id of a token string of the form
// xco_<id>_<secret>. It checks the form only, not the secret.
func ParseOperatorToken(token string) (id string, err error) {
	rest, ok := strings.CutPrefix(token, TokenPrefix)
	if !ok {
		return "", fmt.Errorf("%w: operator token must start with %q", ErrInvalid, TokenPrefix)
	}
	raw, secret, ok := strings.Cut(rest, "_")
	if !ok || !isB32(raw, idChars) || !isB32(secret, secretChars) {
		return "", fmt.Errorf("%w: operator token is not %s<id>_<secret>", ErrInvalid, TokenPrefix)
	}
	return PrefixToken + raw, nil
}

// hashToken is what the store keeps of a token: the hex SHA-256 of the
// whole token string. The secret has 256 random bits, so a fast hash is
// enough; a slow password hash would only slow down every connect.
func hashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}
