// Package translate maps the node commands of a XiaoZhi node to one MCP
// JSON-RPC request each, and the device's JSON-RPC response (or a devicehub
// fault) back to a node.invoke payload or fault. api/mcp-mapping.md documents
// the mapping; this package is its only implementation.
//
// Tool calls are read with pkg/toolcall, the parser the gateway's policy and
// audit use, so the device gets the call the gateway allowed.
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

	"github.com/xiaoclaw/xiaoclaw/pkg/jsonobj"
	"github.com/xiaoclaw/xiaoclaw/pkg/toolcall"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/shim/internal/catalog"
)

// Commands a XiaoZhi node declares.
const (
	CommandInitialize  = "mcp.initialize"
	CommandToolsList   = "mcp.tools.list"
	CommandToolsCall   = toolcall.CommandCall
	CommandToolsCallV1 = toolcall.CommandCallV1 // OpenClaw's node-hosted MCP command
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
	case CommandToolsCall, CommandToolsCallV1:
		return prepareToolsCall(command, params, t)
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

// prepareToolsCall reads the call with toolcall.Parse, the parser the
// gateway decided its policy on, then checks it against the node's catalog.
func prepareToolsCall(command string, params json.RawMessage, t Target) (Call, *wire.Fault) {
	tc, err := toolcall.Parse(command, params)
	if err != nil {
		return Call{}, invalid(err.Error())
	}
	if command == CommandToolsCallV1 && tc.Server != ServerName && (t.Board == "" || tc.Server != t.Board) {
		return Call{}, &wire.Fault{Code: FaultMCPServerUnavailable, Message: `MCP server "` + tc.Server + `" is unavailable`}
	}
	tool, ok := t.Catalog.Tool(tc.Tool)
	switch {
	case !ok && command == CommandToolsCallV1:
		return Call{}, &wire.Fault{Code: FaultMCPToolUnavailable, Message: `MCP tool "` + tc.Tool + `" is unavailable on server "` + tc.Server + `"`}
	case !ok:
		return Call{}, invalid("unknown tool: " + tc.Tool)
	}
	if err := tool.Validate(tc.Arguments); err != nil {
		return Call{}, invalid(err.Error())
	}
	return Call{Command: command, Method: "tools/call", Tool: tc.Tool, Request: toolsCallRequest(tc.Tool, tc.Arguments)}, nil
}

func request(method string, params []byte) []byte {
	b := make([]byte, 0, len(`{"jsonrpc":"2.0","method":"","params":}`)+len(method)+len(params))
	b = append(b, `{"jsonrpc":"2.0","method":"`...)
	b = append(b, method...)
	b = append(b, `","params":`...)
	b = append(b, params...)
	return append(b, '}')
}

// toolsCallRequest encodes the tools/call request; the tool name is
// written afresh from the parsed string, so the device reads exactly the
// name the policy was asked about.
func toolsCallRequest(name string, args []byte) []byte {
	const head = `{"jsonrpc":"2.0","method":"tools/call","params":{"name":`
	b := make([]byte, 0, len(head)+len(name)+2+len(`,"arguments":}}`)+len(args))
	b = append(b, head...)
	b = appendJSONString(b, name)
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

// appendJSONString appends s as a JSON string; tool names are plain ASCII
// and take the short way.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= 0x7f {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	return append(append(append(b, '"'), s...), '"')
}
