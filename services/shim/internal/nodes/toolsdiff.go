package nodes

import (
	"bytes"
	"encoding/json"
	"sort"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// toolsDiff names the tools a catalog change added, removed and changed
// (same name, another definition). Entries that are not objects with a
// string name are ignored, as the catalog ignores them.
func toolsDiff(old, cur json.RawMessage) (added, removed, changed []string) {
	before, after := toolsByName(old), toolsByName(cur)
	for name, def := range after {
		switch prev, ok := before[name]; {
		case !ok:
			added = append(added, name)
		case !bytes.Equal(prev, def):
			changed = append(changed, name)
		}
	}
	for name := range before {
		if _, ok := after[name]; !ok {
			removed = append(removed, name)
		}
	}
	sort.Strings(added)
	sort.Strings(removed)
	sort.Strings(changed)
	return added, removed, changed
}

func toolsByName(tools json.RawMessage) map[string]json.RawMessage {
	var list []json.RawMessage
	_ = json.Unmarshal(tools, &list)
	m := make(map[string]json.RawMessage, len(list))
	for _, t := range list {
		var named struct {
			Name string `json:"name"`
		}
		if json.Unmarshal(t, &named) == nil && named.Name != "" {
			var compact bytes.Buffer
			if json.Compact(&compact, t) == nil {
				m[named.Name] = compact.Bytes()
			}
		}
	}
	return m
}

// publishToolsChanged announces a catalog change twice, with one payload:
// as node.tools.changed and, for clients written against it, as
// mcp.tools.changed.
func (r *Registry) publishToolsChanged(old, rec *wire.NodeRecord, nowMs int64) {
	p := r.toolsChangedPayload(old.Tools, rec.Tools, rec.ToolsVersion, rec.PendingTools)
	for _, name := range [...]string{wire.EventNodeToolsChanged, wire.EventToolsChanged} {
		r.Publish(rec.Tenant, wire.NodeEventMsg{NodeID: rec.NodeID, Event: name, Payload: p, TsMs: nowMs})
	}
}

// toolsChangedPayload is the payload of a catalog change: the current tool
// names, what the change added, removed and changed, and the catalog's new
// version, and the tools awaiting approval.
func (r *Registry) toolsChangedPayload(old, cur json.RawMessage, version uint64, pending []string) json.RawMessage {
	var p struct {
		Tools   []string `json:"tools"`
		Added   []string `json:"added"`
		Removed []string `json:"removed"`
		Changed []string `json:"changed"`
		Version uint64   `json:"version"`
		Pending []string `json:"pending,omitempty"`
	}
	if err := json.Unmarshal(r.toolsPayload(cur), &p); err != nil {
		return r.toolsPayload(cur)
	}
	p.Added, p.Removed, p.Changed = toolsDiff(old, cur)
	p.Version, p.Pending = version, pending
	for _, s := range []*[]string{&p.Added, &p.Removed, &p.Changed} {
		if *s == nil {
			*s = []string{}
		}
	}
	b, _ := json.Marshal(p)
	return b
}
