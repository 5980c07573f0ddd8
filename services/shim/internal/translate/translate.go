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
	"strconv"
	"strings"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/shim/internal/catalog"
	"github.com/xiaoclaw/xiaoclaw/services/shim/internal/jsonobj"
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
		} else if jsonobj.Walk(p, func(jsonobj.Member) bool { return false }) != nil {
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
	if len(params) == 0 {
		params = []byte("{}")
	}
	var f *wire.Fault
	err := walkParams(params, &f, func(m jsonobj.Member) bool {
		switch {
		case m.Is("cursor"):
			if !jsonobj.IsString(m.Value) {
				f = invalid("cursor must be a string")
			}
		case m.Is("withUserTools"):
			if !jsonobj.IsBool(m.Value) {
				f = invalid("withUserTools must be a boolean")
			}
		default:
			f = unknownParam(m, CommandToolsList)
		}
		return f == nil
	})
	if err != nil {
		return Call{}, err
	}
	return Call{Command: CommandToolsList, Method: "tools/list", Request: request("tools/list", params)}, nil
}

func prepareToolsCall(params json.RawMessage, t Target) (Call, *wire.Fault) {
	var nameRaw, argsRaw []byte
	var f *wire.Fault
	err := walkParams(params, &f, func(m jsonobj.Member) bool {
		switch {
		case m.Is("name"):
			nameRaw = m.Value
		case m.Is("arguments"):
			argsRaw = m.Value
		default:
			f = unknownParam(m, CommandToolsCall)
		}
		return f == nil
	})
	if err != nil {
		return Call{}, err
	}
	if nameRaw == nil {
		return Call{}, invalid("name is required")
	}
	name, ok := jsonobj.String(nameRaw)
	if !ok {
		return Call{}, invalid("name must be a string")
	}
	args, f := arguments(argsRaw)
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
	return Call{Command: CommandToolsCall, Method: "tools/call", Tool: name, Request: toolsCallRequest(nameRaw, args)}, nil
}

// prepareToolsCallV1 follows OpenClaw's node host: server and tool are
// trimmed, non-empty strings, arguments an optional object, other keys are
// ignored.
func prepareToolsCallV1(params json.RawMessage, t Target) (Call, *wire.Fault) {
	if len(params) == 0 {
		return Call{}, invalid("params required")
	}
	var serverRaw, toolRaw, argsRaw []byte
	if jsonobj.Walk(params, func(m jsonobj.Member) bool {
		switch {
		case m.Is("server"):
			serverRaw = m.Value
		case m.Is("tool"):
			toolRaw = m.Value
		case m.Is("arguments"):
			argsRaw = m.Value
		}
		return true
	}) != nil {
		return Call{}, invalid("params are not valid JSON")
	}
	server, _ := jsonobj.String(serverRaw)
	tool, _ := jsonobj.String(toolRaw)
	server, tool = strings.TrimSpace(server), strings.TrimSpace(tool)
	if server == "" || tool == "" {
		return Call{}, invalid("server and tool required")
	}
	args, f := arguments(argsRaw)
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
	name := toolRaw
	if string(toolRaw[1:len(toolRaw)-1]) != tool { // trimmed or unescaped: quote it afresh
		name, _ = json.Marshal(tool)
	}
	return Call{Command: CommandToolsCallV1, Method: "tools/call", Tool: tool, Request: toolsCallRequest(name, args)}, nil
}

// arguments returns the tool arguments (absent or null means {}); they must
// be a JSON object without repeated keys, since the device and the validator
// could otherwise read different values for one argument.
func arguments(raw []byte) (json.RawMessage, *wire.Fault) {
	if raw == nil || jsonobj.IsNull(raw) {
		return json.RawMessage("{}"), nil
	}
	if !jsonobj.IsObject(raw) {
		return nil, invalid("arguments must be a JSON object")
	}
	var seen [16][]byte
	keys := seen[:0]
	var dup string
	_ = jsonobj.Walk(raw, func(m jsonobj.Member) bool {
		if m.Escaped {
			k := []byte(m.Name())
			m.Key = k
		}
		for _, k := range keys {
			if bytes.Equal(k, m.Key) {
				dup = string(m.Key)
				return false
			}
		}
		keys = append(keys, m.Key)
		return true
	})
	if dup != "" {
		return nil, invalid(`argument "` + dup + `" appears more than once`)
	}
	return raw, nil
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

// walkParams walks a params object with fn, which records a fault in *f to
// stop. It returns the fault, or one for params that are not JSON.
func walkParams(params json.RawMessage, f **wire.Fault, fn func(jsonobj.Member) bool) *wire.Fault {
	if len(params) == 0 {
		return nil
	}
	if jsonobj.Walk(params, fn) != nil {
		return invalid("params are not valid JSON")
	}
	return *f
}

func unknownParam(m jsonobj.Member, command string) *wire.Fault {
	return invalid("unknown parameter " + strconv.Quote(m.Name()) + " for " + command)
}

func invalid(msg string) *wire.Fault {
	return &wire.Fault{Code: wire.FaultInvalidRequest, Message: msg}
}

// Reply maps what came back from the devicehub to the node.invoke payload,
// or a fault. faultCode is the reply's wire.HeaderFault value ("" for a
// device response); data is the reply body. The payload is a sub-slice of
// data.
func (c *Call) Reply(faultCode string, data []byte) (json.RawMessage, *wire.Fault) {
	if faultCode != "" {
		return nil, hubFault(faultCode, data)
	}
	var result, rpcErr []byte
	if jsonobj.Walk(data, func(m jsonobj.Member) bool {
		switch {
		case m.Is("result"):
			result = m.Value
		case m.Is("error"):
			rpcErr = m.Value
		}
		return true
	}) != nil {
		return nil, &wire.Fault{Code: wire.FaultUnavailable, Message: "device sent an invalid JSON-RPC response"}
	}
	if rpcErr != nil && !jsonobj.IsNull(rpcErr) {
		return nil, c.deviceError(rpcErr)
	}
	if result == nil || jsonobj.IsNull(result) {
		return nil, &wire.Fault{Code: wire.FaultUnavailable, Message: "device sent a JSON-RPC response without result"}
	}
	if c.Command == CommandToolsCallV1 {
		return toolResultV1(result)
	}
	return result, nil
}

// deviceError maps a JSON-RPC error. XiaoZhi firmware sends only a message,
// no code; the error object travels verbatim in details.rpcError.
func (c *Call) deviceError(raw json.RawMessage) *wire.Fault {
	var e struct {
		Message string `json:"message"`
	}
	_ = json.Unmarshal(raw, &e) // an error object without a message still is an error
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
	var content, structured []byte
	isError := false
	err := jsonobj.Walk(result, func(m jsonobj.Member) bool {
		switch {
		case m.Is("content"):
			content = m.Value
		case m.Is("structuredContent"):
			structured = m.Value
		case m.Is("isError"):
			isError = string(m.Value) == "true"
		}
		return true
	})
	if err != nil || content != nil && content[0] != '[' && !jsonobj.IsNull(content) {
		return nil, &wire.Fault{Code: wire.FaultUnavailable, Message: "device sent a tool result that is not an MCP CallToolResult"}
	}
	if content == nil || jsonobj.IsNull(content) {
		content = []byte("[]")
	}
	b := make([]byte, 0, len(content)+len(structured)+64)
	b = append(b, `{"content":`...)
	b = append(b, content...)
	if structured != nil && !jsonobj.IsNull(structured) {
		b = append(b, `,"structuredContent":`...)
		b = append(b, structured...)
	}
	if isError {
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
