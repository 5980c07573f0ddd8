package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed"
)

// lineWriter hands every complete log line to a channel.
type lineWriter struct {
	mu      sync.Mutex
	lines   chan string
	pending strings.Builder
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pending.Write(p)
	s := w.pending.String()
	for {
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			break
		}
		select {
		case w.lines <- s[:i]:
		default:
		}
		s = s[i+1:]
	}
	w.pending.Reset()
	w.pending.WriteString(s)
	return len(p), nil
}

func TestRunServesOpsAndStops(t *testing.T) {
	store := t.TempDir()
	srv, err := natsembed.Start(natsembed.Config{StoreDir: store})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { srv.Shutdown() }()
	t.Setenv("XIAOCLAW_INSTANCE", "from-env")
	logs := &lineWriter{lines: make(chan string, 100)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--nats-url", srv.ClientURL(), "--ops-addr", "127.0.0.1:0", "--log-format", "json"}, logs)
	}()

	// The start line names the ops address; the ready line follows.
	var ops string
	timeout := time.After(10 * time.Second)
	for ready := false; !ready; {
		select {
		case line := <-logs.lines:
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) != nil {
				t.Fatalf("log line is not JSON: %s", line)
			}
			switch rec["msg"] {
			case "shim starting":
				ops, _ = rec["ops"].(string)
			case "shim ready":
				ready = true
				if rec["instance"] != "from-env" {
					t.Errorf("instance = %v, want the XIAOCLAW_INSTANCE value", rec["instance"])
				}
			}
		case err := <-done:
			t.Fatalf("run returned early: %v", err)
		case <-timeout:
			t.Fatal("shim never became ready")
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := get(t, "http://"+ops+path); code != http.StatusOK {
			t.Errorf("%s = %d %s", path, code, body)
		}
	}
	if _, body := get(t, "http://"+ops+"/metrics"); !strings.Contains(body, `xiaoclaw_nats_connected{service="shim"} 1`) ||
		!strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics lacks the NATS gauge or the Go collector:\n%s", body)
	}

	// NATS goes away: /readyz fails naming the nats check; it comes back
	// on the same port: /readyz passes again once the client reconnected.
	u, err := url.Parse(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	srv.Shutdown()
	waitReady(t, ops, http.StatusServiceUnavailable, `"failing":["nats"]`)
	if _, body := get(t, "http://"+ops+"/metrics"); !strings.Contains(body, `xiaoclaw_nats_connected{service="shim"} 0`) {
		t.Errorf("/metrics while NATS is away lacks the gauge at 0")
	}
	srv, err = natsembed.Start(natsembed.Config{StoreDir: store, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	waitReady(t, ops, http.StatusOK, `"status":"ready"`)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}

func get(t *testing.T, target string) (int, string) {
	t.Helper()
	resp, err := http.Get(target)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// waitReady polls /readyz until it answers code with a body containing want.
func waitReady(t *testing.T, ops string, code int, want string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, body := get(t, "http://"+ops+"/readyz")
		if c == code && strings.Contains(body, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz = %d %s; want %d with %s", c, body, code, want)
		}
		time.Sleep(20 * time.Millisecond) // polling an HTTP endpoint for a condition
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--log-level", "loud"},
		{"--log-format", "xml"},
		{"--default-timeout", "soon"},
		{"--default-timeout", "10m"},
		{"--no-such-flag"},
	} {
		if err := run(context.Background(), args, io.Discard); err == nil {
			t.Errorf("run(%v) accepted", args)
		}
	}
}

// Every flag falls back to XIAOCLAW_<FLAG>, typed like the flag; the
// command line wins over the environment.
func TestRunReadsFlagsFromTheEnvironment(t *testing.T) {
	t.Setenv("XIAOCLAW_MAX_INFLIGHT", "many")
	err := run(context.Background(), nil, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "XIAOCLAW_MAX_INFLIGHT") {
		t.Fatalf("XIAOCLAW_MAX_INFLIGHT=many: %v, want an error naming the variable", err)
	}
	t.Setenv("XIAOCLAW_MAX_INFLIGHT", "")
	t.Setenv("XIAOCLAW_DEFAULT_TIMEOUT", "10m") // above the cap Validate enforces
	if err := run(context.Background(), nil, io.Discard); err == nil {
		t.Fatal("XIAOCLAW_DEFAULT_TIMEOUT=10m accepted")
	}
	// The flag wins; the run then fails at --log-format, past the timeouts.
	err = run(context.Background(), []string{"--default-timeout", "5s", "--log-format", "xml"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "xml") {
		t.Fatalf("--default-timeout 5s over XIAOCLAW_DEFAULT_TIMEOUT=10m: %v, want the log format error", err)
	}
}
