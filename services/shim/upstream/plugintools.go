package upstream

import (
	"encoding/json"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// A device's MCP tools become agent tools on the upstream through
// node.pluginTools.update, the method OpenClaw's own node host uses for the
// MCP servers it hosts: each tool is a descriptor of the reserved plugin
// "node-mcp" whose command is mcp.tools.call.v1 with {server, tool}. The
// gateway keeps only descriptors whose command the node may run, so the
// tools appear once the node is approved. Shapes and limits are those of
// OpenClaw's NodePluginToolDescriptorSchema (gateway-protocol
// schema/nodes.ts) and its node host (node-host/mcp.ts).
const (
	methodPluginToolsUpdate = "node.pluginTools.update"
	pluginIDNodeMCP         = "node-mcp"
	commandMCPCallV1        = "mcp.tools.call.v1"
	// mcpServer names the device's MCP server in descriptors; the bridge
	// accepts it in mcp.tools.call.v1 (api/mcp-mapping.md).
	mcpServer = "xiaozhi"

	maxPluginTools         = 128      // descriptors the gateway keeps per node
	maxToolNameLen         = 64       // ^[A-Za-z][A-Za-z0-9_-]{0,63}$
	maxToolDescription     = 1024     // UTF-16 code units, as JavaScript counts
	maxToolDescriptorBytes = 1 << 20  // one descriptor, JSON
	maxToolCatalogBytes    = 10 << 20 // all descriptors, JSON
)

// pluginTool is one NodePluginToolDescriptor (a closed object upstream:
// no other keys).
type pluginTool struct {
	PluginID    string          `json:"pluginId"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	Command     string          `json:"command"`
	MCP         pluginToolMCP   `json:"mcp"`
}

type pluginToolMCP struct {
	Server string `json:"server"`
	Tool   string `json:"tool"`
}

// pluginToolsParams are the params of node.pluginTools.update.
type pluginToolsParams struct {
	Tools []pluginTool `json:"tools"`
}

// defaultToolParameters is what OpenClaw assumes for a tool without an
// input schema.
var defaultToolParameters = json.RawMessage(`{"type":"object","properties":{},"additionalProperties":true}`)

// mcpTool is the part of an MCP tool definition a descriptor needs.
type mcpTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"inputSchema"`
}

// pluginToolsOf maps a device's MCP catalog (the node record's tools, a
// JSON array) to descriptors, in tool-name order, leaving out entries that
// are not tools. Names are "xiaozhi_<tool>" made provider-safe and unique.
// Tools awaiting an admin's approval are published too: whether the tenant
// requires approval is decided, like every call, by xiaoclaw's gateway,
// which refuses their calls with the approve-tools hint until then.
func pluginToolsOf(catalog json.RawMessage) []pluginTool {
	var entries []json.RawMessage
	if json.Unmarshal(catalog, &entries) != nil {
		return nil
	}
	tools := make([]mcpTool, 0, len(entries))
	seen := map[string]bool{}
	for _, e := range entries {
		var t mcpTool
		if json.Unmarshal(e, &t) != nil {
			continue
		}
		t.Name = strings.TrimSpace(t.Name)
		if t.Name == "" || seen[t.Name] {
			continue
		}
		seen[t.Name] = true
		tools = append(tools, t)
	}
	sortTools(tools)
	used := map[string]bool{}
	out := make([]pluginTool, 0, min(len(tools), maxPluginTools))
	total := 0
	for _, t := range tools {
		d := pluginTool{PluginID: pluginIDNodeMCP, Name: uniqueName(descriptorName(t.Name), used),
			Description: truncateUTF16(strings.TrimSpace(t.Description), maxToolDescription),
			Parameters:  objectOr(t.InputSchema), Command: commandMCPCallV1,
			MCP: pluginToolMCP{Server: mcpServer, Tool: t.Name}}
		if d.Description == "" {
			d.Description = truncateUTF16(t.Name, maxToolDescription)
		}
		b, err := json.Marshal(d)
		if err != nil || len(b) > maxToolDescriptorBytes || total+len(b) > maxToolCatalogBytes {
			continue
		}
		total += len(b)
		out = append(out, d)
		if len(out) == maxPluginTools {
			break
		}
	}
	return out
}

func sortTools(tools []mcpTool) {
	for i := 1; i < len(tools); i++ { // insertion sort: catalogs are small
		for j := i; j > 0 && tools[j].Name < tools[j-1].Name; j-- {
			tools[j], tools[j-1] = tools[j-1], tools[j]
		}
	}
}

// objectOr returns the schema when it is a JSON object, else the default.
func objectOr(schema json.RawMessage) json.RawMessage {
	s := strings.TrimSpace(string(schema))
	if strings.HasPrefix(s, "{") && json.Valid(schema) {
		return json.RawMessage(s)
	}
	return defaultToolParameters
}

// descriptorName is "xiaozhi_<tool>" with every run of characters outside
// [A-Za-z0-9_-] replaced by "_", within 64 characters.
func descriptorName(tool string) string {
	var b strings.Builder
	under := false
	for _, r := range tool {
		if r < utf8.RuneSelf && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			b.WriteRune(r)
			under = false
			continue
		}
		if !under {
			b.WriteByte('_')
			under = true
		}
	}
	frag := strings.Trim(b.String(), "_-")
	if frag == "" {
		frag = "tool"
	}
	name := mcpServer + "_" + frag
	return name[:min(len(name), maxToolNameLen)]
}

// uniqueName keeps names apart case-insensitively with _2, _3, ...
func uniqueName(base string, used map[string]bool) string {
	for i := 1; ; i++ {
		suffix := ""
		if i > 1 {
			suffix = "_" + strconv.Itoa(i)
		}
		c := base[:min(len(base), maxToolNameLen-len(suffix))] + suffix
		if k := strings.ToLower(c); !used[k] {
			used[k] = true
			return c
		}
	}
}

// truncateUTF16 cuts s to at most n UTF-16 code units without splitting a
// character.
func truncateUTF16(s string, n int) string {
	units := 0
	for i, r := range s {
		units += utf16.RuneLen(r)
		if units > n {
			return s[:i]
		}
	}
	return s
}
