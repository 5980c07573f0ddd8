// Package translate maps the node commands of a XiaoZhi node to one MCP
// JSON-RPC request each, and the device's JSON-RPC response (or a devicehub
// fault) back to a node.invoke payload or fault. api/mcp-mapping.md documents
// the mapping; this package is its only implementation.
//
// Arguments and results stay raw JSON bytes: params are scanned once, tool
// arguments are parsed only to validate them against the tool's inputSchema,
// and results are copied through untouched except where OpenClaw's
// mcp.tools.call.v1 shape differs from MCP's.
package translate

import (
	"bytes"
	"encoding/json"
	"strings"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/shim/internal/catalog"
)

// Commands a XiaoZhi node declares.
const (
	CommandInitialize  = "mcp.initialize"
	CommandToolsList   = "mcp.tools.list"
	CommandToolsCall   = "mcp.tools.call"
	CommandToolsCallV1 = "mcp.tools.call.v1" // OpenClaw's node-hosted MCP command
)

// Commands returns the commands of an MCP-capable XiaoZhi node, sorted.
func Commands() []string {
	return []string{CommandInitialize, CommandToolsCall, CommandToolsCallV1, CommandToolsList}
}

// ServerName is the MCP server name of every XiaoZhi device in
// mcp.tools.call.v1 (the device's board name is accepted too).
const ServerName = "xiaozhi"

// Fault codes of mcp.tools.call.v1, the codes OpenClaw's node host uses for
// the same conditions.
const (
	FaultMCPServerUnavailable = "MCP_SERVER_UNAVAILABLE"
	FaultMCPToolUnavailable   = "MCP_TOOL_UNAVAILABLE"
	FaultMCPToolError         = "MCP_TOOL_ERROR"
)

// Target is what a call needs to know about the node.
type Target struct {
	Catalog *catalog.Catalog
	// Board is the device's MCP serverInfo.name; mcp.tools.call.v1 accepts it
	// as a server name besides ServerName.
	Board string
}

// Call is one prepared command.
type Call struct {
	Command string
	Method  string // JSON-RPC method sent to the device
	Tool    string // the tool, for tool calls
	// Request is the JSON-RPC 2.0 request without "id" (the devicehub assigns
	// the id on the device's session).
	Request []byte
}

// initializeParams are sent when mcp.initialize comes without params.
const initializeParams = `{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"xiaoclaw","version":"1"}}`

// Prepare checks command and params against the node and builds the JSON-RPC
// request. A nil fault means the call may go to the device.
func Prepare(command string, params json.RawMessage, t Target) (Call, *wire.Fault) {
	params = bytes.TrimSpace(params)
	if bytes.Equal(params, []byte("null")) {
		params = nil
	}
	if len(params) > 0 && params[0] != '{' {
		return Call{}, invalid("params must be a JSON object")
	}
	switch command {
	case CommandInitialize:
		p := params
		if len(p) == 0 {
			p = []byte(initializeParams)
		} else if !json.Valid(p) {
			return Call{}, invalid("params are not valid JSON")
		}
		return Call{Command: command, Method: "initialize", Request: request("initialize", p)}, nil
	case CommandToolsList:
		return prepareToolsList(params)
	case CommandToolsCall:
		return prepareToolsCall(params, t)
	case CommandToolsCallV1:
		return prepareToolsCallV1(params, t)
	}
	return Call{}, invalid("command not supported by node: " + command)
}

func prepareToolsList(params json.RawMessage) (Call, *wire.Fault) {
	var p struct {
		Cursor        *json.RawMessage `json:"cursor"`
		WithUserTools *json.RawMessage `json:"withUserTools"`
	}
	if f := decodeStrict(params, &p, CommandToolsList); f != nil {
		return Call{}, f
	}
	if p.Cursor != nil && !isString(*p.Cursor) {
		return Call{}, invalid("cursor must be a string")
	}
	if p.WithUserTools != nil && !isBool(*p.WithUserTools) {
		return Call{}, invalid("withUserTools must be a boolean")
	}
	if len(params) == 0 {
		params = []byte("{}")
	}
	return Call{Command: CommandToolsList, Method: "tools/list", Request: request("tools/list", params)}, nil
}

func prepareToolsCall(params json.RawMessage, t Target) (Call, *wire.Fault) {
	var p struct {
		Name      *json.RawMessage `json:"name"`
		Arguments *json.RawMessage `json:"arguments"`
	}
	if f := decodeStrict(params, &p, CommandToolsCall); f != nil {
		return Call{}, f
	}
	if p.Name == nil {
		return Call{}, invalid("name is required")
	}
	var name string
	if !isString(*p.Name) || json.Unmarshal(*p.Name, &name) != nil {
		return Call{}, invalid("name must be a string")
	}
	args, f := arguments(p.Arguments)
	if f != nil {
		return Call{}, f
	}
	tool, ok := t.Catalog.Tool(name)
	if !ok {
		return Call{}, invalid("unknown tool: " + name)
	}
	if err := tool.Validate(args); err != nil {
		return Call{}, invalid(err.Error())
	}
	return Call{Command: CommandToolsCall, Method: "tools/call", Tool: name, Request: toolsCallRequest(*p.Name, args)}, nil
}

// prepareToolsCallV1 follows OpenClaw's node host: server and tool are
// trimmed, non-empty strings, arguments an optional object, other keys are
// ignored.
func prepareToolsCallV1(params json.RawMessage, t Target) (Call, *wire.Fault) {
	if len(params) == 0 {
		return Call{}, invalid("params required")
	}
	var p struct {
		Server    json.RawMessage  `json:"server"`
		Tool      json.RawMessage  `json:"tool"`
		Arguments *json.RawMessage `json:"arguments"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		return Call{}, invalid("params are not valid JSON")
	}
	server, tool := trimmedString(p.Server), trimmedString(p.Tool)
	if server == "" || tool == "" {
		return Call{}, invalid("server and tool required")
	}
	args, f := arguments(p.Arguments)
	if f != nil {
		return Call{}, f
	}
	if server != ServerName && (t.Board == "" || server != t.Board) {
		return Call{}, &wire.Fault{Code: FaultMCPServerUnavailable, Message: `MCP server "` + server + `" is unavailable`}
	}
	tl, ok := t.Catalog.Tool(tool)
	if !ok {
		return Call{}, &wire.Fault{Code: FaultMCPToolUnavailable, Message: `MCP tool "` + tool + `" is unavailable on server "` + server + `"`}
	}
	if err := tl.Validate(args); err != nil {
		return Call{}, invalid(err.Error())
	}
	name, _ := json.Marshal(tool)
	return Call{Command: CommandToolsCallV1, Method: "tools/call", Tool: tool, Request: toolsCallRequest(name, args)}, nil
}

// arguments returns the tool arguments (absent means {}); they must be a JSON
// object.
func arguments(raw *json.RawMessage) (json.RawMessage, *wire.Fault) {
	if raw == nil {
		return json.RawMessage("{}"), nil
	}
	a := bytes.TrimSpace(*raw)
	if len(a) == 0 || a[0] != '{' {
		return nil, invalid("arguments must be a JSON object")
	}
	return a, nil
}

func request(method string, params []byte) []byte {
	b := make([]byte, 0, len(`{"jsonrpc":"2.0","method":"","params":}`)+len(method)+len(params))
	b = append(b, `{"jsonrpc":"2.0","method":"`...)
	b = append(b, method...)
	b = append(b, `","params":`...)
	b = append(b, params...)
	return append(b, '}')
}

func toolsCallRequest(name, args []byte) []byte {
	const head = `{"jsonrpc":"2.0","method":"tools/call","params":{"name":`
	b := make([]byte, 0, len(head)+len(name)+len(`,"arguments":}}`)+len(args))
	b = append(b, head...)
	b = append(b, name...)
	b = append(b, `,"arguments":`...)
	b = append(b, args...)
	return append(b, "}}"...)
}

// decodeStrict decodes a params object into v, refusing keys v does not
// declare, so a typo such as "args" fails instead of calling with no
// arguments.
func decodeStrict(params json.RawMessage, v any, command string) *wire.Fault {
	if len(params) == 0 {
		return nil
	}
	d := json.NewDecoder(bytes.NewReader(params))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		msg := err.Error()
		if field, ok := strings.CutPrefix(msg, "json: unknown field "); ok {
			return invalid("unknown parameter " + field + " for " + command)
		}
		return invalid("params are not valid JSON")
	}
	if d.More() {
		return invalid("params are not valid JSON")
	}
	return nil
}

func isString(raw json.RawMessage) bool { return len(raw) > 0 && raw[0] == '"' }

func isBool(raw json.RawMessage) bool {
	return bytes.Equal(raw, []byte("true")) || bytes.Equal(raw, []byte("false"))
}

func trimmedString(raw json.RawMessage) string {
	var s string
	if !isString(raw) || json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return strings.TrimSpace(s)
}

func invalid(msg string) *wire.Fault {
	return &wire.Fault{Code: wire.FaultInvalidRequest, Message: msg}
}

// rpcResponse is a JSON-RPC 2.0 response as a XiaoZhi device sends it.
type rpcResponse struct {
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
}

type rpcError struct {
	Message string `json:"message"`
}

// Reply maps what came back from the devicehub to the node.invoke payload,
// or a fault. faultCode is the reply's wire.HeaderFault value ("" for a
// device response); data is the reply body.
func (c *Call) Reply(faultCode string, data []byte) (json.RawMessage, *wire.Fault) {
	if faultCode != "" {
		return nil, hubFault(faultCode, data)
	}
	var r rpcResponse
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, &wire.Fault{Code: wire.FaultUnavailable, Message: "device sent an invalid JSON-RPC response"}
	}
	if len(r.Error) > 0 && !bytes.Equal(r.Error, []byte("null")) {
		return nil, c.deviceError(r.Error)
	}
	if len(r.Result) == 0 || bytes.Equal(r.Result, []byte("null")) {
		return nil, &wire.Fault{Code: wire.FaultUnavailable, Message: "device sent a JSON-RPC response without result"}
	}
	if c.Command == CommandToolsCallV1 {
		return toolResultV1(r.Result)
	}
	return r.Result, nil
}

// deviceError maps a JSON-RPC error. XiaoZhi firmware sends only a message,
// no code; the error object travels verbatim in details.rpcError.
func (c *Call) deviceError(raw json.RawMessage) *wire.Fault {
	var e rpcError
	_ = json.Unmarshal(raw, &e) // a malformed error object still is an error
	msg := strings.TrimSpace(e.Message)
	if msg == "" {
		msg = "device returned an error"
	}
	code := wire.FaultDeviceError
	if c.Command == CommandToolsCallV1 {
		code = FaultMCPToolError
	}
	details := make([]byte, 0, len(`{"rpcError":}`)+len(raw))
	details = append(details, `{"rpcError":`...)
	details = append(details, raw...)
	details = append(details, '}')
	return &wire.Fault{Code: code, Message: msg, Details: details}
}

// toolResultV1 reshapes an MCP tools/call result the way OpenClaw's node
// host returns it for mcp.tools.call.v1: content, structuredContent when
// present, isError only when true.
func toolResultV1(result json.RawMessage) (json.RawMessage, *wire.Fault) {
	var r struct {
		Content           json.RawMessage `json:"content"`
		StructuredContent json.RawMessage `json:"structuredContent"`
		IsError           bool            `json:"isError"`
	}
	if err := json.Unmarshal(result, &r); err != nil || len(r.Content) > 0 && r.Content[0] != '[' && !bytes.Equal(r.Content, []byte("null")) {
		return nil, &wire.Fault{Code: wire.FaultUnavailable, Message: "device sent a tool result that is not an MCP CallToolResult"}
	}
	content := r.Content
	if len(content) == 0 || bytes.Equal(content, []byte("null")) {
		content = json.RawMessage("[]")
	}
	b := make([]byte, 0, len(content)+len(r.StructuredContent)+64)
	b = append(b, `{"content":`...)
	b = append(b, content...)
	if len(r.StructuredContent) > 0 && !bytes.Equal(r.StructuredContent, []byte("null")) {
		b = append(b, `,"structuredContent":`...)
		b = append(b, r.StructuredContent...)
	}
	if r.IsError {
		b = append(b, `,"isError":true`...)
	}
	return append(b, '}'), nil
}

// hubFault decodes a wire.Fault sent by the devicehub; a body that is not a
// fault still yields the header's code.
func hubFault(code string, data []byte) *wire.Fault {
	var f wire.Fault
	if err := json.Unmarshal(data, &f); err != nil || f.Code == "" {
		f = wire.Fault{Code: code}
	}
	if f.Message == "" {
		f.Message = "devicehub reported " + f.Code
	}
	return &f
}
