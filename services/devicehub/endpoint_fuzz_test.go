package devicehub

import (
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// recordingConn is a transport that records what the hub sends and fails
// every write after the first limit ones (a device that went away).
type recordingConn struct {
	mu   sync.Mutex
	sent [][]byte
}

func (c *recordingConn) Send(p []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sent = append(c.sent, append([]byte(nil), p...))
	return errors.New("gone")
}
func (c *recordingConn) close(endCause, string) {}

// FuzzEndpointFrame feeds one frame from a tool host into an online
// endpoint session: whatever the bytes, the session survives, a request
// (the tool host acting as a client) gets exactly one JSON-RPC error, and
// nothing else is sent except a re-list after tools/list_changed.
func FuzzEndpointFrame(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"result":{}}`,
		`{"jsonrpc":"2.0","method":"notifications/tools/list_changed"}`,
		`{"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info"}}`,
		`{"jsonrpc":"2.0","id":"x","method":"tools/list"}`,
		`{"jsonrpc":"2.0","id":7,"error":{"code":-32601,"message":"no"}}`,
		`[]`, `{`, `null`, "",
	} {
		f.Add([]byte(s))
	}
	cfg := &Config{CallTimeout: time.Second, MaxCatalogBytes: 1 << 20, MaxToolPages: 4, MaxInFlight: 4}
	cfg.setDefaults()
	h := newHub(cfg, nil, slog.New(slog.DiscardHandler))
	if err := h.instrument(); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, frame []byte) {
		conn := &recordingConn{}
		s := &session{hub: h, id: "s1", key: deviceKey{"t", "calc-host"}, transport: wire.TransportWebSocket, conn: conn, hasMCP: true, online: true}
		s.mcp.Init(conn, cfg.MaxInFlight)
		s.handleMCP(frame)
		// A re-list runs in the background; wait for it to give up (its
		// write fails at once) before reading what was sent.
		if !eventually.Until(5*time.Second, func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return !s.relist.running
		}) {
			t.Fatal("re-list never ended")
		}
		conn.mu.Lock()
		defer conn.mu.Unlock()
		for _, p := range conn.sent {
			var m struct {
				Method string          `json:"method"`
				Error  json.RawMessage `json:"error"`
			}
			if json.Unmarshal(p, &m) != nil || (m.Method != "tools/list" && m.Error == nil) {
				t.Fatalf("frame %q made the hub send %s", frame, p)
			}
		}
		if len(conn.sent) > 1 {
			t.Fatalf("frame %q made the hub send %d messages", frame, len(conn.sent))
		}
	})
}
