//go:build interop

package mcpserver

// The npm MCP clients (the official TypeScript SDK, the OpenAI Agents
// SDK) against two replicas behind a balancer without session affinity.
// `make interop` installs them (npm ci in ./interop) and runs this test; it
// fails, never skips, when they are missing.

import (
	"bufio"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
)

// proxy is a reverse proxy over both replicas: POSTs and DELETEs in turn,
// GET streams to B.
func (p *replicaPair) proxy(t *testing.T) string {
	ua, _ := url.Parse(p.a.http.URL)
	ub, _ := url.Parse(p.b.http.URL)
	var n atomic.Int64
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			to := ua
			if r.In.Method == http.MethodGet || n.Add(1)%2 == 0 {
				to = ub
			}
			r.SetURL(to)
		},
		FlushInterval: -1, // SSE
	}
	srv := httptest.NewServer(rp)
	t.Cleanup(srv.Close)
	return srv.URL
}

func interopDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("interop")
	if err != nil {
		t.Fatal(err)
	}
	for _, pkg := range []string{"node_modules/@modelcontextprotocol/sdk", "node_modules/@openai/agents"} {
		if _, err := os.Stat(filepath.Join(dir, pkg)); err != nil {
			t.Fatalf("%s is not installed in %s: run `make interop` (npm ci there)", pkg, dir)
		}
	}
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatal("node is not on PATH")
	}
	return dir
}

func TestInteropMCPReplicas(t *testing.T) {
	dir := interopDir(t)
	p := newReplicaPair(t, Config{})
	p.nodes.set(device("acme", "xz-1", "Kitchen speaker", "self.audio_speaker.set_volume"))
	endpoint := p.proxy(t) + "/mcp"

	t.Run("typescript-sdk", func(t *testing.T) {
		cmd := exec.Command("node", filepath.Join(dir, "sdk-driver.mjs"), "http")
		cmd.Env = append(os.Environ(), "MCP_URL="+endpoint, "MCP_TOKEN=op-a")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		answers := make(chan map[string]any, 16)
		var mu sync.Mutex
		changed := 0
		go func() {
			sc := bufio.NewScanner(out)
			sc.Buffer(make([]byte, 1<<20), 1<<20)
			for sc.Scan() {
				var m map[string]any
				if json.Unmarshal(sc.Bytes(), &m) != nil {
					continue
				}
				if m["event"] == "list_changed" {
					mu.Lock()
					changed++
					mu.Unlock()
					continue
				}
				answers <- m
			}
			close(answers)
		}()
		next := func() map[string]any {
			select {
			case m, ok := <-answers:
				if !ok {
					t.Fatalf("the client exited: %s", stderr.String())
				}
				if m["error"] != nil {
					t.Fatalf("client error %v: %s", m["error"], stderr.String())
				}
				return m
			case <-time.After(eventually.Limit):
				t.Fatalf("no answer from the client: %s", stderr.String())
			}
			return nil
		}
		send := func(cmd map[string]any) map[string]any {
			b, _ := json.Marshal(cmd)
			if _, err := in.Write(append(b, '\n')); err != nil {
				t.Fatal(err)
			}
			return next()
		}
		if r := next(); r["ready"] != true {
			t.Fatalf("not ready: %v", r)
		}
		// list, call, call, list: with the balancer's turns, each replica
		// serves one of each.
		for _, op := range []string{"list", "call", "call", "list"} {
			if op == "list" {
				if r := send(map[string]any{"op": "list"}); len(r["tools"].([]any)) != 1 {
					t.Fatalf("list: %v", r)
				}
				continue
			}
			r := send(map[string]any{"op": "call", "name": "Kitchen_speaker__self_audio_speaker_set_volume", "arguments": map[string]any{"v": 3}})
			if res, _ := r["result"].(map[string]any); res == nil || res["isError"] == true {
				t.Fatalf("call: %v", r)
			}
		}
		for _, want := range []string{"tools/list", "tools/call"} {
			if !p.servedBy("A", want) || !p.servedBy("B", want) {
				t.Fatalf("%s not served by both replicas: %v", want, p.served)
			}
		}
		p.nodes.set(device("acme", "xz-2", "Desk lamp", "self.light.set"))
		eventually.True(t, "list_changed on the stream B holds", func() bool { mu.Lock(); defer mu.Unlock(); return changed > 0 })
	})

	t.Run("openai-agents", func(t *testing.T) {
		cmd := exec.Command("node", filepath.Join(dir, "agents-list.mjs"))
		cmd.Env = append(os.Environ(), "MCP_URL="+endpoint, "MCP_TOKEN=op-a")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("agents-list: %v\n%s", err, out)
		}
		var r struct {
			Listed []string `json:"listed"`
		}
		if err := json.Unmarshal(out, &r); err != nil || !strings.Contains(strings.Join(r.Listed, ","), "Kitchen_speaker__self_audio_speaker_set_volume") {
			t.Fatalf("agents-list output: %v\n%s", err, out)
		}
	})
}
