package toolcall

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/xiaoclaw/xiaoclaw/pkg/jsonobj"
	"github.com/xiaoclaw/xiaoclaw/pkg/jsstr"
)

const vol = "self.audio_speaker.set_volume"

func TestParse(t *testing.T) {
	tests := []struct {
		name, command, params string
		want                  Call   // when err is ""
		args                  string // want.Arguments
		err                   string // contained in the error
	}{
		{"call", CommandCall, `{"name":"` + vol + `","arguments":{"volume":50}}`, Call{Tool: vol}, `{"volume":50}`, ""},
		{"call without arguments", CommandCall, ` {"name":"self.get_device_status"} `, Call{Tool: "self.get_device_status"}, `{}`, ""},
		{"call null arguments", CommandCall, `{"name":"x","arguments":null}`, Call{Tool: "x"}, `{}`, ""},
		{"call name kept verbatim", CommandCall, `{"name":" x "}`, Call{Tool: " x "}, `{}`, ""},
		{"call escaped name", CommandCall, `{"n\u0061me":"self.get\u005fdevice_status"}`, Call{Tool: "self.get_device_status"}, `{}`, ""},
		{"call no params", CommandCall, ``, Call{}, "", "name is required"},
		{"call null params", CommandCall, `null`, Call{}, "", "name is required"},
		{"call params not an object", CommandCall, `["x"]`, Call{}, "", "params must be a JSON object"},
		{"call broken JSON", CommandCall, `{"name":"x"`, Call{}, "", "not valid JSON"},
		{"call trailing data", CommandCall, `{"name":"x"} {}`, Call{}, "", "not valid JSON"},
		{"call no name", CommandCall, `{"arguments":{}}`, Call{}, "", "name is required"},
		{"call name not a string", CommandCall, `{"name":7}`, Call{}, "", "name must be a string"},
		{"call empty name", CommandCall, `{"name":""}`, Call{}, "", "name must not be empty"},
		{"call unknown key", CommandCall, `{"name":"x","args":{}}`, Call{}, "", `unknown parameter "args" for mcp.tools.call`},
		{"call tool beside name", CommandCall, `{"name":"x","tool":"y"}`, Call{}, "", `unknown parameter "tool"`},
		{"call repeated name", CommandCall, `{"name":"x","name":"y"}`, Call{}, "", `key "name" appears more than once`},
		{"call repeated escaped name", CommandCall, `{"name":"x","\u006eame":"y"}`, Call{}, "", `key "name" appears more than once`},
		{"call repeated arguments", CommandCall, `{"name":"x","arguments":{},"arguments":{"a":1}}`, Call{}, "", `key "arguments" appears more than once`},
		{"call repeated argument", CommandCall, `{"name":"x","arguments":{"volume":1,"volume":2}}`, Call{}, "", `key "arguments.volume" appears more than once`},
		{"call repeated nested argument", CommandCall, `{"name":"x","arguments":{"s":[{"m":1,"m":2}]}}`, Call{}, "", `key "arguments.s.m" appears more than once`},
		{"call arguments not an object", CommandCall, `{"name":"x","arguments":[1]}`, Call{}, "", "arguments must be a JSON object"},
		{"call not UTF-8", CommandCall, "{\"name\":\"x\xff\"}", Call{}, "", "params must be UTF-8"},

		{"v1", CommandCallV1, `{"server":"xiaozhi","tool":"` + vol + `","arguments":{"volume":1},"extra":[1]}`, Call{Tool: vol, Server: "xiaozhi"}, `{"volume":1}`, ""},
		{"v1 trimmed as JavaScript trims", CommandCallV1, `{"server":" xiaozhi\u3000","tool":"\ufeff` + vol + `\u00a0\n"}`, Call{Tool: vol, Server: "xiaozhi"}, `{}`, ""},
		{"v1 no params", CommandCallV1, ``, Call{}, "", "params required"},
		{"v1 no tool", CommandCallV1, `{"server":"xiaozhi"}`, Call{}, "", "server and tool required"},
		{"v1 blank tool", CommandCallV1, `{"server":"xiaozhi","tool":" \t"}`, Call{}, "", "server and tool required"},
		{"v1 tool not a string", CommandCallV1, `{"server":"xiaozhi","tool":["x"]}`, Call{}, "", "server and tool required"},
		{"v1 no server", CommandCallV1, `{"tool":"x"}`, Call{}, "", "server and tool required"},
		{"v1 name beside tool", CommandCallV1, `{"server":"s","name":"x","tool":"y"}`, Call{}, "", `names its tool with "tool", not "name"`},
		{"v1 name alone", CommandCallV1, `{"server":"s","name":"x"}`, Call{}, "", `names its tool with "tool", not "name"`},
		{"v1 repeated tool", CommandCallV1, `{"server":"s","tool":"x","tool":"y"}`, Call{}, "", `key "tool" appears more than once`},
		{"v1 repeated escaped tool", CommandCallV1, `{"server":"s","tool":"x","t\u006fol":"y"}`, Call{}, "", `key "tool" appears more than once`},
		{"v1 repeated server", CommandCallV1, `{"server":"s","server":"t","tool":"x"}`, Call{}, "", `key "server" appears more than once`},
		{"v1 repeated ignored key", CommandCallV1, `{"server":"s","tool":"x","z":1,"z":2}`, Call{}, "", `key "z" appears more than once`},
		{"v1 repeated argument", CommandCallV1, `{"server":"s","tool":"x","arguments":{"v":1,"v":2}}`, Call{}, "", `key "arguments.v" appears more than once`},

		{"not a tool call", "mcp.tools.list", `{}`, Call{}, "", ErrNotToolCall.Error()},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse(tc.command, []byte(tc.params))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Parse = %+v, %v; want an error containing %q", got, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.Tool != tc.want.Tool || got.Server != tc.want.Server || string(got.Arguments) != tc.args {
				t.Fatalf("Parse = {%q %q %s}, want {%q %q %s}", got.Tool, got.Server, got.Arguments, tc.want.Tool, tc.want.Server, tc.args)
			}
		})
	}
	if _, err := Parse("system.which", []byte(`{}`)); !errors.Is(err, ErrNotToolCall) {
		t.Fatalf("a command without a tool: %v", err)
	}
}

func TestParseDoesNotAllocate(t *testing.T) {
	for _, c := range []struct {
		command, params string
		allocs          float64 // the strings: tool, and server for v1
	}{
		{CommandCall, `{"name":"` + vol + `","arguments":{"volume":50}}`, 1},
		{CommandCallV1, `{"server":"xiaozhi","tool":"` + vol + `","arguments":{"volume":50}}`, 2},
	} {
		raw := []byte(c.params)
		if n := testing.AllocsPerRun(100, func() { _, _ = Parse(c.command, raw) }); n > c.allocs {
			t.Errorf("%s: Parse allocates %.0f times", c.command, n)
		}
	}
}

// FuzzParse holds Parse to encoding/json: params Parse accepts mean the
// same to a decoder that keeps the last of repeated keys (encoding/json,
// JavaScript) and to one that keeps the first (cJSON on the device),
// because they have none; the tool and arguments are what a plain decode
// of the params finds.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"name":"` + vol + `","arguments":{"volume":50}}`,
		`{"name":"x","name":"y"}`,
		`{"name":"x","tool":"y"}`,
		`{"server":"xiaozhi","tool":" x ","arguments":{"a":{"b":[1,{"c":2}]}}}`,
		`{"server":"xiaozhi","name":"x","tool":"y"}`,
		`{"server":"xiaozhi","tool":"x","t\u006fol":"y"}`,
		`{"server":"xiaozhi","tool":"x","arguments":{"v":1,"v":2}}`,
		`{"server":"xiaozhi","tool":"x","arguments":null}`,
		`null`, ``, `[]`, `{"name":"\ud800"}`,
	} {
		f.Add(false, []byte(s))
		f.Add(true, []byte(s))
	}
	f.Fuzz(func(t *testing.T, v1 bool, params []byte) {
		command := CommandCall
		if v1 {
			command = CommandCallV1
		}
		c, err := Parse(command, params)
		if err != nil {
			if err.Error() == "" || errors.Is(err, ErrNotToolCall) {
				t.Fatalf("Parse(%q): bad error %v", params, err)
			}
			return
		}
		if c.Tool == "" || !utf8.Valid(params) || (v1 && c.Server == "") || (!v1 && c.Server != "") {
			t.Fatalf("Parse(%q) = %+v", params, c)
		}
		if _, found := jsonobj.RepeatedKey(params); found {
			t.Fatalf("Parse(%q) accepted a repeated key", params)
		}
		var plain map[string]json.RawMessage
		if err := json.Unmarshal(params, &plain); err != nil {
			t.Fatalf("Parse accepted what encoding/json refuses: %q: %v", params, err)
		}
		var tool string
		key := "name"
		if v1 {
			key = "tool"
		}
		if err := json.Unmarshal(plain[key], &tool); err != nil {
			t.Fatalf("tool of %q: %v", params, err)
		}
		if v1 {
			tool = jsstr.Trim(tool)
		}
		if tool != c.Tool {
			t.Fatalf("Parse(%q).Tool = %q, encoding/json reads %q", params, c.Tool, tool)
		}
		args := bytes.TrimSpace(plain["arguments"])
		if len(args) == 0 || string(args) == "null" {
			args = []byte("{}")
		}
		if !bytes.Equal(args, c.Arguments) {
			t.Fatalf("Parse(%q).Arguments = %s, encoding/json reads %s", params, c.Arguments, args)
		}
		var obj map[string]any
		if json.Unmarshal(c.Arguments, &obj) != nil || obj == nil {
			t.Fatalf("arguments %s are not an object", c.Arguments)
		}
	})
}
