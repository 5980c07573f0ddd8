// Package toolcall reads the MCP tool call out of the params of a node
// command that calls a tool: mcp.tools.call {name, arguments} and OpenClaw's
// mcp.tools.call.v1 {server, tool, arguments}. It is the one parser of those
// params: the gateway decides its policy and writes its audit row on what
// Parse returns, and the shim builds the device's JSON-RPC tools/call from
// the same result, so every hop acts on the same tool and the same
// arguments. Params that two JSON readers could read differently are
// refused rather than read one way: a key repeated in any object (escaped
// or not), bytes that are not UTF-8, and "name" in an mcp.tools.call.v1.
//
// Arguments stay raw JSON bytes, a sub-slice of the params.
package toolcall

import (
	"encoding/json"
	"errors"
	"strconv"
	"unicode/utf8"

	"github.com/xiaoclaw/xiaoclaw/pkg/jsonobj"
	"github.com/xiaoclaw/xiaoclaw/pkg/jsstr"
)

// The commands that call a tool.
const (
	CommandCall   = "mcp.tools.call"
	CommandCallV1 = "mcp.tools.call.v1" // OpenClaw's node-hosted MCP command
)

// IsToolCall reports whether command calls a tool, that is whether its
// params must go through Parse before anyone acts on them.
func IsToolCall(command string) bool {
	return command == CommandCall || command == CommandCallV1
}

// Call is the tool call a command's params hold.
type Call struct {
	// Tool is the tool's name, never empty: mcp.tools.call's name
	// verbatim, mcp.tools.call.v1's tool trimmed as JavaScript trims.
	Tool string
	// Server is mcp.tools.call.v1's server, trimmed, never empty; "" for
	// mcp.tools.call.
	Server string
	// Arguments is a JSON object, "{}" when the params had none or null.
	Arguments json.RawMessage
}

// ErrNotToolCall is returned by Parse for a command that calls no tool.
var ErrNotToolCall = errors.New("toolcall: command calls no tool")

// emptyArguments is what a call without arguments passes.
var emptyArguments = json.RawMessage("{}")

// Parse returns the tool call in params of command. The error's text says
// what is wrong in terms an operator can act on ("name must be a string");
// a caller answers it as an invalid request and never passes the call on.
func Parse(command string, params []byte) (Call, error) {
	if !IsToolCall(command) {
		return Call{}, ErrNotToolCall
	}
	params = trimJSONSpace(params)
	if len(params) == 0 || string(params) == "null" {
		if command == CommandCallV1 {
			return Call{}, errors.New("params required")
		}
		return Call{}, errors.New("name is required")
	}
	if params[0] != '{' {
		return Call{}, errors.New("params must be a JSON object")
	}
	if !utf8.Valid(params) {
		return Call{}, errors.New("params must be UTF-8")
	}
	var c Call
	var err error
	if command == CommandCallV1 {
		c, err = parseV1(params)
	} else {
		c, err = parseCall(params)
	}
	if err != nil {
		return Call{}, err
	}
	// Last, so the first error a caller sees is the most specific; the
	// walk above has validated params.
	if path, found := jsonobj.RepeatedKey(params); found {
		return Call{}, errors.New("key " + strconv.Quote(path) + " appears more than once")
	}
	return c, nil
}

func parseCall(params []byte) (Call, error) {
	var name, args []byte
	var err error
	if jsonobj.Walk(params, func(m jsonobj.Member) bool {
		switch {
		case m.Is("name"):
			name = m.Value
		case m.Is("arguments"):
			args = m.Value
		default:
			err = errors.New("unknown parameter " + strconv.Quote(m.Name()) + " for " + CommandCall)
		}
		return err == nil
	}) != nil {
		return Call{}, errors.New("params are not valid JSON")
	}
	if err != nil {
		return Call{}, err
	}
	if name == nil {
		return Call{}, errors.New("name is required")
	}
	tool, ok := jsonobj.String(name)
	switch {
	case !ok:
		return Call{}, errors.New("name must be a string")
	case tool == "":
		return Call{}, errors.New("name must not be empty")
	}
	a, err := arguments(args)
	if err != nil {
		return Call{}, err
	}
	return Call{Tool: tool, Arguments: a}, nil
}

// parseV1 follows OpenClaw's node host: server and tool are non-empty
// strings once trimmed, arguments an optional object, other keys are
// ignored — except "name", which mcp.tools.call spells the tool with: a
// reader of either command could take it for the tool.
func parseV1(params []byte) (Call, error) {
	var server, tool, args []byte
	named := false
	if jsonobj.Walk(params, func(m jsonobj.Member) bool {
		switch {
		case m.Is("server"):
			server = m.Value
		case m.Is("tool"):
			tool = m.Value
		case m.Is("arguments"):
			args = m.Value
		case m.Is("name"):
			named = true
		}
		return true
	}) != nil {
		return Call{}, errors.New("params are not valid JSON")
	}
	if named {
		return Call{}, errors.New(CommandCallV1 + ` names its tool with "tool", not "name"`)
	}
	s, _ := jsonobj.String(server)
	t, _ := jsonobj.String(tool)
	s, t = jsstr.Trim(s), jsstr.Trim(t)
	if s == "" || t == "" {
		return Call{}, errors.New("server and tool required")
	}
	a, err := arguments(args)
	if err != nil {
		return Call{}, err
	}
	return Call{Tool: t, Server: s, Arguments: a}, nil
}

// arguments returns the tool arguments: absent or null means {}.
func arguments(raw []byte) (json.RawMessage, error) {
	switch {
	case raw == nil || jsonobj.IsNull(raw):
		return emptyArguments, nil
	case !jsonobj.IsObject(raw):
		return nil, errors.New("arguments must be a JSON object")
	}
	return raw, nil
}

func trimJSONSpace(b []byte) []byte {
	for len(b) > 0 && isJSONSpace(b[0]) {
		b = b[1:]
	}
	for len(b) > 0 && isJSONSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	return b
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
