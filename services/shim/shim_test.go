package shim_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/shim"
)

const (
	tenant = "acme"
	device = "a1b2c3d4e5f6"
	nodeID = "xz-a1b2c3d4e5f6"
)

// connectedNode starts a replica, brings one board online and waits until
// the shim's registry knows it.
func connectedNode(t *testing.T) (*env, *replica, *fakeDevice) {
	t.Helper()
	e := newEnv(t)
	r := e.startShim(t, shim.Config{})
	e.publishEvent(t, online(tenant, device, "s1", 1000))
	e.waitRecord(t, tenant, nodeID, "connected", func(r wire.NodeRecord) bool { return r.Connected })
	d := e.fakeDevice(t, e.nc, tenant, device)
	return e, r, d
}

func TestRegistryFollowsDeviceEvents(t *testing.T) {
	e := newEnv(t)
	e.startShim(t, shim.Config{})
	events := e.events(t, tenant)

	e.publishEvent(t, online(tenant, device, "s1", 1000))
	rec := e.waitRecord(t, tenant, nodeID, "connected", func(r wire.NodeRecord) bool { return r.Connected })
	want := wire.NodeRecord{
		NodeID: nodeID, Tenant: tenant, Kind: wire.NodeKindXiaoZhi, Device: device, DeviceRaw: "a1:b2:c3:d4:e5:f6",
		DisplayName: "bread-compact-wifi-d4e5f6", Platform: "xiaozhi", DeviceFamily: "XiaoZhi",
		ModelIdentifier: "bread-compact-wifi", Version: "1.9.2",
		ClientID: "5f0e3a4c-0000-4000-8000-000000000001", ClientMode: "node", RemoteIP: "192.0.2.10",
		Transport: wire.TransportWebSocket, Caps: []string{"mcp"},
		Commands:  []string{"mcp.initialize", "mcp.tools.call", "mcp.tools.call.v1", "mcp.tools.list"},
		Connected: true, ConnectedAtMs: 1000, LastSeenMs: 1000, Owner: "hub-1", SessionID: "s1",
		ToolsVersion: 1,
	}
	if string(rec.Tools) != compact(t, xiaozhiTools) {
		t.Errorf("tools = %s", rec.Tools)
	}
	rec.Tools = nil
	if fmt.Sprint(rec) != fmt.Sprint(want) {
		t.Errorf("record\n got %+v\nwant %+v", rec, want)
	}
	ev := nextEvent(t, events, wire.EventNodeConnected)
	if ev.NodeID != nodeID || !strings.Contains(string(ev.Payload), `"displayName":"bread-compact-wifi-d4e5f6"`) {
		t.Errorf("node.connected = %+v %s", ev, ev.Payload)
	}

	tools := `[{"name":"self.light.set_rgb","description":"Set the light","inputSchema":{"type":"object","properties":{"r":{"type":"integer"}},"required":["r"]}}]`
	e.publishEvent(t, wire.DeviceEvent{Kind: wire.DeviceTools, Tenant: tenant, Device: device, SessionID: "s1", Hub: "hub-1", AtMs: 2000, Tools: json.RawMessage(tools)})
	e.waitRecord(t, tenant, nodeID, "relisted", func(r wire.NodeRecord) bool { return string(r.Tools) == tools && r.LastSeenMs == 2000 })
	ev = nextEvent(t, events, wire.EventToolsChanged)
	if string(ev.Payload) != `{"tools":["self.light.set_rgb"],"added":["self.light.set_rgb"],"removed":["self.audio_speaker.set_volume","self.get_device_status","self.reboot","self.screen.set_theme"],"changed":[],"version":2,"pending":["self.light.set_rgb"]}` {
		t.Errorf("mcp.tools.changed payload = %s", ev.Payload)
	}

	e.publishEvent(t, wire.DeviceEvent{Kind: wire.DeviceOffline, Tenant: tenant, Device: device, SessionID: "s1", Hub: "hub-1", AtMs: 3000, Reason: "closed by device"})
	rec = e.waitRecord(t, tenant, nodeID, "disconnected", func(r wire.NodeRecord) bool { return !r.Connected })
	if rec.LastSeenMs != 3000 || rec.SessionID != "s1" || string(rec.Tools) != tools {
		t.Errorf("disconnected record = %+v", rec)
	}
	ev = nextEvent(t, events, wire.EventNodeDisconnected)
	if string(ev.Payload) != `{"reason":"closed by device","disconnectedAtMs":3000}` {
		t.Errorf("node.disconnected payload = %s", ev.Payload)
	}
}

func TestRegistryOutOfOrderAndReplacedSessions(t *testing.T) {
	e := newEnv(t)
	e.startShim(t, shim.Config{})
	e.startShim(t, shim.Config{}) // two replicas race on the same records

	// Offline overtakes its own online: the device must end up disconnected.
	e.publishEvent(t, wire.DeviceEvent{Kind: wire.DeviceOffline, Tenant: tenant, Device: "000000000001", SessionID: "a", Hub: "hub-1", AtMs: 1500})
	e.publishEvent(t, online(tenant, "000000000001", "a", 1000))
	e.waitRecord(t, tenant, "xz-000000000001", "disconnected after a late online", func(r wire.NodeRecord) bool {
		return r.SessionID == "a" && !r.Connected
	})

	// A new session replaces an old one; the old session's offline arrives last.
	e.publishEvent(t, online(tenant, "000000000002", "old", 1000))
	e.waitRecord(t, tenant, "xz-000000000002", "on the old session", func(r wire.NodeRecord) bool { return r.SessionID == "old" })
	next := online(tenant, "000000000002", "new", 2000)
	next.Hub = "hub-2"
	e.publishEvent(t, next)
	e.waitRecord(t, tenant, "xz-000000000002", "on the new session", func(r wire.NodeRecord) bool { return r.SessionID == "new" })
	e.publishEvent(t, wire.DeviceEvent{Kind: wire.DeviceOffline, Tenant: tenant, Device: "000000000002", SessionID: "old", Hub: "hub-1", AtMs: 2500})
	// A late online of the old session must not take the record back either.
	e.publishEvent(t, online(tenant, "000000000002", "old", 1000))
	// A marker event on the same device proves the two above were handled.
	e.publishEvent(t, wire.DeviceEvent{Kind: wire.DeviceTools, Tenant: tenant, Device: "000000000002", SessionID: "new", Hub: "hub-2", AtMs: 3000, Tools: json.RawMessage(`[]`)})
	rec := e.waitRecord(t, tenant, "xz-000000000002", "relisted", func(r wire.NodeRecord) bool { return string(r.Tools) == "[]" })
	if !rec.Connected || rec.SessionID != "new" || rec.Owner != "hub-2" || rec.ConnectedAtMs != 2000 {
		t.Errorf("old session events changed the record: %+v", rec)
	}

	// A tools event that overtakes its online still lands.
	e.publishEvent(t, wire.DeviceEvent{Kind: wire.DeviceTools, Tenant: tenant, Device: "000000000003", SessionID: "x", Hub: "hub-1", AtMs: 1100, Tools: json.RawMessage(`[{"name":"late"}]`)})
	e.publishEvent(t, online(tenant, "000000000003", "x", 1000))
	e.waitRecord(t, tenant, "xz-000000000003", "with the later catalog", func(r wire.NodeRecord) bool {
		return r.Connected && string(r.Tools) == `[{"name":"late"}]`
	})
}

func TestEventsForAnotherDeviceAreRefused(t *testing.T) {
	e := newEnv(t)
	e.startShim(t, shim.Config{})
	// A body naming another device than its subject is dropped.
	ev := online(tenant, device, "s1", 1000)
	data, _ := json.Marshal(ev)
	if err := e.nc.Publish(wire.DeviceState(tenant, "ffffffffffff"), data); err != nil {
		t.Fatal(err)
	}
	e.publishEvent(t, online(tenant, "0000000000aa", "s1", 1000))
	e.waitRecord(t, tenant, "xz-0000000000aa", "connected", func(r wire.NodeRecord) bool { return r.Connected })
	for _, n := range []string{nodeID, "xz-ffffffffffff"} {
		if _, ok := e.record(t, tenant, n); ok {
			t.Errorf("record %s written from a mismatched event", n)
		}
	}
}

func TestInvokeCommands(t *testing.T) {
	e, _, d := connectedNode(t)
	tests := []struct {
		name       string
		req        wire.InvokeRequest
		wantMethod string
		wantParams string
		wantResult string
	}{
		{
			name:       "initialize without params",
			req:        wire.InvokeRequest{NodeID: nodeID, Command: "mcp.initialize"},
			wantMethod: "initialize",
			wantParams: `{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"xiaoclaw","version":"1"}}`,
			wantResult: `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":` + serverInfo + `}`,
		},
		{
			name:       "initialize with vision capability",
			req:        wire.InvokeRequest{NodeID: nodeID, Command: "mcp.initialize", Params: json.RawMessage(`{"capabilities":{"vision":{"url":"http://x/mcp/vision/explain","token":"t"}}}`)},
			wantMethod: "initialize",
			wantParams: `{"capabilities":{"vision":{"url":"http://x/mcp/vision/explain","token":"t"}}}`,
			wantResult: `{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":` + serverInfo + `}`,
		},
		{
			name:       "tools.list with cursor and user tools",
			req:        wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.list", Params: json.RawMessage(`{"cursor":"self.reboot","withUserTools":true}`)},
			wantMethod: "tools/list",
			wantParams: `{"cursor":"self.reboot","withUserTools":true}`,
			wantResult: `{"tools":` + xiaozhiTools + `}`, // the device's bytes, untouched
		},
		{
			name:       "tools.call",
			req:        wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.call", Params: json.RawMessage(`{"name":"self.audio_speaker.set_volume","arguments":{"volume":50}}`)},
			wantMethod: "tools/call",
			wantParams: `{"name":"self.audio_speaker.set_volume","arguments":{"volume":50}}`,
			wantResult: `{"content":[{"type":"text","text":"true"}],"isError":false}`,
		},
		{
			name:       "tools.call without arguments",
			req:        wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.call", Params: json.RawMessage(`{"name":"self.get_device_status"}`)},
			wantMethod: "tools/call",
			wantParams: `{"name":"self.get_device_status","arguments":{}}`,
			wantResult: `{"content":[{"type":"text","text":"{\"audio_speaker\":{\"volume\":70}}"}],"isError":false}`,
		},
		{
			name:       "OpenClaw mcp.tools.call.v1",
			req:        wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.call.v1", Params: json.RawMessage(`{"server":"xiaozhi","tool":" self.audio_speaker.set_volume ","arguments":{"volume":5}}`)},
			wantMethod: "tools/call",
			wantParams: `{"name":"self.audio_speaker.set_volume","arguments":{"volume":5}}`,
			wantResult: `{"content":[{"type":"text","text":"true"}]}`,
		},
		{
			name:       "mcp.tools.call.v1 naming the board as server",
			req:        wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.call.v1", Params: json.RawMessage(`{"server":"bread-compact-wifi","tool":"self.get_device_status"}`)},
			wantMethod: "tools/call",
			wantParams: `{"name":"self.get_device_status","arguments":{}}`,
			wantResult: `{"content":[{"type":"text","text":"{\"audio_speaker\":{\"volume\":70}}"}]}`,
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.invoke(t, tenant, tt.req, 5*time.Second)
			if !r.OK || r.Error != nil {
				t.Fatalf("reply = %+v", r.Error)
			}
			if string(r.Payload) != tt.wantResult {
				t.Errorf("payload\n got %s\nwant %s", r.Payload, tt.wantResult)
			}
			seen := d.seen()
			if len(seen) != i+1 {
				t.Fatalf("device saw %d requests, want %d", len(seen), i+1)
			}
			got := seen[i]
			if got.JSONRPC != "2.0" || got.Method != tt.wantMethod || string(got.Params) != tt.wantParams {
				t.Errorf("device request = %s %s %s, want %s %s", got.JSONRPC, got.Method, got.Params, tt.wantMethod, tt.wantParams)
			}
			for k := range got.Header { // the subject names tenant and device
				if k != wire.HeaderTimeout && k != "traceparent" && k != "tracestate" {
					t.Errorf("device request has header %s: %v", k, got.Header)
				}
			}
			if ms, err := strconv.Atoi(got.Header.Get(wire.HeaderTimeout)); err != nil || ms <= 0 || ms > 5000 {
				t.Errorf("device request %s = %q, want 1-5000 (the caller's remaining time)", wire.HeaderTimeout, got.Header.Get(wire.HeaderTimeout))
			}
		})
	}
}

func TestInvokeRefusedBeforeTheDevice(t *testing.T) {
	e, _, d := connectedNode(t)
	tests := []struct {
		name     string
		tenant   string
		req      wire.InvokeRequest
		code     string
		contains []string
	}{
		{"volume above the schema maximum", tenant,
			wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.call", Params: json.RawMessage(`{"name":"self.audio_speaker.set_volume","arguments":{"volume":150}}`)},
			wire.FaultInvalidRequest, []string{"self.audio_speaker.set_volume", `"volume"`, "maximum", "150", "100"}},
		{"volume of the wrong type", tenant,
			wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.call", Params: json.RawMessage(`{"name":"self.audio_speaker.set_volume","arguments":{"volume":"loud"}}`)},
			wire.FaultInvalidRequest, []string{`"volume"`, "integer"}},
		{"volume missing", tenant,
			wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.call", Params: json.RawMessage(`{"name":"self.audio_speaker.set_volume","arguments":{}}`)},
			wire.FaultInvalidRequest, []string{`missing argument "volume"`}},
		{"v1 volume above maximum", tenant,
			wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.call.v1", Params: json.RawMessage(`{"server":"xiaozhi","tool":"self.audio_speaker.set_volume","arguments":{"volume":101}}`)},
			wire.FaultInvalidRequest, []string{`"volume"`, "maximum"}},
		{"unknown tool", tenant,
			wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.call", Params: json.RawMessage(`{"name":"self.nope","arguments":{}}`)},
			wire.FaultInvalidRequest, []string{"unknown tool: self.nope"}},
		{"v1 unknown tool", tenant,
			wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.call.v1", Params: json.RawMessage(`{"server":"xiaozhi","tool":"self.nope"}`)},
			"MCP_TOOL_UNAVAILABLE", []string{`MCP tool "self.nope" is unavailable on server "xiaozhi"`}},
		{"v1 unknown server", tenant,
			wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.call.v1", Params: json.RawMessage(`{"server":"localDocs","tool":"read_file"}`)},
			"MCP_SERVER_UNAVAILABLE", []string{`MCP server "localDocs" is unavailable`}},
		{"misspelt parameter", tenant,
			wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.call", Params: json.RawMessage(`{"name":"self.reboot","args":{}}`)},
			wire.FaultInvalidRequest, []string{`unknown parameter "args"`}},
		{"unknown node", tenant,
			wire.InvokeRequest{NodeID: "xz-ffffffffffff", Command: "mcp.tools.list"},
			wire.FaultInvalidRequest, []string{"unknown nodeId"}},
		{"node id with a wildcard", tenant,
			wire.InvokeRequest{NodeID: "xz-*", Command: "mcp.tools.list"},
			wire.FaultInvalidRequest, []string{"unknown nodeId"}},
		{"another tenant's node", "other",
			wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.list"},
			wire.FaultInvalidRequest, []string{"unknown nodeId"}},
		{"command the node does not declare", tenant,
			wire.InvokeRequest{NodeID: nodeID, Command: "system.run", Params: json.RawMessage(`{"command":["ls"]}`)},
			wire.FaultInvalidRequest, []string{"command not declared by node: system.run"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := e.invoke(t, tt.tenant, tt.req, 5*time.Second)
			if r.OK || r.Error == nil || r.Error.Code != tt.code {
				t.Fatalf("reply = ok %v error %+v, want %s", r.OK, r.Error, tt.code)
			}
			for _, s := range tt.contains {
				if !strings.Contains(r.Error.Message, s) {
					t.Errorf("message %q lacks %q", r.Error.Message, s)
				}
			}
		})
	}
	if n := len(d.seen()); n != 0 {
		t.Errorf("the device saw %d requests that should have been refused", n)
	}
}

func TestInvokeDeviceErrorWithoutCode(t *testing.T) {
	e, _, _ := connectedNode(t)
	r := e.invoke(t, tenant, wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.call", Params: json.RawMessage(`{"name":"self.reboot"}`)}, 5*time.Second)
	if r.Error == nil || r.Error.Code != wire.FaultDeviceError || r.Error.Message != "Reboot is not allowed while upgrading" {
		t.Fatalf("reply error = %+v", r.Error)
	}
	if string(r.Error.Details) != `{"rpcError":{"message":"Reboot is not allowed while upgrading"}}` {
		t.Errorf("details = %s", r.Error.Details)
	}
	// The same device error through OpenClaw's command carries its code.
	r = e.invoke(t, tenant, wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.call.v1", Params: json.RawMessage(`{"server":"xiaozhi","tool":"self.reboot"}`)}, 5*time.Second)
	if r.Error == nil || r.Error.Code != "MCP_TOOL_ERROR" || r.Error.Message != "Reboot is not allowed while upgrading" {
		t.Fatalf("v1 reply error = %+v", r.Error)
	}
}

func TestInvokeOfflineDeviceFailsFastAndMarksNode(t *testing.T) {
	e := newEnv(t)
	e.startShim(t, shim.Config{})
	events := e.events(t, tenant)
	e.publishEvent(t, online(tenant, device, "s1", 1000))
	e.waitRecord(t, tenant, nodeID, "connected", func(r wire.NodeRecord) bool { return r.Connected })
	// No hub serves the device's subject: the record is stale.
	r := e.invoke(t, tenant, wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.call", Params: json.RawMessage(`{"name":"self.get_device_status"}`)}, 60*time.Second)
	if r.Error == nil || r.Error.Code != wire.FaultNotConnected {
		t.Fatalf("reply error = %+v, want NOT_CONNECTED", r.Error)
	}
	e.waitRecord(t, tenant, nodeID, "disconnected", func(r wire.NodeRecord) bool { return !r.Connected })
	ev := nextEvent(t, events, wire.EventNodeDisconnected)
	if !strings.Contains(string(ev.Payload), `"reason":"unreachable"`) {
		t.Errorf("node.disconnected payload = %s", ev.Payload)
	}
}

func TestInvokeTimeout(t *testing.T) {
	e, _, d := connectedNode(t)
	hold := make(chan struct{})
	defer close(hold)
	d.mu.Lock()
	d.hold = hold
	d.mu.Unlock()
	r := e.invoke(t, tenant, wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.list"}, 200*time.Millisecond)
	if r.Error == nil || r.Error.Code != wire.FaultTimeout || r.Error.Message != "node invoke timed out" {
		t.Fatalf("reply error = %+v, want TIMEOUT", r.Error)
	}
}

func TestInvokeHubFaultPassesThrough(t *testing.T) {
	e, _, d := connectedNode(t)
	d.mu.Lock()
	d.answer = func(rpcRequest) ([]byte, string) {
		return []byte(`{"code":"DISCONNECTED","message":"session closed while the call was pending"}`), wire.FaultDisconnected
	}
	d.mu.Unlock()
	r := e.invoke(t, tenant, wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.list"}, 5*time.Second)
	if r.Error == nil || r.Error.Code != wire.FaultDisconnected || r.Error.Message != "session closed while the call was pending" {
		t.Fatalf("reply error = %+v", r.Error)
	}
}

func TestNotificationBecomesNodeEvent(t *testing.T) {
	e := newEnv(t)
	e.startShim(t, shim.Config{})
	events := e.events(t, tenant)
	e.publishEvent(t, wire.DeviceEvent{
		Kind: wire.DeviceNotification, Tenant: tenant, Device: device, SessionID: "s1", Hub: "hub-1", AtMs: 4242,
		Notification: json.RawMessage(`{"jsonrpc":"2.0","method":"notifications/state_changed","params":{"newState":"listening","oldState":"idle"}}`),
	})
	ev := nextEvent(t, events, wire.EventMCPNotification)
	if ev.NodeID != nodeID || ev.TsMs != 4242 {
		t.Errorf("event = %+v", ev)
	}
	if string(ev.Payload) != `{"method":"notifications/state_changed","params":{"newState":"listening","oldState":"idle"}}` {
		t.Errorf("payload = %s", ev.Payload)
	}
}

func TestResyncOnStart(t *testing.T) {
	e := newEnv(t)
	// A devicehub that re-announces its one session when asked.
	hub := connect(t, e.srv, "hub")
	asked := make(chan struct{}, 4)
	_, err := hub.Subscribe(wire.SubjectHubResync, func(*nats.Msg) {
		asked <- struct{}{}
		ev := online(tenant, device, "s9", 9000)
		data, _ := json.Marshal(ev)
		_ = hub.Publish(wire.DeviceState(tenant, device), data)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := hub.Flush(); err != nil {
		t.Fatal(err)
	}
	e.startShim(t, shim.Config{})
	select {
	case <-asked:
	case <-time.After(waitFor):
		t.Fatal("the shim did not ask hubs to resync")
	}
	e.waitRecord(t, tenant, nodeID, "re-announced", func(r wire.NodeRecord) bool { return r.Connected && r.SessionID == "s9" })
}

func TestReplicasShareInvokesAndDrainOnStop(t *testing.T) {
	e := newEnv(t)
	a := e.startShim(t, shim.Config{Instance: "a"})
	e.startShim(t, shim.Config{Instance: "b"})
	e.publishEvent(t, online(tenant, device, "s1", 1000))
	e.waitRecord(t, tenant, nodeID, "connected", func(r wire.NodeRecord) bool { return r.Connected })
	d := e.fakeDevice(t, e.nc, tenant, device)
	// Both replicas must know the node before calls start.
	call := wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.call", Params: json.RawMessage(`{"name":"self.get_device_status"}`)}
	for range 200 {
		if r := e.invoke(t, tenant, call, 5*time.Second); !r.OK {
			t.Fatalf("invoke: %+v", r.Error)
		}
	}
	// Each replica's connection has its own reply inbox prefix.
	prefixes := map[string]bool{}
	for _, req := range d.seen() {
		prefixes[req.Reply[:strings.LastIndexByte(req.Reply, '.')]] = true
	}
	if len(prefixes) != 2 {
		t.Fatalf("calls went through %d replicas, want 2", len(prefixes))
	}

	// A call in flight on a stopping replica still completes.
	hold := make(chan struct{})
	d.mu.Lock()
	d.hold = hold
	d.mu.Unlock()
	var wg sync.WaitGroup
	replies := make(chan wire.InvokeReply, 8)
	for range 8 {
		wg.Go(func() {
			r, err := e.tryInvoke(tenant, call, 10*time.Second)
			if err != nil {
				r = wire.InvokeReply{Error: &wire.Fault{Code: "REQUEST", Message: err.Error()}}
			}
			replies <- r
		})
	}
	deadline := time.Now().Add(waitFor)
	for len(d.seen()) < 208 {
		if time.Now().After(deadline) {
			t.Fatal("calls did not reach the device")
		}
		time.Sleep(time.Millisecond)
	}
	stopped := make(chan struct{})
	go func() { a.stop(t); close(stopped) }()
	close(hold)
	<-stopped
	wg.Wait()
	close(replies)
	for r := range replies {
		if !r.OK {
			t.Errorf("in-flight call lost in the drain: %+v", r.Error)
		}
	}
	d.mu.Lock()
	d.hold = nil
	d.mu.Unlock()
	// The remaining replica takes every new call.
	for range 20 {
		if r := e.invoke(t, tenant, call, 5*time.Second); !r.OK {
			t.Fatalf("invoke after a replica stopped: %+v", r.Error)
		}
	}
}

func TestRollingRestartLosesNoCall(t *testing.T) {
	e := newEnv(t)
	a := e.startShim(t, shim.Config{Instance: "a"})
	e.publishEvent(t, online(tenant, device, "s1", 1000))
	e.waitRecord(t, tenant, nodeID, "connected", func(r wire.NodeRecord) bool { return r.Connected })
	e.fakeDevice(t, e.nc, tenant, device)
	b := e.startShim(t, shim.Config{Instance: "b"})

	call := wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.list"}
	ctx, cancel := context.WithCancel(context.Background())
	var failures []string
	var mu sync.Mutex
	var wg sync.WaitGroup
	var calls int
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				r, err := e.tryInvoke(tenant, call, 5*time.Second)
				mu.Lock()
				calls++
				switch {
				case err != nil:
					failures = append(failures, err.Error())
				case !r.OK:
					failures = append(failures, r.Error.Code+": "+r.Error.Message)
				}
				mu.Unlock()
			}
		})
	}
	// Restart a, then b, while calls keep flowing.
	a.stop(t)
	e.startShim(t, shim.Config{Instance: "a2"})
	b.stop(t)
	cancel()
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d of %d calls failed during the rolling restart, first: %s", len(failures), calls, failures[0])
	}
	if calls == 0 {
		t.Fatal("no calls ran")
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []shim.Config{
		{DefaultTimeout: time.Minute, MaxTimeout: time.Second},
		{DefaultTimeout: -time.Second},
		{MaxInFlight: -1},
		{TenantMaxInFlight: -1},
		{DeviceMaxInFlight: -5},
		{TenantMaxInFlight: wire.MaxInflightLimit + 1},
		{RetryAfter: -time.Second},
	}
	for _, c := range bad {
		if err := c.Validate(); err == nil {
			t.Errorf("Validate(%+v) = nil", c)
		}
		if _, err := shim.New(c, &nats.Conn{}, nil); err == nil {
			t.Errorf("New(%+v) accepted an invalid config", c)
		}
	}
	if err := (shim.Config{}).Validate(); err != nil {
		t.Errorf("zero Config: %v", err)
	}
	if _, err := shim.New(shim.Config{}, nil, nil); err == nil {
		t.Error("New without a NATS connection succeeded")
	}
}

func compact(t *testing.T, s string) string {
	t.Helper()
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestInvokeDeadlineFromCaller(t *testing.T) {
	e, _, d := connectedNode(t)
	for _, tt := range []struct {
		header string
		min    int
		max    int
	}{
		{"", 14000, 15000},         // none: the default 15 s
		{"soon", 14000, 15000},     // unreadable: the default
		{"2500", 1, 2500},          // the caller's remaining time
		{"900000", 299000, 300000}, // capped at 300 s
	} {
		data, _ := json.Marshal(wire.InvokeRequest{NodeID: nodeID, Command: "mcp.tools.list"})
		msg := &nats.Msg{Subject: wire.NodeInvoke(tenant), Header: nats.Header{}, Data: data}
		if tt.header != "" {
			msg.Header.Set(wire.HeaderTimeout, tt.header)
		}
		if _, err := e.nc.RequestMsg(msg, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		seen := d.seen()
		got, err := strconv.Atoi(seen[len(seen)-1].Header.Get(wire.HeaderTimeout))
		if err != nil || got < tt.min || got > tt.max {
			t.Errorf("caller %q: device request carries %d ms, want %d-%d", tt.header, got, tt.min, tt.max)
		}
	}
}
