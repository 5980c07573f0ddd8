//go:build interop

package devstack

// Real MCP clients from npm against the gateway's MCP endpoint: the
// official TypeScript SDK (Streamable HTTP and, through `xiaoclaw mcp`,
// stdio) and the OpenAI Agents JS SDK's MCPServerStreamableHttp. `make
// interop` installs them (npm ci in services/gateway/mcpserver/interop)
// and runs this test; it fails, never skips, when they are missing.

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/tenancy"
)

// mcpInteropDir holds the npm packages and the client scripts.
func mcpInteropDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../../../../services/gateway/mcpserver/interop")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"node_modules/@modelcontextprotocol/sdk", "node_modules/@openai/agents"} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Fatalf("%s is not installed in %s: run `make interop` (npm ci there)", p, dir)
		}
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is not on PATH: the MCP interop tests run the npm clients with it")
	}
	return dir
}

// tsClient is a running sdk-driver.mjs: commands in, answers and events out.
type tsClient struct {
	t       *testing.T
	cmd     *exec.Cmd
	in      io.WriteCloser
	answers chan map[string]any
	mu      sync.Mutex
	changed int
	stderr  strings.Builder
}

func startTSClient(t *testing.T, dir, mode string, env ...string) *tsClient {
	t.Helper()
	c := &tsClient{t: t, answers: make(chan map[string]any, 16)}
	c.cmd = exec.Command("node", filepath.Join(dir, "sdk-driver.mjs"), mode)
	c.cmd.Dir = dir
	c.cmd.Env = append(os.Environ(), env...)
	c.cmd.Stderr = &lockedWriter{b: &c.stderr, mu: &c.mu}
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if c.in, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) != nil {
				continue
			}
			if m["event"] == "list_changed" {
				c.mu.Lock()
				c.changed++
				c.mu.Unlock()
				continue
			}
			c.answers <- m
		}
		close(c.answers)
	}()
	t.Cleanup(func() {
		_ = c.in.Close()
		done := make(chan struct{})
		go func() { _ = c.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = c.cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			c.mu.Lock()
			t.Logf("%s client stderr:\n%s", mode, c.stderr.String())
			c.mu.Unlock()
		}
	})
	if ready := c.next(); ready["ready"] != true {
		t.Fatalf("%s client did not connect: %v", mode, ready)
	}
	return c
}

type lockedWriter struct {
	b  *strings.Builder
	mu *sync.Mutex
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (c *tsClient) next() map[string]any {
	c.t.Helper()
	select {
	case m, ok := <-c.answers:
		if !ok {
			c.t.Fatal("the client exited")
		}
		return m
	case <-time.After(30 * time.Second):
		c.t.Fatal("no answer from the client within 30s")
	}
	return nil
}

func (c *tsClient) do(cmd map[string]any) map[string]any {
	c.t.Helper()
	b, _ := json.Marshal(cmd)
	if _, err := c.in.Write(append(b, '\n')); err != nil {
		c.t.Fatal(err)
	}
	return c.next()
}

func (c *tsClient) changes() int { c.mu.Lock(); defer c.mu.Unlock(); return c.changed }

// listed is a tools/list answer: exposed name -> (node id, device tool).
func (c *tsClient) list() map[string][2]string {
	c.t.Helper()
	res := c.do(map[string]any{"op": "list"})
	tools, ok := res["tools"].([]any)
	if !ok {
		c.t.Fatalf("list: %v", res)
	}
	out := map[string][2]string{}
	for _, raw := range tools {
		tool := raw.(map[string]any)
		meta, _ := tool["_meta"].(map[string]any)
		node, _ := meta["xiaoclaw/nodeId"].(string)
		name, _ := meta["xiaoclaw/tool"].(string)
		out[tool["name"].(string)] = [2]string{node, name}
		if _, ok := tool["inputSchema"].(map[string]any); !ok {
			c.t.Errorf("tool %v has no inputSchema", tool["name"])
		}
	}
	return out
}

func nameFor(tools map[string][2]string, node, tool string) string {
	for name, nt := range tools {
		if nt == [2]string{node, tool} {
			return name
		}
	}
	return ""
}

// call runs tools/call and returns isError and the text content.
func (c *tsClient) call(name string, args map[string]any) (bool, string) {
	c.t.Helper()
	res := c.do(map[string]any{"op": "call", "name": name, "arguments": args})
	r, ok := res["result"].(map[string]any)
	if !ok {
		c.t.Fatalf("call %s: %v", name, res)
	}
	var text strings.Builder
	content, _ := r["content"].([]any)
	for _, item := range content {
		if m, ok := item.(map[string]any); ok && m["type"] == "text" {
			text.WriteString(m["text"].(string))
		}
	}
	isErr, _ := r["isError"].(bool)
	return isErr, text.String()
}

var openAIFunctionName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

func TestInteropMCP(t *testing.T) {
	dir := mcpInteropDir(t)
	st := startStack(t, Config{})
	ctx := context.Background()
	acme := newTenant(t, st, "acme")
	dev, err := tenantDevice(t, st, acme.id, 0, "02:0f:00:00:00:01")
	if err != nil {
		t.Fatal(err)
	}
	node := nodeID(dev)
	for _, r := range []tenancy.Rule{
		{Tenant: acme.id, Effect: "deny", Subject: "*", Object: "*", Action: "mcp.tools.call:self.reboot"},
		{Tenant: acme.id, Effect: "deny", Subject: "*", Object: node, Action: "mcp.tools.call:self.audio_speaker.set_volume", When: "volume > 80"},
	} {
		if _, err := st.Tenancy.Manager.AddRule(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	url := mcpURL(st, 0, "/mcp")
	probe := mcpConnect(t, url, map[string]string{"Authorization": "Bearer " + acme.token}, nil)
	waitFor(t, func() bool { return len(mcpTools(t, probe)) > 0 })

	t.Run("typescript-sdk/streamable-http", func(t *testing.T) {
		c := startTSClient(t, dir, "http", "MCP_URL="+url, "MCP_TOKEN="+acme.token)
		tools := c.list()
		for name := range tools {
			if !openAIFunctionName.MatchString(name) {
				t.Errorf("tool name %q is not a valid function name", name)
			}
		}
		setVolume := nameFor(tools, node, "self.audio_speaker.set_volume")
		if setVolume == "" {
			t.Fatalf("set_volume of %s not listed: %v", node, tools)
		}
		if nameFor(tools, node, "self.reboot") != "" {
			t.Error("the denied self.reboot is listed")
		}
		if isErr, text := c.call(setVolume, map[string]any{"volume": 42}); isErr || dev.Volume() != 42 {
			t.Errorf("set_volume 42: isError %v %q, device volume %d", isErr, text, dev.Volume())
		}
		if isErr, text := c.call(nameFor(tools, node, "self.get_device_status"), nil); isErr || !strings.Contains(text, `"volume":42`) {
			t.Errorf("get_device_status: isError %v %q, want the device's status", isErr, text)
		}
		if isErr, text := c.call(setVolume, map[string]any{"volume": 95}); !isErr || !strings.Contains(text, "denied by policy rule") {
			t.Errorf("set_volume 95 (--when volume > 80): isError %v %q", isErr, text)
		}
		if dev.Volume() != 42 {
			t.Errorf("a denied call reached the device: volume %d", dev.Volume())
		}

		// A device joins, then leaves.
		before := c.changes()
		dev2, err := tenantDevice(t, st, acme.id, 0, "02:0f:00:00:00:02")
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return c.changes() > before })
		if nameFor(c.list(), nodeID(dev2), "self.get_device_status") == "" {
			t.Error("the new device's tools are not listed after list_changed")
		}
		before = c.changes()
		dev2.Close()
		waitFor(t, func() bool { return c.changes() > before })
		if nameFor(c.list(), nodeID(dev2), "self.get_device_status") != "" {
			t.Error("the device that left is still listed after list_changed")
		}
	})

	t.Run("openai-agents/MCPServerStreamableHttp", func(t *testing.T) {
		cmd := exec.Command("node", filepath.Join(dir, "agents-list.mjs"))
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "MCP_URL="+url, "MCP_TOKEN="+acme.token)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("agents-list: %v\n%s", err, out)
		}
		var res struct {
			Listed        []string `json:"listed"`
			FunctionTools []struct {
				Type, Name string
			} `json:"functionTools"`
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &res); err != nil {
			t.Fatalf("agents-list output: %v\n%s", err, out)
		}
		if len(res.Listed) == 0 || len(res.FunctionTools) != len(res.Listed) {
			t.Fatalf("agents listed %d tools, made %d function tools", len(res.Listed), len(res.FunctionTools))
		}
		for i, ft := range res.FunctionTools {
			if ft.Type != "function" || ft.Name != res.Listed[i] || !openAIFunctionName.MatchString(ft.Name) {
				t.Errorf("function tool %+v for listed %q", ft, res.Listed[i])
			}
		}
	})

	t.Run("typescript-sdk/stdio-xiaoclaw-mcp", func(t *testing.T) {
		bin := filepath.Join(t.TempDir(), "xiaoclaw")
		build := exec.Command("go", "build", "-o", bin, "../..")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("build xiaoclaw: %v\n%s", err, out)
		}
		args, _ := json.Marshal([]string{"mcp", "--url", st.GatewayURL(0), "--token", acme.token})
		c := startTSClient(t, dir, "stdio", "MCP_COMMAND="+bin, "MCP_ARGS="+string(args))
		tools := c.list()
		setVolume := nameFor(tools, node, "self.audio_speaker.set_volume")
		if setVolume == "" || nameFor(tools, node, "self.reboot") != "" {
			t.Fatalf("stdio lists %v", tools)
		}
		if isErr, text := c.call(setVolume, map[string]any{"volume": 17}); isErr || dev.Volume() != 17 {
			t.Errorf("set_volume over stdio: isError %v %q, volume %d", isErr, text, dev.Volume())
		}
		if isErr, text := c.call(setVolume, map[string]any{"volume": 99}); !isErr || !strings.Contains(text, "denied by policy rule") {
			t.Errorf("a --when denial over stdio: isError %v %q", isErr, text)
		}
		before := c.changes()
		dev3, err := tenantDevice(t, st, acme.id, 0, "02:0f:00:00:00:03")
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, func() bool { return c.changes() > before })
		if nameFor(c.list(), nodeID(dev3), "self.get_device_status") == "" {
			t.Error("stdio: the new device is not listed after list_changed")
		}
	})
}
