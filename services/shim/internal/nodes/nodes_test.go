package nodes

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed/natsembedtest"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/shim/internal/catalog"
)

func TestDisplayName(t *testing.T) {
	tests := []struct{ board, device, want string }{
		{"bread-compact-wifi", "a1b2c3d4e5f6", "bread-compact-wifi-d4e5f6"},
		{"ESP32-S3 Box 3", "a1b2c3d4e5f6", "esp32-s3-box-3-d4e5f6"},
		{"", "a1b2c3d4e5f6", "xiaozhi-d4e5f6"},
		{"  ", "dev_1", "xiaozhi-dev-1"},
		{"立创·实战派", "a1b2c3d4e5f6", "xiaozhi-d4e5f6"},
		{"m5stack-core-s3", "abc", "m5stack-core-s3-abc"},
	}
	for _, tt := range tests {
		if got := DisplayName(tt.board, tt.device); got != tt.want {
			t.Errorf("DisplayName(%q, %q) = %q, want %q", tt.board, tt.device, got, tt.want)
		}
	}
}

func ev(kind, session string, atMs int64) *wire.DeviceEvent {
	return &wire.DeviceEvent{Kind: kind, Tenant: "t", Device: "a1b2c3d4e5f6", SessionID: session, Hub: "h", AtMs: atMs, MCP: true,
		ServerInfo: json.RawMessage(`{"name":"b","version":"1"}`), Tools: json.RawMessage(`[{"name":"x"}]`)}
}

func TestSessionRules(t *testing.T) {
	live := func(session string, at int64) *wire.NodeRecord {
		r, _ := applyOnline(nil, ev(wire.DeviceOnline, session, at))
		return &r
	}
	ended := func(session string, at int64) *wire.NodeRecord {
		r := live(session, at)
		r.Connected = false
		return r
	}
	tests := []struct {
		name  string
		old   *wire.NodeRecord
		event *wire.DeviceEvent
		apply func(*wire.NodeRecord, *wire.DeviceEvent) (wire.NodeRecord, bool)
		want  bool
	}{
		{"online, no record", nil, ev(wire.DeviceOnline, "a", 100), applyOnline, true},
		{"online, newer session", live("a", 100), ev(wire.DeviceOnline, "b", 200), applyOnline, true},
		{"online, same start (resync)", live("a", 100), ev(wire.DeviceOnline, "a", 100), applyOnline, true},
		{"online, older session", live("b", 200), ev(wire.DeviceOnline, "a", 100), applyOnline, false},
		{"online after the record ended", ended("a", 100), ev(wire.DeviceOnline, "b", 300), applyOnline, true},
		{"connecting, no record", nil, ev(wire.DeviceConnecting, "a", 100), applyConnecting, false},
		{"connecting, newer session", live("a", 100), ev(wire.DeviceConnecting, "b", 200), applyConnecting, true},
		{"connecting, session already listed", live("a", 100), ev(wire.DeviceConnecting, "a", 100), applyConnecting, false},
		{"connecting, older session", live("b", 200), ev(wire.DeviceConnecting, "a", 100), applyConnecting, false},
		{"connecting, ended session", ended("a", 100), ev(wire.DeviceConnecting, "a", 100), applyConnecting, false},
		{"tools, same session", live("a", 100), ev(wire.DeviceTools, "a", 150), applyTools, true},
		{"tools, other session", live("b", 200), ev(wire.DeviceTools, "a", 250), applyTools, false},
		{"tools, no record", nil, ev(wire.DeviceTools, "a", 150), applyTools, false},
		{"tools, ended session", ended("a", 100), ev(wire.DeviceTools, "a", 150), applyTools, false},
		{"offline, same session", live("a", 100), ev(wire.DeviceOffline, "a", 150), applyOffline, true},
		{"offline, other session", live("b", 200), ev(wire.DeviceOffline, "a", 250), applyOffline, false},
		{"offline, already ended", ended("a", 100), ev(wire.DeviceOffline, "a", 150), applyOffline, false},
	}
	for _, tt := range tests {
		rec, ok := tt.apply(tt.old, tt.event)
		if ok != tt.want {
			t.Errorf("%s: applies = %v, want %v", tt.name, ok, tt.want)
			continue
		}
		if !ok {
			continue
		}
		if rec.SessionID != tt.event.SessionID {
			t.Errorf("%s: session = %q", tt.name, rec.SessionID)
		}
		if want := tt.event.Kind != wire.DeviceOffline; rec.Connected != want {
			t.Errorf("%s: connected = %v", tt.name, rec.Connected)
		}
	}
}

func TestResyncKeepsCatalogAndName(t *testing.T) {
	first, _ := applyOnline(nil, ev(wire.DeviceOnline, "a", 100))
	again := ev(wire.DeviceOnline, "a", 100)
	again.Tools, again.ServerInfo = nil, nil
	rec, ok := applyOnline(&first, again)
	if !ok || string(rec.Tools) != `[{"name":"x"}]` || rec.DisplayName != "b-d4e5f6" || rec.ModelIdentifier != "b" {
		t.Errorf("re-announced session lost facts: %+v", rec)
	}
	// A new session that could not list its tools keeps the last catalog,
	// stale; one without MCP has none.
	other := ev(wire.DeviceOnline, "b", 200)
	other.Tools = nil
	rec, _ = applyOnline(&first, other)
	if string(rec.Tools) != `[{"name":"x"}]` || !rec.ToolsStale || rec.ToolsVersion != first.ToolsVersion {
		t.Errorf("a new session without a catalog: tools %s stale %v version %d", rec.Tools, rec.ToolsStale, rec.ToolsVersion)
	}
	other.MCP = false
	if rec, _ = applyOnline(&first, other); len(rec.Tools) != 0 || rec.ToolsStale {
		t.Errorf("a session without MCP kept the catalog: %s", rec.Tools)
	}
	plain := ev(wire.DeviceOnline, "c", 300)
	plain.MCP = false
	rec, _ = applyOnline(nil, plain)
	if len(rec.Caps) != 0 || len(rec.Commands) != 0 || rec.Caps == nil || rec.Commands == nil {
		t.Errorf("a device without MCP declares %v %v", rec.Caps, rec.Commands)
	}
}

func openRegistry(t *testing.T, opts Options) (*Registry, *nats.Conn) {
	t.Helper()
	srv := natsembedtest.Start(t)
	nc := natsembedtest.Connect(t, srv, "test")
	r, err := Open(context.Background(), nc, slog.New(slog.NewTextHandler(io.Discard, nil)), catalog.NewSchemas(0), opts)
	if err != nil {
		t.Fatal(err)
	}
	return r, nc
}

// Without a watcher the cache is empty; Fetch reads the bucket.
func TestFetchOnCacheMiss(t *testing.T) {
	r, _ := openRegistry(t, Options{})
	ctx := context.Background()
	if out, err := r.ApplyEvent(ctx, Pending{Event: ev(wire.DeviceOnline, "a", 100)}); err != nil || out != Applied {
		t.Fatalf("apply online: %v %v", out, err)
	}
	if _, ok := r.Lookup("t", "xz-a1b2c3d4e5f6"); ok {
		t.Fatal("cache filled without a watcher")
	}
	n, ok, err := r.Fetch(ctx, "t", "xz-a1b2c3d4e5f6")
	if err != nil || !ok || !n.Record.Connected || n.Catalog.Len() != 1 {
		t.Fatalf("fetch = %+v %v %v", n, ok, err)
	}
	if _, ok := r.Lookup("t", "xz-a1b2c3d4e5f6"); !ok {
		t.Error("fetched node not cached")
	}
	for _, id := range []string{"xz-000000000000", "xz-*", "a.b", ""} {
		if _, ok, err := r.Fetch(ctx, "t", id); ok || err != nil {
			t.Errorf("fetch %q = %v %v", id, ok, err)
		}
	}
	// A repeated event writes nothing.
	if out, err := r.ApplyEvent(ctx, Pending{Event: ev(wire.DeviceOnline, "a", 100)}); err != nil || out != Unchanged {
		t.Errorf("repeat online: %v %v", out, err)
	}
}

func TestParkedEventsExpire(t *testing.T) {
	r, _ := openRegistry(t, Options{ParkTTL: time.Millisecond, MaxParked: 2})
	ctx := context.Background()
	for _, s := range []string{"x", "y", "z"} {
		out, err := r.ApplyEvent(ctx, Pending{Event: ev(wire.DeviceOffline, s, 100), Deadline: time.Now().Add(time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if want := map[string]Outcome{"x": Parked, "y": Parked, "z": Stale}[s]; out != want {
			t.Errorf("offline %s: %v, want %v", s, out, want)
		}
	}
	if n := r.ParkedLen(); n != 2 {
		t.Fatalf("parked %d, want the cap 2", n)
	}
	// An event past its deadline is not parked again.
	out, _ := r.ApplyEvent(ctx, Pending{Event: ev(wire.DeviceOffline, "w", 100), Deadline: time.Now().Add(-time.Second)})
	if out != Stale {
		t.Errorf("expired event: %v", out)
	}
	r.parkMu.Lock()
	r.sweepLocked(time.Now().Add(2 * time.Hour))
	r.parkMu.Unlock()
	if n := r.ParkedLen(); n != 0 {
		t.Errorf("sweep left %d parked events", n)
	}
}

func TestMarkUnreachableOnlyForTheSameSession(t *testing.T) {
	r, nc := openRegistry(t, Options{})
	ctx := context.Background()
	events := make(chan *nats.Msg, 8)
	sub, err := nc.ChanSubscribe(wire.NodeEvent("t"), events)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if _, err := r.ApplyEvent(ctx, Pending{Event: ev(wire.DeviceOnline, "b", 200)}); err != nil {
		t.Fatal(err)
	}
	<-events                                                 // node.connected
	r.MarkUnreachable(ctx, "t", "xz-a1b2c3d4e5f6", "h", "a") // an older session's failure
	if n, _, _ := r.Fetch(ctx, "t", "xz-a1b2c3d4e5f6"); !n.Record.Connected {
		t.Fatal("a failure on an old session disconnected the new one")
	}
	r.MarkUnreachable(ctx, "t", "xz-a1b2c3d4e5f6", "h", "b")
	if n, _, _ := r.Fetch(ctx, "t", "xz-a1b2c3d4e5f6"); n.Record.Connected {
		t.Fatal("node still connected after its session was unreachable")
	}
	select {
	case m := <-events:
		var e wire.NodeEventMsg
		if err := json.Unmarshal(m.Data, &e); err != nil || e.Event != wire.EventNodeDisconnected || m.Header.Get(wire.HeaderTenant) != "t" {
			t.Errorf("event = %s %v", m.Data, m.Header)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no node.disconnected")
	}
}

// A reconnecting node is connected at once with its last catalog marked
// stale, then fresh when its session lists the tools; every catalog change
// counts one more version and reaches operators as node.tools.changed (and
// mcp.tools.changed) with what changed.
func TestCatalogVersionAcrossReconnect(t *testing.T) {
	r, nc := openRegistry(t, Options{})
	ctx := context.Background()
	events := make(chan *nats.Msg, 32)
	sub, err := nc.ChanSubscribe(wire.NodeEvent("t"), events)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	const node = "xz-a1b2c3d4e5f6"
	apply := func(e *wire.DeviceEvent, want Outcome) wire.NodeRecord {
		t.Helper()
		out, err := r.ApplyEvent(ctx, Pending{Event: e})
		if err != nil || out != want {
			t.Fatalf("%s %s: %v %v, want %v", e.Kind, e.SessionID, out, err, want)
		}
		n, ok, err := r.Fetch(ctx, "t", node)
		if err != nil || !ok {
			t.Fatalf("fetch: %v %v", ok, err)
		}
		return n.Record
	}
	next := func(name string) wire.NodeEventMsg {
		t.Helper()
		for {
			select {
			case m := <-events:
				var e wire.NodeEventMsg
				if err := json.Unmarshal(m.Data, &e); err != nil {
					t.Fatal(err)
				}
				if e.Event == name {
					return e
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("no %s event", name)
			}
		}
	}
	type change struct {
		Tools, Added, Removed, Changed []string
		Version                        uint64
	}
	toolsChanged := func() change {
		t.Helper()
		var c change
		if err := json.Unmarshal(next(wire.EventNodeToolsChanged).Payload, &c); err != nil {
			t.Fatal(err)
		}
		var old change
		if err := json.Unmarshal(next(wire.EventToolsChanged).Payload, &old); err != nil || old.Version != c.Version {
			t.Fatalf("mcp.tools.changed disagrees: %+v %v", old, err)
		}
		return c
	}

	rec := apply(ev(wire.DeviceOnline, "a", 100), Applied)
	if rec.ToolsVersion != 1 || rec.ToolsStale {
		t.Fatalf("first session: version %d stale %v", rec.ToolsVersion, rec.ToolsStale)
	}
	next(wire.EventNodeConnected)
	apply(ev(wire.DeviceOffline, "a", 150), Applied)

	// The next session is announced before its catalog is listed.
	connecting := ev(wire.DeviceConnecting, "b", 200)
	connecting.Tools, connecting.ServerInfo = nil, nil
	rec = apply(connecting, Applied)
	if !rec.Connected || rec.SessionID != "b" || !rec.ToolsStale || string(rec.Tools) != `[{"name":"x"}]` || rec.ToolsVersion != 1 || rec.ModelIdentifier != "b" {
		t.Fatalf("connecting record: %+v", rec)
	}
	var conn struct {
		ToolsStale   bool   `json:"toolsStale"`
		ToolsVersion uint64 `json:"toolsVersion"`
	}
	if err := json.Unmarshal(next(wire.EventNodeConnected).Payload, &conn); err != nil || !conn.ToolsStale || conn.ToolsVersion != 1 {
		t.Fatalf("node.connected while listing: %+v %v", conn, err)
	}

	// Its online event brings the listed catalog.
	online := ev(wire.DeviceOnline, "b", 200)
	online.Tools = json.RawMessage(`[{"name":"x"},{"name":"y"}]`)
	rec = apply(online, Applied)
	if rec.ToolsStale || rec.ToolsVersion != 2 || !rec.Connected {
		t.Fatalf("listed record: %+v", rec)
	}
	if c := toolsChanged(); c.Version != 2 || len(c.Added) != 1 || c.Added[0] != "y" || len(c.Removed) != 0 || len(c.Tools) != 2 {
		t.Fatalf("change on listing: %+v", c)
	}
	// A replayed connecting event of the listed session changes nothing,
	// nor does one of an older session.
	apply(connecting, Stale)
	old := ev(wire.DeviceConnecting, "a", 100)
	apply(old, Stale)

	// A re-list while connected.
	relist := ev(wire.DeviceTools, "b", 300)
	relist.Tools = json.RawMessage(`[{"name":"y","description":"new"}]`)
	rec = apply(relist, Applied)
	if rec.ToolsVersion != 3 || rec.ToolsStale {
		t.Fatalf("after re-list: %+v", rec)
	}
	if c := toolsChanged(); c.Version != 3 || len(c.Removed) != 1 || c.Removed[0] != "x" || len(c.Changed) != 1 || c.Changed[0] != "y" {
		t.Fatalf("change on re-list: %+v", c)
	}
	// The same catalog again is no change.
	relist.AtMs = 400
	if rec = apply(relist, Applied); rec.ToolsVersion != 3 {
		t.Fatalf("an unchanged catalog counted a version: %d", rec.ToolsVersion)
	}
}

// Tools a node gains after its first catalog await approval; tools that
// leave the catalog leave the list; a new node's first catalog is approved.
func TestPendingToolsFollowWidening(t *testing.T) {
	at := int64(100)
	step := func(old *wire.NodeRecord, tools string) wire.NodeRecord {
		t.Helper()
		at += 100
		var rec wire.NodeRecord
		var ok bool
		if old == nil {
			e := ev(wire.DeviceOnline, "a", at)
			e.Tools = json.RawMessage(tools)
			rec, ok = applyOnline(nil, e)
		} else {
			e := ev(wire.DeviceTools, "a", at)
			e.Tools = json.RawMessage(tools)
			rec, ok = applyTools(old, e)
		}
		if !ok {
			t.Fatal("event did not apply")
		}
		return rec
	}
	rec := step(nil, `[{"name":"a"},{"name":"b"}]`)
	if len(rec.PendingTools) != 0 {
		t.Fatalf("first catalog pending: %v", rec.PendingTools)
	}
	rec = step(&rec, `[{"name":"a"},{"name":"b"},{"name":"d"},{"name":"c"}]`)
	if !slices.Equal(rec.PendingTools, []string{"c", "d"}) {
		t.Fatalf("after widening: %v", rec.PendingTools)
	}
	rec = step(&rec, `[{"name":"a"},{"name":"d"},{"name":"e"}]`)
	if !slices.Equal(rec.PendingTools, []string{"d", "e"}) {
		t.Fatalf("after c left and e came: %v", rec.PendingTools)
	}
	// A reconnect keeps what awaits approval.
	e := ev(wire.DeviceConnecting, "b", at+100)
	e.Tools = nil
	conn, _ := applyConnecting(&rec, e)
	online := ev(wire.DeviceOnline, "b", at+100)
	online.Tools = rec.Tools
	fresh, _ := applyOnline(&conn, online)
	if !slices.Equal(conn.PendingTools, []string{"d", "e"}) || !slices.Equal(fresh.PendingTools, []string{"d", "e"}) {
		t.Fatalf("across a reconnect: %v %v", conn.PendingTools, fresh.PendingTools)
	}
}
