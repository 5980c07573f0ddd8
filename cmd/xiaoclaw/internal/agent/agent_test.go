package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
)

// The test binary doubles as a stdio MCP server (see runTestServer).
const testServerEnv = "XIAOCLAW_AGENT_TEST_SERVER"

func TestMain(m *testing.M) {
	if os.Getenv(testServerEnv) != "" {
		runTestServer()
		return
	}
	os.Exit(m.Run())
}

// runTestServer is a stdio MCP server built on the official SDK: tool
// "echo" answers its text, "die" exits the process. START_DELAY delays
// its start, as a slow npm server does.
func runTestServer() {
	if d, err := time.ParseDuration(os.Getenv("START_DELAY")); err == nil {
		time.Sleep(d)
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "test-server", Version: "1"}, nil)
	type echoIn struct {
		Text string `json:"text"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "echoes"}, func(_ context.Context, _ *mcp.CallToolRequest, in echoIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "echo: " + in.Text}}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "die", Description: "exits"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		os.Exit(1)
		return nil, nil, nil
	})
	_ = s.Run(context.Background(), &mcp.StdioTransport{})
}

func writeConfig(t testing.TB, cfg string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "agent.json")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// newTestAgent prepares an agent (not connected to any hub) and an MCP
// client session on its server.
func newTestAgent(t testing.TB, cfg string) (*Agent, *mcp.ClientSession) {
	t.Helper()
	a, err := New(Options{ConfigPath: writeConfig(t, cfg), URL: "ws://127.0.0.1:1/xiaozhi/v1/", DeviceID: "02:00:00:00:00:01"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.shutdown)
	st, ct := mcp.NewInMemoryTransports()
	ctx := context.Background()
	if _, err := a.server.Connect(ctx, st, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return a, cs
}

func call(t testing.TB, cs *mcp.ClientSession, name string, args any) (*mcp.CallToolResult, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	return cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
}

func text(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func TestArgumentsCheckedBeforeAnythingRuns(t *testing.T) {
	marker := filepath.Join(t.TempDir(), "ran")
	_, cs := newTestAgent(t, fmt.Sprintf(`{"mcp":{"tools":[{"name":"touch","type":"subprocess","executable":"/usr/bin/touch","args":[%q],
		"input_schema":{"type":"object","properties":{"n":{"type":"integer","minimum":1}},"required":["n"],"additionalProperties":false}}]}}`, marker))
	for _, args := range []any{map[string]any{}, map[string]any{"n": 0}, map[string]any{"n": 1, "x": true}, map[string]any{"n": "1"}} {
		_, err := call(t, cs, "touch", args)
		var je *jsonrpc.Error
		if !errors.As(err, &je) || je.Code != jsonrpc.CodeInvalidParams || !strings.Contains(je.Message, "invalid arguments") {
			t.Fatalf("args %v: want an invalid-params error, got %v", args, err)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the tool ran for invalid arguments")
	}
	if r, err := call(t, cs, "touch", map[string]any{"n": 1}); err != nil || r.IsError {
		t.Fatalf("valid call: %v %v", err, r)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Fatal("the tool did not run for valid arguments")
	}
}

func TestSubprocessOutputAndFailures(t *testing.T) {
	_, cs := newTestAgent(t, `{"mcp":{"tools":[
		{"name":"flood","type":"subprocess","executable":"/usr/bin/yes","max_output_bytes":1000},
		{"name":"fail","type":"subprocess","executable":"/bin/sh","args":["-c","echo broken >&2; exit 4"]},
		{"name":"missing","type":"subprocess","executable":"/no/such/program"},
		{"name":"split","type":"subprocess","executable":"/bin/echo split words"}]}}`)
	r, err := call(t, cs, "flood", nil)
	if err != nil || !r.IsError || !strings.Contains(text(r), "more than 1000 bytes") {
		t.Fatalf("unbounded output: %v %q", err, text(r))
	}
	r, err = call(t, cs, "fail", nil)
	if err != nil || !r.IsError || !strings.Contains(text(r), "exit status 4") || !strings.Contains(text(r), "broken") {
		t.Fatalf("failing tool: %v %q", err, text(r))
	}
	r, err = call(t, cs, "missing", nil)
	if err != nil || !r.IsError || !strings.Contains(text(r), "cannot start") {
		t.Fatalf("missing executable: %v %q", err, text(r))
	}
	r, err = call(t, cs, "split", nil)
	if err != nil || r.IsError || text(r) != "split words" {
		t.Fatalf("executable with words: %v %q", err, text(r))
	}
}

func stdioConfig(delay string, declare bool) string {
	tools := ""
	if declare {
		tools = `, "tools": [{"name":"echo","description":"echoes","inputSchema":{"type":"object","properties":{"text":{"type":"string"}}}}]`
	}
	return fmt.Sprintf(`{"mcpServers":{"slow":{"command":%q,"env":{%q:"1","START_DELAY":%q}%s}}}`, os.Args[0], testServerEnv, delay, tools)
}

func TestStdioServerRelayedAndRestarted(t *testing.T) {
	a, cs := newTestAgent(t, stdioConfig("0s", false))
	eventually.Within(t, 20*time.Second, "slow.echo listed", func() bool { return hasTool(a, "slow.echo") })
	r, err := call(t, cs, "slow.echo", map[string]any{"text": "hi"})
	if err != nil || text(r) != "echo: hi" {
		t.Fatalf("relayed call: %v %v", err, r)
	}
	if _, err := call(t, cs, "slow.echo", map[string]any{"text": 5}); err == nil {
		t.Fatal("relayed call with invalid arguments accepted")
	}
	if _, err := call(t, cs, "slow.die", nil); err == nil {
		t.Fatal("the dying call succeeded")
	}
	// The next call waits for the restarted server.
	r, err = call(t, cs, "slow.echo", map[string]any{"text": "again"})
	if err != nil || text(r) != "echo: again" {
		t.Fatalf("call after a restart: %v %v", err, r)
	}
}

func hasTool(a *Agent, name string) bool {
	for _, n := range a.ToolNames() {
		if n == name {
			return true
		}
	}
	return false
}

// TestFastConnect: tools declared ahead of a slow server are listed at
// once, and a call waits for the server.
func TestFastConnect(t *testing.T) {
	start := time.Now()
	a, cs := newTestAgent(t, stdioConfig("1s", true))
	if !hasTool(a, "slow.echo") {
		t.Fatalf("declared tool not listed at once: %v", a.ToolNames())
	}
	listed := time.Since(start)
	r, err := call(t, cs, "slow.echo", map[string]any{"text": "early"})
	if err != nil || text(r) != "echo: early" {
		t.Fatalf("early call: %v %v", err, r)
	}
	t.Logf("declared tools listed after %s; first call answered after %s (server start delay 1s)", listed, time.Since(start))
}

func TestBackgroundWithoutSession(t *testing.T) {
	a, cs := newTestAgent(t, `{"mcp":{"tools":[{"name":"bg","type":"subprocess","mode":"background","executable":"/bin/echo","args":["done"]}]}}`)
	r, err := call(t, cs, "bg", nil)
	if err != nil || !strings.Contains(text(r), `"status":"started"`) {
		t.Fatalf("background answer: %v %q", err, text(r))
	}
	// No hub session: the completion waits for the next one.
	var p []byte
	if !eventually.Until(eventually.Limit, func() bool {
		a.devMu.Lock()
		defer a.devMu.Unlock()
		if len(a.pending) != 1 {
			return false
		}
		p = a.pending[0]
		return true
	}) {
		t.Fatal("no completion kept for the next session")
	}
	var msg struct {
		Method string
		Params struct {
			Tool    string
			Content []struct{ Text string }
		}
	}
	if json.Unmarshal(p, &msg) != nil || msg.Method != completedNotification || msg.Params.Tool != "bg" || msg.Params.Content[0].Text != "done" {
		t.Fatalf("pending completion %s", p)
	}
}

func TestParseConfigErrors(t *testing.T) {
	for _, tc := range []struct{ cfg, want string }{
		{`{"mcp":{"tools":[{"name":"a","type":"ftp"}]}}`, `type "ftp"`},
		{`{"mcp":{"tools":[{"name":"a","type":"subprocess"}]}}`, "needs executable"},
		{`{"mcp":{"tools":[{"name":"a b","type":"tcp","address":"x:1"}]}}`, "may hold only"},
		{`{"mcp":{"tools":[{"name":"a","type":"tcp","address":"x:1"},{"name":"a","type":"tcp","address":"x:1"}]}}`, "defined twice"},
		{`{"mcp":{"tools":[{"name":"a","type":"http","url":"ftp://x"}]}}`, "not an http"},
		{`{"mcp":{"tools":[{"name":"a","type":"http","url":"http://x","method":"PUT"}]}}`, "neither GET nor POST"},
		{`{"mcp":{"tools":[{"name":"a","type":"tcp","address":"nowhere"}]}}`, "host:port"},
		{`{"mcp":{"tools":[{"name":"a","type":"tcp","address":"x:1","mode":"later"}]}}`, "neither sync nor background"},
		{`{"mcp":{"tools":[{"name":"a","type":"tcp","address":"x:1","timeout_ms":-1}]}}`, "negative"},
		{`{"mcp":{"tools":[{"name":"a","type":"tcp","address":"x:1","input_schema":{"type":"string"}}]}}`, `type "object"`},
		{`{"mcp":{"tools":[{"name":"a","type":"tcp","address":"x:1","input_schema":{"type":"object","properties":{"n":{"type":"nonsense"}}}}]}}`, "does not compile"},
		{`{"mcpServers":{"s.x":{"command":"x"}}}`, "must not contain"},
		{`{"mcpServers":{"s":{}}}`, "command is required"},
		{`{"mcp":{"tools":[]}} {}`, "trailing"},
		{`[]`, "not a JSON configuration"},
	} {
		_, err := ParseConfig([]byte(tc.cfg))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: want an error with %q, got %v", tc.cfg, tc.want, err)
		}
	}
	c, err := ParseConfig([]byte(`{"mcp":{"enabled":false,"tools":[{"name":"a","type":"ftp"}]},"mcpServers":{"s":{"command":"x","enable":false}}}`))
	if err != nil || len(c.Tools) != 0 || len(c.Servers) != 0 {
		t.Fatalf("disabled sections: %v %+v", err, c)
	}
	c, err = ParseConfig([]byte(`{"mcp":{"tools":[{"name":"a","type":"tcp","address":"x:1","input_schema":{}}]}}`))
	if err != nil || c.Tools[0].Timeout() != DefaultTimeout || string(c.Tools[0].schema) != `{"type":"object"}` || c.Tools[0].Method != "" {
		t.Fatalf("defaults: %v %+v", err, c.Tools[0])
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"mcp":{"enabled":true,"tools":[{"name":"a","type":"subprocess","executable":"/bin/true","input_schema":{"type":"object","properties":{"x":{"type":"integer"}}}}]}}`))
	f.Add([]byte(`{"mcpServers":{"fs":{"command":"npx","args":["-y","x"],"env":{"A":"b"},"tools":[{"name":"t","inputSchema":{}}]}}}`))
	f.Add([]byte(`{"mcp":{"tools":[{"name":"h","type":"http","url":"http://x/","method":"get","mode":"background","notify":{"type":"disabled"}}]}}`))
	f.Add([]byte(`{"mcp":{"tools":[{"name":"t","type":"tcp","address":"[::1]:9","timeout_ms":1}]}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseConfig(data)
		if err != nil {
			return
		}
		for _, tl := range c.Tools {
			if checkToolName(tl.Name) != nil || tl.timeout <= 0 || tl.validator == nil || tl.MaxOutputBytes <= 0 {
				t.Fatalf("accepted a tool that does not check: %+v", tl)
			}
			if tl.Type == toolTypeSubprocess && (len(tl.argv) == 0 || tl.argv[0] == "") {
				t.Fatalf("subprocess tool without a program: %+v", tl)
			}
			// The schema sent in tools/list is an object schema.
			var m map[string]any
			if json.Unmarshal(tl.schema, &m) != nil || m["type"] != "object" {
				t.Fatalf("schema %s", tl.schema)
			}
		}
		for i := range c.Servers {
			if c.Servers[i].Command == "" || strings.Contains(c.ServerName(i), namespaceSeparator) {
				t.Fatalf("accepted server %q %+v", c.ServerName(i), c.Servers[i])
			}
		}
	})
}

// BenchmarkSubprocessCall measures a sync subprocess call through the
// agent's MCP server (argument check, spawn in its own group, minimal
// environment, output capture); BenchmarkDirectExec runs the same program
// directly. Their ratio is the agent's overhead per call.
func BenchmarkSubprocessCall(b *testing.B) {
	_, cs := newTestAgent(b, `{"mcp":{"tools":[{"name":"t","type":"subprocess","executable":"/bin/cat",
		"input_schema":{"type":"object","properties":{"x":{"type":"integer"}}}}]}}`)
	b.ResetTimer()
	for b.Loop() {
		if r, err := call(b, cs, "t", map[string]any{"x": 1}); err != nil || r.IsError {
			b.Fatal(err)
		}
	}
}

func BenchmarkDirectExec(b *testing.B) {
	for b.Loop() {
		cmd := exec.Command("/bin/cat")
		cmd.Stdin = strings.NewReader(`{"x":1}` + "\n")
		if _, err := cmd.Output(); err != nil {
			b.Fatal(err)
		}
	}
}

func TestBackgroundRunsBounded(t *testing.T) {
	a, cs := newTestAgent(t, `{"mcp":{"tools":[{"name":"bg","type":"subprocess","mode":"background","timeout_ms":10000,
		"executable":"/bin/sleep","args":["10"],"notify":{"type":"disabled"}}]}}`)
	for i := range MaxBackground {
		if r, err := call(t, cs, "bg", nil); err != nil || !strings.Contains(text(r), "started") {
			t.Fatalf("run %d: %v", i, err)
		}
	}
	if _, err := call(t, cs, "bg", nil); err == nil || !strings.Contains(err.Error(), "background runs are in progress") {
		t.Fatalf("run beyond the bound: %v", err)
	}
	a.stopBg() // the runs end with the agent
}
