// Package nodes keeps the node registry of XiaoZhi devices: one
// wire.NodeRecord per device in the JetStream KV bucket wire.BucketNodes,
// written from the devicehubs' lifecycle events with revision
// compare-and-set, and read through an in-memory cache fed by a KV watcher.
//
// Shim replicas share the events of one device in any order, so every write
// follows two session rules: an online event applies unless it is older than
// the session in the record; tools and offline events apply only to the
// record's own session. An event for a session the record does not know yet
// is parked until that session shows up (or a short time passes), which
// covers a tools or offline event overtaking its own online event.
package nodes

import (
	"bytes"
	"encoding/json"
	"maps"
	"slices"
	"strings"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/shim/internal/translate"
)

// Node facts of every XiaoZhi device.
const (
	Platform     = "xiaozhi"
	DeviceFamily = "XiaoZhi"
	CapMCP       = "mcp"
)

// serverInfo is the MCP initialize result's serverInfo; XiaoZhi firmware puts
// its board name and firmware version there.
type serverInfo struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// DisplayName is the name a device shows in node.list: its board name (the
// MCP serverInfo.name, or "xiaozhi" when unknown), a dash, and the last six
// hex digits of its MAC (ids that are not MACs contribute their last six
// characters). It is already in the form OpenClaw's CLI normalizes names to
// (lower case, runs of other characters become one '-'), so
// `--node bread-compact-wifi-a1b2c3` matches it exactly; two boards of one
// kind collide only if their MACs share the last three octets.
func DisplayName(board, device string) string {
	base := normalizeName(board)
	if base == "" {
		base = Platform
	}
	suffix := device
	if len(suffix) > 6 {
		suffix = suffix[len(suffix)-6:]
	}
	suffix = normalizeName(suffix)
	if suffix == "" {
		return base
	}
	return base + "-" + suffix
}

// normalizeName lower-cases s and turns every run of characters other than
// ASCII letters and digits into one '-', trimming dashes at both ends.
func normalizeName(s string) string {
	var b strings.Builder
	dash := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'A' && c <= 'Z':
			c += 'a' - 'A'
			fallthrough
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			dash = false
			b.WriteByte(c)
		default:
			dash = true
		}
		if b.Len() >= 64 {
			break
		}
	}
	return b.String()
}

// applyOnline returns the record after an online event, and whether the event
// applies at all. old is nil when the device has no record.
func applyOnline(old *wire.NodeRecord, ev *wire.DeviceEvent) (wire.NodeRecord, bool) {
	if old != nil && ev.AtMs < old.ConnectedAtMs {
		return wire.NodeRecord{}, false // an older session than the one on record
	}
	var info serverInfo
	if len(ev.ServerInfo) > 0 {
		_ = json.Unmarshal(ev.ServerInfo, &info) // a malformed serverInfo only loses the board name
	}
	r := wire.NodeRecord{
		NodeID:          wire.DeviceNodeID(ev.Device),
		Tenant:          ev.Tenant,
		Kind:            wire.NodeKindXiaoZhi,
		Device:          ev.Device,
		DeviceRaw:       ev.DeviceRaw,
		DisplayName:     DisplayName(info.Name, ev.Device),
		Platform:        Platform,
		DeviceFamily:    DeviceFamily,
		ModelIdentifier: info.Name,
		Version:         info.Version,
		ClientID:        ev.ClientID,
		ClientMode:      "node",
		RemoteIP:        ev.RemoteIP,
		Transport:       ev.Transport,
		Caps:            []string{},
		Commands:        []string{},
		Connected:       true,
		ConnectedAtMs:   ev.AtMs,
		LastSeenMs:      ev.AtMs,
		Owner:           ev.Hub,
		SessionID:       ev.SessionID,
	}
	if ev.MCP {
		r.Caps = []string{CapMCP}
		r.Commands = translate.Commands()
	}
	r.Tools = ev.Tools
	if old != nil {
		if old.LastSeenMs > r.LastSeenMs {
			r.LastSeenMs = old.LastSeenMs
		}
		// An MCP session announced without a catalog (a hub resync, or a
		// device that did not list its tools) keeps the one on record: the
		// session's own if it listed it, else an earlier session's, stale.
		if len(r.Tools) == 0 && ev.MCP {
			r.Tools = old.Tools
			r.ToolsStale = old.SessionID != ev.SessionID || old.ToolsStale
		}
		if r.ModelIdentifier == "" && old.SessionID == ev.SessionID {
			r.ModelIdentifier, r.Version, r.DisplayName = old.ModelIdentifier, old.Version, old.DisplayName
		}
	}
	countToolsChange(old, &r)
	return r, true
}

// applyConnecting returns the record after a connecting event: the node is
// connected under the new session at once, with the catalog (and board
// facts) it had, marked stale until the session's online event brings the
// listed catalog. It does not apply to an older session, nor to a session
// that has listed its tools already or has ended, nor to a node without a
// catalog on record: a node seen for the first time is listed once its
// tools are, so that a client that waits for it to connect can call them.
func applyConnecting(old *wire.NodeRecord, ev *wire.DeviceEvent) (wire.NodeRecord, bool) {
	if old == nil || len(old.Tools) == 0 && old.ToolsVersion == 0 {
		return wire.NodeRecord{}, false
	}
	if old.SessionID == ev.SessionID && (!old.ToolsStale || !old.Connected) {
		return wire.NodeRecord{}, false
	}
	r, ok := applyOnline(old, ev)
	if !ok {
		return r, false
	}
	r.ToolsStale = true
	r.Tools, r.ToolsVersion, r.PendingTools = old.Tools, old.ToolsVersion, old.PendingTools
	if len(ev.ServerInfo) == 0 && old.ModelIdentifier != "" {
		r.ModelIdentifier, r.Version, r.DisplayName = old.ModelIdentifier, old.Version, old.DisplayName
	}
	return r, true
}

// countToolsChange carries the catalog version and the tools awaiting
// approval over from the old record; if the catalog changed it counts one
// more version and, unless this is the node's first catalog, adds the new
// tool names to those awaiting approval. Tools that left the catalog leave
// the pending list.
func countToolsChange(old *wire.NodeRecord, r *wire.NodeRecord) {
	if old == nil {
		if len(r.Tools) > 0 {
			r.ToolsVersion = 1
		}
		r.PendingTools = nil
		return
	}
	r.ToolsVersion, r.PendingTools = old.ToolsVersion, old.PendingTools
	if toolsEqual(old.Tools, r.Tools) {
		return
	}
	r.ToolsVersion++
	added, removed, _ := toolsDiff(old.Tools, r.Tools)
	if old.ToolsVersion == 0 {
		return // the first catalog is the node's approved surface
	}
	r.PendingTools = widen(old.PendingTools, added, removed)
}

// widen returns pending plus added minus removed, sorted, without duplicates.
func widen(pending, added, removed []string) []string {
	set := make(map[string]bool, len(pending)+len(added))
	for _, n := range pending {
		set[n] = true
	}
	for _, n := range added {
		set[n] = true
	}
	for _, n := range removed {
		delete(set, n)
	}
	if len(set) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(set))
}

// applyTools returns the record after a tools event; it applies only to the
// record's session.
func applyTools(old *wire.NodeRecord, ev *wire.DeviceEvent) (wire.NodeRecord, bool) {
	if old == nil || old.SessionID != ev.SessionID || !old.Connected {
		return wire.NodeRecord{}, false
	}
	r := *old
	r.Tools = ev.Tools
	r.ToolsStale = false
	countToolsChange(old, &r)
	if ev.AtMs > r.LastSeenMs {
		r.LastSeenMs = ev.AtMs
	}
	return r, true
}

// applyOffline returns the record after an offline event; it applies only to
// the record's session.
func applyOffline(old *wire.NodeRecord, ev *wire.DeviceEvent) (wire.NodeRecord, bool) {
	if old == nil || old.SessionID != ev.SessionID || !old.Connected {
		return wire.NodeRecord{}, false
	}
	r := *old
	r.Connected = false
	if ev.AtMs > r.LastSeenMs {
		r.LastSeenMs = ev.AtMs
	}
	return r, true
}

// toolsEqual reports whether two catalogs are byte-identical (after trimming).
func toolsEqual(a, b json.RawMessage) bool {
	return bytes.Equal(bytes.TrimSpace(a), bytes.TrimSpace(b))
}
