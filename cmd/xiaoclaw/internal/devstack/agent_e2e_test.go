package devstack

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/cmd/xiaoclaw/internal/agent"
	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// writeScript writes an executable shell script into dir.
func writeScript(t testing.TB, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// startAgent runs `xiaoclaw agent` in-process against hub 0 of st.
func startAgent(t testing.TB, st *Stack, cfgPath, mac string, tune func(*agent.Options)) *agent.Agent {
	t.Helper()
	o := agent.Options{ConfigPath: cfgPath, URL: st.DeviceURL(0), Token: testDeviceToken, DeviceID: mac,
		MinBackoff: 50 * time.Millisecond, MaxBackoff: time.Second, ReloadPoll: 50 * time.Millisecond}
	if tune != nil {
		tune(&o)
	}
	a, err := agent.New(o)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return a
}

type toolPayload struct {
	Content []struct{ Type, Text string } `json:"content"`
	IsError bool                          `json:"isError"`
}

func invokeText(t *testing.T, op *occlient.Client, node, tool string, args any) (toolPayload, error) {
	t.Helper()
	raw, err := callTool(context.Background(), op, node, tool, args, 10*time.Second)
	if err != nil {
		return toolPayload{}, err
	}
	var res struct {
		OK      bool        `json:"ok"`
		Payload toolPayload `json:"payload"`
	}
	if err := json.Unmarshal(raw, &res); err != nil || !res.OK {
		t.Fatalf("result %s (%v)", raw, err)
	}
	return res.Payload, nil
}

func (p toolPayload) text() string {
	var b strings.Builder
	for _, c := range p.Content {
		b.WriteString(c.Text)
	}
	return b.String()
}

// toolNames returns the tool names node.list shows for node (nil: not connected).
func listedTools(t *testing.T, op *occlient.Client, node string) []string {
	n, ok := listNodes(t, op)[node]
	if !ok || !n.Connected {
		return nil
	}
	var tools []struct {
		Name string `json:"name"`
	}
	_ = json.Unmarshal(n.Tools, &tools)
	names := []string{}
	for _, tl := range tools {
		names = append(names, tl.Name)
	}
	return names
}

func waitTools(t *testing.T, op *occlient.Client, node string, ok func([]string) bool) []string {
	t.Helper()
	var names []string
	if !eventually.Until(waitLimit, func() bool {
		names = listedTools(t, op, node)
		return names != nil && ok(names)
	}) {
		t.Fatalf("node %s tools never as wanted; last %v", node, names)
	}
	return names
}

func has(names []string, want ...string) bool {
	set := map[string]bool{}
	for _, n := range names {
		set[n] = true
	}
	for _, w := range want {
		if !set[w] {
			return false
		}
	}
	return true
}

// alive reports whether pid runs (a zombie waiting for its reaper does not).
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func TestAgentEndToEnd(t *testing.T) {
	st := startStack(t, Config{Hubs: 1, Shims: 1, Gateways: 1})
	dir := t.TempDir()

	greet := writeScript(t, dir, "greet.sh", `read args
case "$args" in *'"name":"Ada"'*) ;; *) echo "unexpected arguments: $args" >&2; exit 3;; esac
echo "hello $1, args $args, env $(env | grep -c .)"
`)
	marker := filepath.Join(dir, "ran")
	guarded := writeScript(t, dir, "guarded.sh", "touch "+marker+"\necho ran\n")
	childPid := filepath.Join(dir, "child.pid")
	hang := writeScript(t, dir, "hang.sh", "sleep 60 &\necho $! > "+childPid+"\nsleep 60\n")
	slow := writeScript(t, dir, "slow.sh", "read args\nsleep 0.3\necho \"finished $args\"\n")

	var httpHits atomic.Int64
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		httpHits.Add(1)
		if r.Method == http.MethodGet {
			fmt.Fprintf(w, "GET city=%s days=%s", r.URL.Query().Get("city"), r.URL.Query().Get("days"))
			return
		}
		var body map[string]any
		_ = json.NewDecoder(r.Body).Decode(&body)
		fmt.Fprintf(w, "POST %s %v", r.Header.Get("Content-Type"), body["text"])
	}))
	t.Cleanup(web.Close)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				fmt.Fprintf(c, "tcp got %s", strings.ToUpper(line))
			}()
		}
	}()

	cfg := fmt.Sprintf(`{
  "websocket": {"url": "ignored: other programs' keys stay"},
  "mcp": {"enabled": true, "tools": [
    {"name": "greet", "description": "Greets", "type": "subprocess", "executable": %q, "args": ["world"],
     "input_schema": {"type": "object", "properties": {"name": {"type": "string", "minLength": 1}}, "required": ["name"]}},
    {"name": "guarded", "description": "Must not run on bad input", "type": "subprocess", "executable": %q,
     "input_schema": {"type": "object", "properties": {"count": {"type": "integer", "maximum": 3}}, "required": ["count"]}},
    {"name": "hang", "type": "subprocess", "executable": %q, "timeout_ms": 300, "input_schema": {}},
    {"name": "slow_job", "type": "subprocess", "executable": %q, "mode": "background", "timeout_ms": 5000,
     "input_schema": {"type": "object", "properties": {"job": {"type": "string"}}}},
    {"name": "quiet_job", "type": "subprocess", "executable": %q, "mode": "background", "notify": {"type": "disabled"}, "input_schema": {}},
    {"name": "weather", "type": "http", "url": %q, "method": "GET",
     "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}},
    {"name": "translate", "type": "http", "url": %q, "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}}},
    {"name": "shout", "type": "tcp", "address": %q, "input_schema": {"type": "object", "properties": {"word": {"type": "string"}}}},
    {"name": "off", "type": "tcp", "address": "127.0.0.1:1", "enable": false}
  ]}
}`, greet, guarded, hang, slow, slow, web.URL, web.URL, ln.Addr().String())
	cfgPath := filepath.Join(dir, "agent.json")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}

	events := make(chan occlient.Event, 64)
	op := dialAs(t, st.GatewayURL(0), testOperatorToken, func(e occlient.Event) {
		select {
		case events <- e:
		default:
		}
	})
	started := time.Now()
	a := startAgent(t, st, cfgPath, "02:ae:00:00:00:01", nil)
	dev, _ := wire.CanonicalDevice(a.DeviceID())
	node := wire.DeviceNodeID(dev)
	names := waitTools(t, op, node, func(n []string) bool { return has(n, "greet", "weather", "shout") })
	t.Logf("tools listed through the hub %s after the agent started", time.Since(started))
	if has(names, "off") {
		t.Fatalf("a tool with enable:false is listed: %v", names)
	}

	t.Run("subprocess with arguments, no shell, minimal environment", func(t *testing.T) {
		p, err := invokeText(t, op, node, "greet", map[string]string{"name": "Ada"})
		if err != nil || p.IsError {
			t.Fatalf("greet: %v %+v", err, p)
		}
		// "env | grep -c ." counts the variables the tool saw: PATH, HOME,
		// LANG, TZ at most (the test process has many more) plus what sh sets.
		txt := p.text()
		if !strings.HasPrefix(txt, `hello world, args {"name":"Ada"}, env `) {
			t.Fatalf("greet answered %q", txt)
		}
		if n, _ := strconv.Atoi(txt[strings.LastIndex(txt, " ")+1:]); n == 0 || n > 8 {
			t.Fatalf("the tool saw %d environment variables, want a minimal environment", n)
		}
	})

	t.Run("invalid arguments are refused before anything runs", func(t *testing.T) {
		for _, args := range []any{map[string]any{"count": 9}, map[string]any{}, map[string]any{"count": "two"}} {
			_, err := invokeText(t, op, node, "guarded", args)
			if err == nil {
				t.Fatalf("guarded accepted %v", args)
			}
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatal("guarded ran for invalid arguments")
		}
		if p, err := invokeText(t, op, node, "guarded", map[string]any{"count": 2}); err != nil || p.text() != "ran" {
			t.Fatalf("guarded with valid arguments: %v %+v", err, p)
		}
	})

	t.Run("timeout kills the process group", func(t *testing.T) {
		start := time.Now()
		_, err := invokeText(t, op, node, "hang", map[string]any{})
		if err == nil || !strings.Contains(err.Error(), "timed out after 300ms") {
			t.Fatalf("want a timeout error, got %v", err)
		}
		if el := time.Since(start); el > 5*time.Second {
			t.Fatalf("timeout answered after %s", el)
		}
		raw, err := os.ReadFile(childPid)
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(raw)))
		if !eventually.Until(waitLimit, func() bool { return !alive(pid) }) {
			t.Fatalf("the tool's child %d outlived the timeout", pid)
		}
	})

	t.Run("http GET with query and POST with JSON", func(t *testing.T) {
		p, err := invokeText(t, op, node, "weather", map[string]any{"city": "Shenzhen", "days": 3})
		if err != nil || p.text() != "GET city=Shenzhen days=3" {
			t.Fatalf("weather: %v %q", err, p.text())
		}
		p, err = invokeText(t, op, node, "translate", map[string]any{"text": "你好"})
		if err != nil || p.text() != "POST application/json 你好" {
			t.Fatalf("translate: %v %q", err, p.text())
		}
	})

	t.Run("tcp", func(t *testing.T) {
		p, err := invokeText(t, op, node, "shout", map[string]any{"word": "hi"})
		if err != nil || p.text() != `tcp got {"WORD":"HI"}` {
			t.Fatalf("shout: %v %q", err, p.text())
		}
	})

	t.Run("background completion arrives as a node event", func(t *testing.T) {
		start := time.Now()
		p, err := invokeText(t, op, node, "slow_job", map[string]any{"job": "backup"})
		if err != nil {
			t.Fatal(err)
		}
		if el := time.Since(start); el >= 300*time.Millisecond {
			t.Fatalf("background tool answered after %s, not at once", el)
		}
		var started struct{ Status, CallID string }
		if json.Unmarshal([]byte(p.text()), &started) != nil || started.Status != "started" || started.CallID == "" {
			t.Fatalf("background answer %q", p.text())
		}
		deadline := time.After(waitLimit)
		for {
			select {
			case e := <-events:
				var ev struct {
					NodeID  string `json:"nodeId"`
					Event   string `json:"event"`
					Payload struct {
						Method string `json:"method"`
						Params struct {
							Tool    string `json:"tool"`
							CallID  string `json:"callId"`
							IsError bool   `json:"isError"`
						} `json:"params"`
					} `json:"payload"`
				}
				if json.Unmarshal(e.Payload, &ev) != nil || ev.Event != wire.EventMCPNotification || ev.Payload.Params.CallID != started.CallID {
					continue
				}
				if ev.NodeID != node || ev.Payload.Method != "notifications/tools/completed" || ev.Payload.Params.Tool != "slow_job" || ev.Payload.Params.IsError {
					t.Fatalf("completion event %s", e.Payload)
				}
				if !strings.Contains(string(e.Payload), `finished {\"job\":\"backup\"}`) {
					t.Fatalf("completion without the result: %s", e.Payload)
				}
				return
			case <-deadline:
				t.Fatal("no completion event")
			}
		}
	})

	t.Run("reload with list_changed", func(t *testing.T) {
		updated := strings.Replace(cfg, `"name": "off", "type": "tcp", "address": "127.0.0.1:1", "enable": false`,
			`"name": "now_on", "type": "tcp", "address": "127.0.0.1:1"`, 1)
		updated = strings.Replace(updated, `"name": "translate"`, `"name": "translate2"`, 1)
		if err := os.WriteFile(cfgPath, []byte(updated), 0o600); err != nil {
			t.Fatal(err)
		}
		names := waitTools(t, op, node, func(n []string) bool { return has(n, "now_on", "translate2") && !has(n, "translate") })
		t.Logf("tools after reload: %v", names)
		// Operators learn what changed.
		deadline := time.After(waitLimit)
	scan:
		for {
			select {
			case e := <-events:
				var ev struct {
					NodeID  string `json:"nodeId"`
					Event   string `json:"event"`
					Payload struct {
						Added, Removed, Changed []string
					} `json:"payload"`
				}
				if json.Unmarshal(e.Payload, &ev) != nil || ev.NodeID != node || ev.Event != wire.EventToolsChanged {
					continue
				}
				if has(ev.Payload.Added, "now_on", "translate2") && has(ev.Payload.Removed, "translate") {
					break scan
				}
				t.Logf("tools change %s", e.Payload)
			case <-deadline:
				t.Fatal("no mcp.tools.changed event naming the added and removed tools")
			}
		}
		// A broken file keeps the running configuration.
		if err := os.WriteFile(cfgPath, []byte(`{"mcp":{"tools":[{"name":"x","type":"nope"}]}}`), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := a.Reload(); err == nil || !strings.Contains(err.Error(), "nope") {
			t.Fatalf("reload of a broken file: %v", err)
		}
		if p, err := invokeText(t, op, node, "translate2", map[string]any{"text": "ok"}); err != nil || p.IsError {
			t.Fatalf("tool gone after a broken reload: %v", err)
		}
	})
}

// TestAgentReconnects: when its hub goes away, the agent reconnects (with
// backoff) to the hub that comes back at the same address, and its tools are
// callable again.
func TestAgentReconnects(t *testing.T) {
	st := startStack(t, Config{Hubs: 1, Shims: 1, Gateways: 1})
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "agent.json")
	if err := os.WriteFile(cfgPath, []byte(`{"mcp":{"tools":[{"name":"hi","type":"subprocess","executable":"/bin/echo","args":["hi"]}]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	op := operator(t, st.GatewayURL(0))
	startAgent(t, st, cfgPath, "02:ae:00:00:00:02", nil)
	node := "xz-02ae00000002"
	waitTools(t, op, node, func(n []string) bool { return has(n, "hi") })

	addr := st.Hubs[0].DeviceAddr()
	if err := st.Component("hub-1").Stop(); err != nil {
		t.Logf("hub stopped: %v", err)
	}
	waitNodes(t, op, false, node)
	if _, err := st.AddHub("hub-1b", addr, ""); err != nil {
		t.Fatal(err)
	}
	waitTools(t, op, node, func(n []string) bool { return has(n, "hi") })
	if p, err := invokeText(t, op, node, "hi", nil); err != nil || p.text() != "hi" {
		t.Fatalf("after reconnect: %v %+v", err, p)
	}
}

// TestAgentBootsThroughOTA: with --ota the agent boots like the firmware
// (OTA request, activation, then the transport and credentials the reply
// names) and serves its tools.
func TestAgentBootsThroughOTA(t *testing.T) {
	t.Run("websocket", func(t *testing.T) { testAgentOTA(t, "", "02:ae:00:00:00:03") })
	// With a broker the OTA reply names MQTT, which the agent then uses.
	t.Run("mqtt", func(t *testing.T) { testAgentOTA(t, "127.0.0.1:0", "02:ae:00:00:00:04") })
}

func testAgentOTA(t *testing.T, mqttAddr, mac string) {
	st := startStack(t, Config{Hubs: 1, Shims: 1, Gateways: 1, AutoActivate: true, MQTTAddr: mqttAddr})
	cfgPath := filepath.Join(t.TempDir(), "agent.json")
	if err := os.WriteFile(cfgPath, []byte(`{"mcp":{"tools":[{"name":"hi","type":"subprocess","executable":"/bin/echo","args":["via ota"]}]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	events := make(chan occlient.Event, 64)
	op := dialAs(t, st.GatewayURL(0), testOperatorToken, func(e occlient.Event) {
		select {
		case events <- e:
		default:
		}
	})
	startAgent(t, st, cfgPath, mac, func(o *agent.Options) { o.URL, o.Token, o.OTAURL = "", "", st.OTAURL(0) })
	dev, _ := wire.CanonicalDevice(mac)
	node := wire.DeviceNodeID(dev)
	waitTools(t, op, node, func(n []string) bool { return has(n, "hi") })
	if p, err := invokeText(t, op, node, "hi", nil); err != nil || p.text() != "via ota" {
		t.Fatalf("call: %v %+v", err, p)
	}
	want := `"transport":"websocket"`
	if mqttAddr != "" {
		want = `"transport":"mqtt"`
	}
	deadline := time.After(waitLimit)
	for {
		select {
		case e := <-events:
			if strings.Contains(string(e.Payload), `"event":"node.connected"`) && strings.Contains(string(e.Payload), node) {
				if !strings.Contains(string(e.Payload), want) {
					t.Fatalf("node.connected %s, want %s", e.Payload, want)
				}
				return
			}
		case <-deadline:
			t.Fatal("no node.connected event")
		}
	}
}
