package mcpserver

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// MaxToolName is the longest tool name the server exposes: the limit of
// ^[a-zA-Z0-9_-]{1,64}$, the function-name rule of the OpenAI and Anthropic
// APIs that most agents hand MCP tools to.
const MaxToolName = 64

// maxNodePart bounds the node's part of an exposed name, so the tool's own
// name keeps most of the 64 characters; a longer node name keeps its
// head and its last keepTail characters, where XiaoZhi display names
// ("bread-compact-wifi-d4e5f6") carry what tells devices apart.
const (
	maxNodePart = 28
	keepTail    = 7
)

// hashSuffixLen is the length of the "_<hex>" suffix that makes a name
// unique: 8 hex digits of SHA-256 over the node id and the tool name.
const hashSuffixLen = 1 + 8

// baseToolName is the exposed name of a node's tool before collisions are
// resolved: the node's short name and the tool's name, each reduced to
// [a-zA-Z0-9_], joined by "__". long reports that it had to be cut to
// MaxToolName (the caller then adds the hash suffix).
func baseToolName(displayName, nodeID, tool string) (name string, long bool) {
	node := shortNode(displayName)
	if node == "" {
		node = shortNode(nodeID)
	}
	if node == "" {
		node = "node"
	}
	t := slug(tool, MaxToolName)
	if t == "" {
		t = "tool"
	}
	name = node + "__" + t
	if len(name) > MaxToolName {
		return name[:MaxToolName-hashSuffixLen], true
	}
	return name, false
}

// shortNode is a node name as slug makes it, cut to maxNodePart
// characters by dropping the middle.
func shortNode(name string) string {
	s := slug(name, 4*maxNodePart)
	if len(s) <= maxNodePart {
		return s
	}
	head := strings.TrimRight(s[:maxNodePart-keepTail-1], "_")
	tail := strings.TrimLeft(s[len(s)-keepTail:], "_")
	return head + "_" + tail
}

// uniqueToolName is the base name made unique with a suffix derived from
// the node id and the original tool name, cut so that it stays within
// MaxToolName.
func uniqueToolName(base, nodeID, tool string) string {
	h := sha256.Sum256([]byte(nodeID + "\x00" + tool))
	if len(base) > MaxToolName-hashSuffixLen {
		base = base[:MaxToolName-hashSuffixLen]
	}
	return base + "_" + hex.EncodeToString(h[:4])
}

// slug reduces s to at most max characters of [a-zA-Z0-9_]: a run of
// other characters ('-' and '.' included) becomes one '_', so XiaoZhi's
// "self.audio_speaker.set_volume" reads "self_audio_speaker_set_volume".
// '-' is valid in an MCP tool name, but agent SDKs rewrite it (the OpenAI
// Agents SDK turns it into '_'), so the name an agent sees would differ
// from the listed one; separators are trimmed from both ends.
func slug(s string, max int) string {
	var b strings.Builder
	b.Grow(min(len(s), max))
	sep := false
	for _, r := range s {
		if b.Len() >= max {
			break
		}
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			if sep && b.Len() > 0 {
				b.WriteByte('_')
			}
			sep = false
			b.WriteRune(r)
		default:
			sep = true
		}
	}
	out := b.String()
	if len(out) > max {
		out = out[:max]
	}
	return strings.Trim(out, "_")
}

// ValidToolName reports whether name matches ^[a-zA-Z0-9_-]{1,64}$.
func ValidToolName(name string) bool {
	if name == "" || len(name) > MaxToolName {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}
