package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
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
	srv, err := natsembed.Start(natsembed.Config{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
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
		resp, err := http.Get("http://" + ops + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s = %d %s", path, resp.StatusCode, body)
		}
	}
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
