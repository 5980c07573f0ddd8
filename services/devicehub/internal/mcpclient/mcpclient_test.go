package mcpclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// fakeDevice answers requests synchronously through respond, or keeps them
// when respond returns nil.
type fakeDevice struct {
	c       *Client
	mu      sync.Mutex
	sent    []map[string]any
	respond func(id uint64, method string, params map[string]any) string
}

func (f *fakeDevice) Send(payload []byte) error {
	var m map[string]any
	if err := json.Unmarshal(payload, &m); err != nil {
		return err
	}
	f.mu.Lock()
	f.sent = append(f.sent, m)
	f.mu.Unlock()
	id, ok := m["id"].(float64)
	if !ok || f.respond == nil {
		return nil
	}
	params, _ := m["params"].(map[string]any)
	if r := f.respond(uint64(id), m["method"].(string), params); r != "" {
		go f.c.Deliver(uint64(id), json.RawMessage(r))
	}
	return nil
}

func newPair(max int, respond func(uint64, string, map[string]any) string) (*Client, *fakeDevice) {
	c := &Client{}
	f := &fakeDevice{c: c, respond: respond}
	c.Init(f, max)
	return c, f
}

func faultCode(err error) string {
	var f *wire.Fault
	if errors.As(err, &f) {
		return f.Code
	}
	return ""
}

func TestCallIDsIncreaseAndMatch(t *testing.T) {
	c, f := newPair(10, func(id uint64, method string, _ map[string]any) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"result":{"m":%q}}`, id, method)
	})
	for i := 1; i <= 3; i++ {
		raw, err := c.Call(context.Background(), "tools/list", nil)
		if err != nil || !strings.Contains(string(raw), fmt.Sprintf(`"id":%d`, i)) {
			t.Fatalf("call %d: %s %v", i, raw, err)
		}
	}
	if f.sent[2]["id"].(float64) != 3 || f.sent[2]["jsonrpc"] != "2.0" {
		t.Fatalf("third request %v", f.sent[2])
	}
	if c.Deliver(99, json.RawMessage(`{}`)) {
		t.Fatal("unknown id delivered")
	}
}

func TestBusyTimeoutAndClose(t *testing.T) {
	c, _ := newPair(2, nil) // the device never answers
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := c.Call(context.Background(), "tools/call", nil)
			errs <- err
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for c.InFlight() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("calls not pending")
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := c.Call(context.Background(), "x", nil); faultCode(err) != wire.FaultBusy {
		t.Fatalf("third call: %v", err)
	}
	c.Close(&wire.Fault{Code: wire.FaultDisconnected, Message: "gone"})
	for range 2 {
		if err := <-errs; faultCode(err) != wire.FaultDisconnected {
			t.Fatalf("pending call after close: %v", err)
		}
	}
	if _, err := c.Call(context.Background(), "x", nil); faultCode(err) != wire.FaultDisconnected {
		t.Fatalf("call after close: %v", err)
	}

	c2, _ := newPair(2, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := c2.Call(ctx, "x", nil); faultCode(err) != wire.FaultTimeout || c2.InFlight() != 0 {
		t.Fatalf("deadline: %v, %d in flight", err, c2.InFlight())
	}
}

func callCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 5*time.Second)
}

func TestDiscoverPages(t *testing.T) {
	c, f := newPair(10, func(id uint64, method string, p map[string]any) string {
		switch method {
		case "initialize":
			return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"result":{"protocolVersion":"2024-11-05","serverInfo":{"name":"b","version":"1"}}}`, id)
		case "tools/list":
			switch p["cursor"] {
			case nil:
				return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"result":{"tools":[{"name":"a"},{"name":"b"}],"nextCursor":"c"}}`, id)
			case "c":
				return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"result":{"tools":[{"name":"c"}],"nextCursor":"d"}}`, id)
			default:
				return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"result":{"tools":[{"name":"d"}]}}`, id)
			}
		}
		return ""
	})
	d, err := c.Discover(callCtx, DiscoverOptions{MaxCatalogBytes: 1 << 20, MaxPages: 10, WithUserTools: true})
	if err != nil {
		t.Fatal(err)
	}
	if string(d.Tools) != `[{"name":"a"},{"name":"b"},{"name":"c"},{"name":"d"}]` || d.Pages != 3 || string(d.ServerInfo) != `{"name":"b","version":"1"}` {
		t.Fatalf("%+v", d)
	}
	if f.sent[1]["method"] != "notifications/initialized" || f.sent[1]["id"] != nil {
		t.Fatalf("second message %v", f.sent[1])
	}
	if p := f.sent[2]["params"].(map[string]any); p["withUserTools"] != true {
		t.Fatalf("tools/list params %v", p)
	}
}

func TestDiscoverStopsOnLoopsErrorsAndSize(t *testing.T) {
	loop := func(id uint64, method string, _ map[string]any) string {
		if method == "initialize" {
			return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"result":{}}`, id)
		}
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"result":{"tools":[{"name":"a"}],"nextCursor":"a"}}`, id)
	}
	c, _ := newPair(10, loop)
	d, err := c.Discover(callCtx, DiscoverOptions{MaxCatalogBytes: 1 << 20, MaxPages: 50})
	if err == nil || !strings.Contains(err.Error(), "does not advance") || !json.Valid(d.Tools) {
		t.Fatalf("cursor loop: %v %s", err, d.Tools)
	}
	c, _ = newPair(10, func(id uint64, method string, _ map[string]any) string {
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"error":{"message":"Method not implemented: %s"}}`, id, method)
	})
	if _, err := c.Discover(callCtx, DiscoverOptions{MaxCatalogBytes: 1 << 20, MaxPages: 50}); err == nil || !strings.Contains(err.Error(), "Method not implemented") {
		t.Fatalf("device error: %v", err)
	}
	c, _ = newPair(10, func(id uint64, method string, p map[string]any) string {
		if method == "initialize" {
			return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"result":{}}`, id)
		}
		return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"result":{"tools":[{"name":"%s"}]}}`, id, strings.Repeat("x", 100))
	})
	d, err = c.Discover(callCtx, DiscoverOptions{MaxCatalogBytes: 50, MaxPages: 50})
	if err == nil || string(d.Tools) != "[]" {
		t.Fatalf("catalog cap: %v %s", err, d.Tools)
	}
}
