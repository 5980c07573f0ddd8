package mcpserver

import (
	"encoding/json"
	"sort"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/xiaoclaw/xiaoclaw/pkg/toolcall"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/registry"
)

// Keys of the _meta object of every exposed tool.
const (
	MetaNodeID   = "xiaoclaw/nodeId"   // the node's id
	MetaNodeName = "xiaoclaw/nodeName" // the node's display name, if any
	MetaTool     = "xiaoclaw/tool"     // the tool's name on the node
	// MetaIdempotencyKey, in a tools/call's _meta, is the node.invoke
	// idempotency key of the call (default: a new key per call).
	MetaIdempotencyKey = "xiaoclaw/idempotencyKey"
)

// entry is one tool of one node as a tenant-wide catalog exposes it.
type entry struct {
	name string // exposed name, unique in the tenant
	node *registry.Node
	tool *deviceTool
}

// deviceTool is a node's tool decoded once per registry revision of the
// node: everything of the listed mcp.Tool except its exposed name.
type deviceTool struct {
	name         string // the device's name
	title        string
	description  string
	inputSchema  json.RawMessage
	annotations  *mcp.ToolAnnotations
	outputSchema json.RawMessage
}

// defaultSchema stands in for a device tool without a usable inputSchema:
// MCP requires an object schema.
var defaultSchema = json.RawMessage(`{"type":"object"}`)

// decodeTools reads a node's tool catalog.
func decodeTools(n *registry.Node) []*deviceTool {
	out := make([]*deviceTool, 0, len(n.Tools))
	seen := make(map[string]bool, len(n.Tools))
	for _, t := range n.Tools {
		if seen[t.Name] {
			continue // the device's own names must be unique; keep the first
		}
		seen[t.Name] = true
		var raw struct {
			Title        string               `json:"title"`
			Description  string               `json:"description"`
			InputSchema  json.RawMessage      `json:"inputSchema"`
			OutputSchema json.RawMessage      `json:"outputSchema"`
			Annotations  *mcp.ToolAnnotations `json:"annotations"`
		}
		_ = json.Unmarshal(t.Raw, &raw) // a field that does not decode is left out
		dt := &deviceTool{name: t.Name, title: raw.Title, description: raw.Description, annotations: raw.Annotations,
			inputSchema: defaultSchema}
		if isObjectSchema(raw.InputSchema) {
			dt.inputSchema = raw.InputSchema
		}
		if isObjectSchema(raw.OutputSchema) {
			dt.outputSchema = raw.OutputSchema
		}
		out = append(out, dt)
	}
	return out
}

// isObjectSchema reports whether raw is a JSON object whose "type", if
// any, is "object", as MCP requires of inputSchema and outputSchema.
func isObjectSchema(raw json.RawMessage) bool {
	if len(raw) == 0 || raw[0] != '{' {
		return false
	}
	var s struct {
		Type any `json:"type"`
	}
	if json.Unmarshal(raw, &s) != nil {
		return false
	}
	return s.Type == nil || s.Type == "object"
}

// hasTools reports whether a node's tools are named: it has a catalog and
// takes mcp.tools.call. Only connected nodes are listed, but an offline
// node keeps its names (a call to one answers that the node is offline,
// and a name does not change when another node goes offline).
func hasTools(n *registry.Node) bool {
	return n != nil && len(n.Tools) > 0 && n.HasCommand(toolcall.CommandCall)
}

// mcpTool is the listed form of a tool under an exposed name.
func (dt *deviceTool) mcpTool(name string, n *registry.Node) *mcp.Tool {
	t := &mcp.Tool{
		Name:        name,
		Description: dt.description,
		InputSchema: dt.inputSchema,
		Annotations: dt.annotations,
		Meta:        mcp.Meta{MetaNodeID: n.NodeID, MetaTool: dt.name},
	}
	if len(dt.outputSchema) > 0 {
		t.OutputSchema = dt.outputSchema
	}
	nodeName := n.DisplayName
	if nodeName != "" {
		t.Meta[MetaNodeName] = nodeName
	} else {
		nodeName = n.NodeID
	}
	title := dt.title
	if title == "" {
		title = dt.name
	}
	t.Title = title + " on " + nodeName + " (" + n.NodeID + ")"
	return t
}

// snapshot is a tenant's tool catalog at one registry generation, sorted
// by exposed name.
type snapshot struct {
	gen     uint64
	entries []entry
	byName  map[string]int
	byNode  map[string][]int // node id -> indexes into entries
}

// tenantCatalog caches a tenant's snapshot and each node's decoded tools.
type tenantCatalog struct {
	mu    sync.Mutex
	gen   uint64 // bumped by every registry change of the tenant
	snap  *snapshot
	tools map[*registry.Node]*nodeTools
}

// nodeTools is one registry revision of a node's catalog, decoded and
// named (before collisions), kept across rebuilds while the node is.
type nodeTools struct {
	tools []*deviceTool
	bases []string
	long  []bool
}

func newNodeTools(n *registry.Node) *nodeTools {
	nt := &nodeTools{tools: decodeTools(n)}
	nt.bases, nt.long = make([]string, len(nt.tools)), make([]bool, len(nt.tools))
	for i, dt := range nt.tools {
		nt.bases[i], nt.long[i] = baseToolName(n.DisplayName, n.NodeID, dt.name)
	}
	return nt
}

// catalogs holds the tenants' catalogs.
type catalogs struct {
	nodes Nodes

	mu      sync.Mutex
	tenants map[string]*tenantCatalog
}

func newCatalogs(nodes Nodes) *catalogs {
	return &catalogs{nodes: nodes, tenants: map[string]*tenantCatalog{}}
}

func (c *catalogs) tenant(tenant string) *tenantCatalog {
	c.mu.Lock()
	defer c.mu.Unlock()
	tc := c.tenants[tenant]
	if tc == nil {
		tc = &tenantCatalog{tools: map[*registry.Node]*nodeTools{}}
		c.tenants[tenant] = tc
	}
	return tc
}

// invalidate marks a tenant's snapshot stale.
func (c *catalogs) invalidate(tenant string) {
	tc := c.tenant(tenant)
	tc.mu.Lock()
	tc.gen++
	tc.mu.Unlock()
}

// snapshot returns the tenant's current catalog, rebuilding it after a
// registry change.
func (c *catalogs) snapshot(tenant string) *snapshot {
	tc := c.tenant(tenant)
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if tc.snap != nil && tc.snap.gen == tc.gen {
		return tc.snap
	}
	tc.snap = tc.build(c.nodes.List(tenant))
	return tc.snap
}

// build names every tool of the tenant's serving nodes. A name is the
// node's short name and the tool's name (baseToolName); when two tools
// would get the same name, or the name had to be cut, each of them gets a
// suffix derived from its node id and tool name. So a plain name always
// refers to the only tool that could claim it, a suffixed name to one
// node's tool, and a name never moves to another device.
func (tc *tenantCatalog) build(nodes []*registry.Node) *snapshot {
	type cand struct {
		base string
		long bool
		node *registry.Node
		tool *deviceTool
	}
	var cands []cand
	count := map[string]int{}
	tools := make(map[*registry.Node]*nodeTools, len(nodes))
	for _, n := range nodes {
		if !hasTools(n) {
			continue
		}
		nt, ok := tc.tools[n]
		if !ok {
			nt = newNodeTools(n)
		}
		tools[n] = nt
		for i, dt := range nt.tools {
			cands = append(cands, cand{nt.bases[i], nt.long[i], n, dt})
			count[nt.bases[i]]++
		}
	}
	tc.tools = tools // drops the decoded tools of replaced nodes

	s := &snapshot{gen: tc.gen, entries: make([]entry, 0, len(cands)), byName: make(map[string]int, len(cands)),
		byNode: map[string][]int{}}
	for _, c := range cands {
		name := c.base
		if c.long || count[c.base] > 1 {
			name = uniqueToolName(c.base, c.node.NodeID, c.tool.name)
		}
		s.entries = append(s.entries, entry{name: name, node: c.node, tool: c.tool})
	}
	sort.Slice(s.entries, func(i, j int) bool {
		a, b := s.entries[i], s.entries[j]
		if a.name != b.name {
			return a.name < b.name
		}
		if a.node.NodeID != b.node.NodeID {
			return a.node.NodeID < b.node.NodeID
		}
		return a.tool.name < b.tool.name
	})
	// A suffixed name equal to another tool's name (a 32-bit hash
	// collision, or a device tool literally named like a suffix) keeps the
	// first in order; the other is not served rather than ambiguous.
	kept := s.entries[:0]
	for _, e := range s.entries {
		if _, dup := s.byName[e.name]; dup {
			continue
		}
		s.byName[e.name] = len(kept)
		kept = append(kept, e)
	}
	s.entries = kept
	for i, e := range s.entries {
		s.byNode[e.node.NodeID] = append(s.byNode[e.node.NodeID], i)
	}
	return s
}
