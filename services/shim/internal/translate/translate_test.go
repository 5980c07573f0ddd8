package translate

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/shim/internal/catalog"
)

const tools = `[
 {"name":"self.get_device_status","description":"status","inputSchema":{"type":"object","properties":{}}},
 {"name":"self.audio_speaker.set_volume","description":"volume","inputSchema":{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}},
 {"name":"self.screen.set_theme","description":"theme","inputSchema":{"type":"object","properties":{"theme":{"type":"string"}},"required":["theme"]}}
]`

func target() Target {
	return Target{Catalog: catalog.New(json.RawMessage(tools), catalog.NewSchemas(0)), Board: "bread-compact-wifi"}
}

func TestPrepare(t *testing.T) {
	tests := []struct {
		name    string
		command string
		params  string
		want    string // the JSON-RPC request
		code    string // or the fault
		msg     string // contained in the fault message
	}{
		{"initialize default", CommandInitialize, ``,
			`{"jsonrpc":"2.0","method":"initialize","params":` + initializeParams + `}`, "", ""},
		{"initialize null params", CommandInitialize, `null`,
			`{"jsonrpc":"2.0","method":"initialize","params":` + initializeParams + `}`, "", ""},
		{"initialize given params", CommandInitialize, `{"capabilities":{"vision":{"url":"u","token":"t"}}}`,
			`{"jsonrpc":"2.0","method":"initialize","params":{"capabilities":{"vision":{"url":"u","token":"t"}}}}`, "", ""},
		{"initialize broken JSON", CommandInitialize, `{"capabilities":`, "", wire.FaultInvalidRequest, "not valid JSON"},
		{"params not an object", CommandToolsList, `[1]`, "", wire.FaultInvalidRequest, "params must be a JSON object"},
		{"tools.list default", CommandToolsList, ``,
			`{"jsonrpc":"2.0","method":"tools/list","params":{}}`, "", ""},
		{"tools.list paged", CommandToolsList, `{"cursor":"self.reboot","withUserTools":true}`,
			`{"jsonrpc":"2.0","method":"tools/list","params":{"cursor":"self.reboot","withUserTools":true}}`, "", ""},
		{"tools.list cursor not a string", CommandToolsList, `{"cursor":3}`, "", wire.FaultInvalidRequest, "cursor must be a string"},
		{"tools.list withUserTools not a bool", CommandToolsList, `{"withUserTools":"yes"}`, "", wire.FaultInvalidRequest, "withUserTools must be a boolean"},
		{"tools.list unknown key", CommandToolsList, `{"limit":3}`, "", wire.FaultInvalidRequest, `unknown parameter "limit" for mcp.tools.list`},
		{"tools.call", CommandToolsCall, `{"name":"self.audio_speaker.set_volume","arguments":{"volume":50}}`,
			`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":50}}}`, "", ""},
		{"tools.call no arguments", CommandToolsCall, `{"name":"self.get_device_status"}`,
			`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"self.get_device_status","arguments":{}}}`, "", ""},
		{"tools.call null arguments", CommandToolsCall, `{"name":"self.get_device_status","arguments":null}`,
			`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"self.get_device_status","arguments":{}}}`, "", ""},
		{"tools.call without params", CommandToolsCall, ``, "", wire.FaultInvalidRequest, "name is required"},
		{"tools.call name not a string", CommandToolsCall, `{"name":7}`, "", wire.FaultInvalidRequest, "name must be a string"},
		{"tools.call arguments not an object", CommandToolsCall, `{"name":"self.get_device_status","arguments":[1]}`, "", wire.FaultInvalidRequest, "arguments must be a JSON object"},
		{"tools.call unknown tool", CommandToolsCall, `{"name":"self.nope"}`, "", wire.FaultInvalidRequest, "unknown tool: self.nope"},
		{"tools.call above maximum", CommandToolsCall, `{"name":"self.audio_speaker.set_volume","arguments":{"volume":101}}`, "", wire.FaultInvalidRequest,
			`invalid arguments for self.audio_speaker.set_volume: argument "volume": maximum: got 101, want 100`},
		{"tools.call below minimum", CommandToolsCall, `{"name":"self.audio_speaker.set_volume","arguments":{"volume":-1}}`, "", wire.FaultInvalidRequest,
			`argument "volume": minimum: got -1, want 0`},
		{"tools.call not an integer", CommandToolsCall, `{"name":"self.audio_speaker.set_volume","arguments":{"volume":5.5}}`, "", wire.FaultInvalidRequest,
			`argument "volume": got number, want integer`},
		{"tools.call missing argument", CommandToolsCall, `{"name":"self.screen.set_theme","arguments":{}}`, "", wire.FaultInvalidRequest,
			`missing argument "theme"`},
		{"tools.call repeated argument", CommandToolsCall, `{"name":"self.audio_speaker.set_volume","arguments":{"volume":150,"volume":50}}`, "", wire.FaultInvalidRequest,
			`key "arguments.volume" appears more than once`},
		{"tools.call repeated escaped argument", CommandToolsCall, `{"name":"self.audio_speaker.set_volume","arguments":{"volume":150,"vol\u0075me":50}}`, "", wire.FaultInvalidRequest,
			`key "arguments.volume" appears more than once`},
		{"tools.call escaped name", CommandToolsCall, `{"name":"self.get\u005fdevice_status"}`,
			`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"self.get_device_status","arguments":{}}}`, "", ""},
		{"tools.call repeated name", CommandToolsCall, `{"name":"self.audio_speaker.set_volume","name":"self.get_device_status"}`, "", wire.FaultInvalidRequest,
			`key "name" appears more than once`},
		{"tools.call tool beside name", CommandToolsCall, `{"name":"self.get_device_status","tool":"self.reboot"}`, "", wire.FaultInvalidRequest,
			`unknown parameter "tool" for mcp.tools.call`},
		{"v1 repeated tool", CommandToolsCallV1, `{"server":"xiaozhi","tool":"self.get_device_status","t\u006fol":"self.reboot"}`, "", wire.FaultInvalidRequest,
			`key "tool" appears more than once`},
		{"v1 name beside tool", CommandToolsCallV1, `{"server":"xiaozhi","name":"self.get_device_status","tool":"self.reboot"}`, "", wire.FaultInvalidRequest,
			`names its tool with "tool", not "name"`},
		{"v1 tool trimmed as JavaScript trims", CommandToolsCallV1, `{"server":"xiaozhi","tool":"\ufeffself.get_device_status\u00a0"}`,
			`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"self.get_device_status","arguments":{}}}`, "", ""},
		{"tools.call misspelt key", CommandToolsCall, `{"name":"self.get_device_status","args":{}}`, "", wire.FaultInvalidRequest,
			`unknown parameter "args" for mcp.tools.call`},
		{"tools.call trailing data", CommandToolsCall, `{"name":"self.get_device_status"} {}`, "", wire.FaultInvalidRequest, "not valid JSON"},
		{"v1", CommandToolsCallV1, `{"server":"xiaozhi","tool":"self.audio_speaker.set_volume","arguments":{"volume":1},"extra":true}`,
			`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"self.audio_speaker.set_volume","arguments":{"volume":1}}}`, "", ""},
		{"v1 board as server, names trimmed", CommandToolsCallV1, `{"server":" bread-compact-wifi ","tool":" self.get_device_status"}`,
			`{"jsonrpc":"2.0","method":"tools/call","params":{"name":"self.get_device_status","arguments":{}}}`, "", ""},
		{"v1 without params", CommandToolsCallV1, ``, "", wire.FaultInvalidRequest, "params required"},
		{"v1 without tool", CommandToolsCallV1, `{"server":"xiaozhi"}`, "", wire.FaultInvalidRequest, "server and tool required"},
		{"v1 blank server", CommandToolsCallV1, `{"server":"  ","tool":"x"}`, "", wire.FaultInvalidRequest, "server and tool required"},
		{"v1 arguments not an object", CommandToolsCallV1, `{"server":"xiaozhi","tool":"self.get_device_status","arguments":"x"}`, "", wire.FaultInvalidRequest, "arguments must be a JSON object"},
		{"v1 unknown server", CommandToolsCallV1, `{"server":"fs","tool":"read"}`, "", FaultMCPServerUnavailable, `MCP server "fs" is unavailable`},
		{"v1 unknown tool", CommandToolsCallV1, `{"server":"xiaozhi","tool":"read"}`, "", FaultMCPToolUnavailable, `MCP tool "read" is unavailable on server "xiaozhi"`},
		{"v1 invalid arguments", CommandToolsCallV1, `{"server":"xiaozhi","tool":"self.audio_speaker.set_volume","arguments":{"volume":"x"}}`, "", wire.FaultInvalidRequest, `argument "volume": got string, want integer`},
		{"unknown command", "system.run", `{}`, "", wire.FaultInvalidRequest, "command not supported by node: system.run"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			call, f := Prepare(tt.command, json.RawMessage(tt.params), target())
			if tt.code != "" {
				if f == nil {
					t.Fatalf("no fault; request %s", call.Request)
				}
				if f.Code != tt.code || !strings.Contains(f.Message, tt.msg) {
					t.Fatalf("fault = %s %q, want %s containing %q", f.Code, f.Message, tt.code, tt.msg)
				}
				return
			}
			if f != nil {
				t.Fatalf("fault %s: %s", f.Code, f.Message)
			}
			if string(call.Request) != tt.want {
				t.Errorf("request\n got %s\nwant %s", call.Request, tt.want)
			}
			if !json.Valid(call.Request) {
				t.Errorf("request is not valid JSON")
			}
		})
	}
}

func TestReply(t *testing.T) {
	tests := []struct {
		name    string
		command string
		fault   string // the Xc-Fault header
		data    string
		want    string
		code    string
		msg     string
		details string
	}{
		{"result verbatim", CommandToolsCall, "", `{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"true"}],"isError":false}}`,
			`{"content":[{"type":"text","text":"true"}],"isError":false}`, "", "", ""},
		{"tools/list verbatim", CommandToolsList, "", `{"jsonrpc":"2.0","id":3,"result":{"tools":[],"nextCursor":"b"}}`,
			`{"tools":[],"nextCursor":"b"}`, "", "", ""},
		{"device error without code", CommandToolsCall, "", `{"jsonrpc":"2.0","id":3,"error":{"message":"Unknown tool: x"}}`,
			"", wire.FaultDeviceError, "Unknown tool: x", `{"rpcError":{"message":"Unknown tool: x"}}`},
		{"emulator error with code", CommandInitialize, "", `{"jsonrpc":"2.0","id":3,"error":{"code":-32603,"message":"boom"}}`,
			"", wire.FaultDeviceError, "boom", `{"rpcError":{"code":-32603,"message":"boom"}}`},
		{"error without message", CommandToolsCall, "", `{"jsonrpc":"2.0","id":3,"error":{}}`,
			"", wire.FaultDeviceError, "device returned an error", `{"rpcError":{}}`},
		{"v1 device error", CommandToolsCallV1, "", `{"jsonrpc":"2.0","id":3,"error":{"message":"Missing valid argument: volume"}}`,
			"", FaultMCPToolError, "Missing valid argument: volume", ""},
		{"v1 drops isError false", CommandToolsCallV1, "", `{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"true"}],"isError":false}}`,
			`{"content":[{"type":"text","text":"true"}]}`, "", "", ""},
		{"v1 keeps isError true and structuredContent", CommandToolsCallV1, "", `{"jsonrpc":"2.0","id":3,"result":{"content":[],"structuredContent":{"a":1},"isError":true,"_meta":{}}}`,
			`{"content":[],"structuredContent":{"a":1},"isError":true}`, "", "", ""},
		{"v1 content missing", CommandToolsCallV1, "", `{"jsonrpc":"2.0","id":3,"result":{}}`,
			`{"content":[]}`, "", "", ""},
		{"v1 content not a list", CommandToolsCallV1, "", `{"jsonrpc":"2.0","id":3,"result":{"content":"x"}}`,
			"", wire.FaultUnavailable, "not an MCP CallToolResult", ""},
		{"no result", CommandToolsCall, "", `{"jsonrpc":"2.0","id":3}`, "", wire.FaultUnavailable, "without result", ""},
		{"not JSON", CommandToolsCall, "", `{"jsonrpc":`, "", wire.FaultUnavailable, "invalid JSON-RPC response", ""},
		{"hub fault", CommandToolsCall, wire.FaultDisconnected, `{"code":"DISCONNECTED","message":"session ended"}`,
			"", wire.FaultDisconnected, "session ended", ""},
		{"hub fault without body", CommandToolsCall, wire.FaultBusy, ``, "", wire.FaultBusy, "devicehub reported BUSY", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			call := Call{Command: tt.command}
			payload, f := call.Reply(tt.fault, []byte(tt.data))
			if tt.code != "" {
				if f == nil {
					t.Fatalf("no fault; payload %s", payload)
				}
				if f.Code != tt.code || !strings.Contains(f.Message, tt.msg) {
					t.Fatalf("fault = %s %q, want %s containing %q", f.Code, f.Message, tt.code, tt.msg)
				}
				if tt.details != "" && string(f.Details) != tt.details {
					t.Errorf("details = %s, want %s", f.Details, tt.details)
				}
				return
			}
			if f != nil {
				t.Fatalf("fault %s: %s", f.Code, f.Message)
			}
			if string(payload) != tt.want {
				t.Errorf("payload\n got %s\nwant %s", payload, tt.want)
			}
		})
	}
}

func TestCommandsSorted(t *testing.T) {
	c := Commands()
	for i := 1; i < len(c); i++ {
		if c[i-1] >= c[i] {
			t.Fatalf("commands not sorted: %v", c)
		}
	}
}

// FuzzPrepare feeds arbitrary params to every command: Prepare must never
// panic, and whatever it lets through must be one well-formed JSON-RPC
// request for a tool the node has.
func FuzzPrepare(f *testing.F) {
	seeds := []struct{ cmd, params string }{
		{CommandInitialize, ``},
		{CommandInitialize, `{"capabilities":{}}`},
		{CommandToolsList, `{"cursor":"a","withUserTools":false}`},
		{CommandToolsCall, `{"name":"self.audio_speaker.set_volume","arguments":{"volume":50}}`},
		{CommandToolsCall, `{"name":"self.audio_speaker.set_volume","arguments":{"volume":500}}`},
		{CommandToolsCall, `{"name":"self.screen.set_theme","arguments":{"theme":"\u0000dark"}}`},
		{CommandToolsCall, `{"name":"\ud800","arguments":{}}`},
		{CommandToolsCallV1, `{"server":"xiaozhi","tool":"self.get_device_status","arguments":{}}`},
		{CommandToolsCallV1, `{"server":"xiaozhi","tool":"self.get_device_status","arguments":{"a":[1,{"b":null}]}}`},
		{CommandToolsCall, `{"name":"self.get_device_status","arguments":{"x":1e999}}`},
		{"other", `{}`},
		{CommandToolsCall, `{`},
	}
	for _, s := range seeds {
		f.Add(s.cmd, []byte(s.params))
	}
	tg := target()
	f.Fuzz(func(t *testing.T, command string, params []byte) {
		call, fault := Prepare(command, params, tg)
		if fault != nil {
			if fault.Code == "" || fault.Message == "" {
				t.Fatalf("fault without code or message: %+v", fault)
			}
			return
		}
		var req struct {
			JSONRPC string `json:"jsonrpc"`
			Method  string `json:"method"`
			Params  struct {
				Name      string          `json:"name"`
				Arguments json.RawMessage `json:"arguments"`
			} `json:"params"`
			ID any `json:"id"`
		}
		if err := json.Unmarshal(call.Request, &req); err != nil {
			t.Fatalf("request %q is not valid JSON: %v", call.Request, err)
		}
		if req.JSONRPC != "2.0" || req.Method != call.Method || req.ID != nil {
			t.Fatalf("request %q: bad envelope", call.Request)
		}
		if req.Method == "tools/call" {
			if _, ok := tg.Catalog.Tool(req.Params.Name); !ok || req.Params.Name != call.Tool {
				t.Fatalf("request %q calls a tool the node does not have", call.Request)
			}
			if len(req.Params.Arguments) == 0 || req.Params.Arguments[0] != '{' {
				t.Fatalf("request %q: arguments not an object", call.Request)
			}
		}
	})
}

// FuzzReply feeds arbitrary device replies: Reply must never panic and must
// either fault or return valid JSON.
func FuzzReply(f *testing.F) {
	f.Add(CommandToolsCall, "", []byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[],"isError":false}}`))
	f.Add(CommandToolsCallV1, "", []byte(`{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"x"}],"structuredContent":{}}}`))
	f.Add(CommandToolsCallV1, "", []byte(`{"jsonrpc":"2.0","id":1,"error":{"message":"m"}}`))
	f.Add(CommandToolsList, "DISCONNECTED", []byte(`{"code":"DISCONNECTED","message":"x"}`))
	f.Add(CommandInitialize, "", []byte(`{"result":null,"error":null}`))
	f.Fuzz(func(t *testing.T, command, fault string, data []byte) {
		call := Call{Command: command}
		payload, fl := call.Reply(fault, data)
		if fl != nil {
			if fl.Code == "" || fl.Message == "" {
				t.Fatalf("fault without code or message: %+v", fl)
			}
			if len(fl.Details) > 0 && !json.Valid(fl.Details) {
				t.Fatalf("details %q are not valid JSON", fl.Details)
			}
			return
		}
		if !json.Valid(payload) {
			t.Fatalf("payload %q is not valid JSON", payload)
		}
	})
}

func BenchmarkPrepareToolsCall(b *testing.B) {
	tg := target()
	params := json.RawMessage(`{"name":"self.audio_speaker.set_volume","arguments":{"volume":50}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, f := Prepare(CommandToolsCall, params, tg); f != nil {
			b.Fatal(f)
		}
	}
}

func BenchmarkReplyToolsCall(b *testing.B) {
	call := Call{Command: CommandToolsCall}
	data := []byte(`{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"true"}],"isError":false}}`)
	b.ReportAllocs()
	for b.Loop() {
		if _, f := call.Reply("", data); f != nil {
			b.Fatal(f)
		}
	}
}
