package devicehub_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/authguard"
	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/pkg/xzsim"
	"github.com/xiaoclaw/xiaoclaw/services/devicehub"
)

func TestServerHelloWithinDeadline(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{})
	// The simulated firmware gives up after 2 s here (10 s on a real board).
	d := connect(t, hub, "AA:BB:CC:00:00:01", func(c *xzsim.Config) { c.HelloTimeout = 2 * time.Second })

	var hello struct {
		Type        string `json:"type"`
		Transport   string `json:"transport"`
		SessionID   string `json:"session_id"`
		AudioParams struct {
			Format     string `json:"format"`
			SampleRate int    `json:"sample_rate"`
		} `json:"audio_params"`
	}
	if err := json.Unmarshal(d.ServerHello(), &hello); err != nil {
		t.Fatal(err)
	}
	if hello.Type != "hello" || hello.Transport != "websocket" || hello.SessionID == "" || hello.AudioParams.Format != "opus" || hello.AudioParams.SampleRate == 0 {
		t.Fatalf("server hello lacks what the firmware needs: %s", d.ServerHello())
	}
}

func TestHelloWithoutTransportOrVersionAccepted(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{})
	w := watch(t, e, testTenant, "browser-1")
	ws := dialRaw(t, hub, "browser-1", testToken)
	// A browser test page's hello: no version, no transport, no MCP.
	writeText(t, ws, `{"type":"hello","audio_params":{"format":"opus","sample_rate":16000,"channels":1,"frame_duration":60}}`)
	if got := readText(t, ws); !strings.Contains(got, `"transport":"websocket"`) {
		t.Fatalf("server hello: %s", got)
	}
	ev := w.nextKind(wire.DeviceOnline)
	if ev.MCP || ev.Tools != nil || ev.Transport != wire.TransportWebSocket {
		t.Fatalf("online event of a device without MCP: %+v", ev)
	}
}

func TestDiscoveryPagesAndOnlineEvent(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{Instance: "hub-a"})
	const mac = "aa:bb:cc:00:00:02"
	w := watch(t, e, testTenant, canonical(t, mac))
	d := connect(t, hub, mac, func(c *xzsim.Config) { c.ExtraTools = 90 })

	ev := w.nextKind(wire.DeviceOnline)
	names := toolNames(t, ev.Tools)
	if len(names) != 4+90 {
		t.Fatalf("catalog has %d tools, want 94 (4 common + 90 extra, no user-only): %v", len(names), names)
	}
	if names[0] != "self.get_device_status" || names[len(names)-1] != "self.sim.extra_0090" {
		t.Fatalf("catalog order: first %s, last %s", names[0], names[len(names)-1])
	}
	if containsName(names, "self.reboot") != 0 {
		t.Fatal("user-only tools listed without WithUserTools")
	}
	if pages := d.Requests("tools/list"); pages < 3 {
		t.Fatalf("tools/list requested %d times, want the catalog paged over at least 3", pages)
	}
	var initParams struct {
		ProtocolVersion string                `json:"protocolVersion"`
		ClientInfo      struct{ Name string } `json:"clientInfo"`
		Capabilities    json.RawMessage       `json:"capabilities"`
	}
	if err := json.Unmarshal(d.LastParams("initialize"), &initParams); err != nil {
		t.Fatal(err)
	}
	if initParams.ProtocolVersion != "2024-11-05" || initParams.ClientInfo.Name != "xiaoclaw" || string(initParams.Capabilities) != "{}" {
		t.Fatalf("initialize params: %s", d.LastParams("initialize"))
	}
	var info struct{ Name, Version string }
	if err := json.Unmarshal(ev.ServerInfo, &info); err != nil || info.Name != xzsim.DefaultBoardName {
		t.Fatalf("serverInfo %s", ev.ServerInfo)
	}
	if ev.Hub != "hub-a" || ev.DeviceRaw != mac || ev.Device != "aabbcc000002" || ev.ClientID != d.ClientID() ||
		ev.RemoteIP != "127.0.0.1" || !ev.MCP || ev.SessionID != d.SessionID() || ev.Transport != wire.TransportWebSocket {
		t.Fatalf("online event: %+v", ev)
	}
	var hello map[string]any
	if err := json.Unmarshal(ev.Hello, &hello); err != nil || hello["type"] != "hello" || hello["transport"] != "websocket" {
		t.Fatalf("hello not carried verbatim: %s", ev.Hello)
	}
}

func TestWithUserToolsListsUserOnlyTools(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{WithUserTools: true})
	const mac = "aa:bb:cc:00:00:03"
	w := watch(t, e, testTenant, canonical(t, mac))
	d := connect(t, hub, mac, nil)
	names := toolNames(t, w.nextKind(wire.DeviceOnline).Tools)
	if containsName(names, "self.reboot") != 1 || containsName(names, "self.screen.snapshot") != 1 {
		t.Fatalf("user-only tools missing: %v", names)
	}
	if !strings.Contains(string(d.LastParams("tools/list")), `"withUserTools":true`) {
		t.Fatalf("tools/list params: %s", d.LastParams("tools/list"))
	}
}

func TestCallOverNATS(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{})
	const mac = "aa:bb:cc:00:00:04"
	dev := canonical(t, mac)
	w := watch(t, e, testTenant, dev)
	d := connect(t, hub, mac, nil)
	w.nextKind(wire.DeviceOnline)

	r := decodeResponse(t, rpc(t, e.nc, testTenant, dev, callBody("self.audio_speaker.set_volume", `{"volume":42}`), 5*time.Second))
	if r.Error != nil || r.Result == nil || r.Result.IsError || len(r.Result.Content) != 1 || r.Result.Content[0].Text != "true" {
		t.Fatalf("set_volume response: %+v", r)
	}
	if d.Volume() != 42 {
		t.Fatalf("device volume %d after set_volume 42", d.Volume())
	}
	r = decodeResponse(t, rpc(t, e.nc, testTenant, dev, callBody("self.get_device_status", `{}`), 5*time.Second))
	var status struct {
		AudioSpeaker struct{ Volume int } `json:"audio_speaker"`
	}
	if err := json.Unmarshal([]byte(r.Result.Content[0].Text), &status); err != nil || status.AudioSpeaker.Volume != 42 {
		t.Fatalf("status text %q", r.Result.Content[0].Text)
	}
	// Any id the caller sends is replaced by the session's own numeric id.
	m := rpc(t, e.nc, testTenant, dev, `{"jsonrpc":"2.0","id":"abc","method":"tools/list","params":{}}`, 5*time.Second)
	if r := decodeResponse(t, m); r.Error != nil || string(r.ID) == `"abc"` {
		t.Fatalf("tools/list with a string id: %s", m.Data)
	}
}

func TestDeviceErrorsRelayedVerbatim(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{})
	const mac = "aa:bb:cc:00:00:05"
	dev := canonical(t, mac)
	d := connectOnline(t, e, hub, mac, nil)

	for _, tc := range []struct{ body, message string }{
		{callBody("self.no_such_tool", `{}`), "Unknown tool: self.no_such_tool"},
		{callBody("self.audio_speaker.set_volume", `{"volume":101}`), "Value exceeds maximum allowed: 100"},
		{callBody("self.audio_speaker.set_volume", `{"volume":-1}`), "Value is below minimum allowed: 0"},
		{callBody("self.audio_speaker.set_volume", `{"level":5}`), "Missing valid argument: volume"},
		{`{"jsonrpc":"2.0","method":"ping"}`, "Method not implemented: ping"},
	} {
		r := decodeResponse(t, rpc(t, e.nc, testTenant, dev, tc.body, 5*time.Second))
		if r.Error == nil || r.Error.Message != tc.message || r.Error.Code != nil {
			t.Errorf("%s: got %+v, want error %q without code", tc.body, r.Error, tc.message)
		}
	}
	if d.Volume() != 70 {
		t.Fatalf("volume changed to %d by rejected calls", d.Volume())
	}
}

func TestDisconnectFailsPendingCallsAtOnce(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{CallTimeout: time.Minute})
	const mac = "aa:bb:cc:00:00:06"
	dev := canonical(t, mac)
	w := watch(t, e, testTenant, dev)
	d := connect(t, hub, mac, nil)
	online := w.nextKind(wire.DeviceOnline)
	d.Hold()

	const calls = 3
	replies := make(chan *wireReply, calls)
	for range calls {
		go func() {
			// A caller that would wait a full minute for the device.
			m, err := rpcErr(e.nc, testTenant, dev, callBody("self.screen.set_brightness", `{"brightness":10}`), time.Minute)
			replies <- &wireReply{m, err}
		}()
	}
	eventually.True(t, "calls held on the device", func() bool { return d.Held() == calls })
	start := time.Now()
	d.Drop()
	for range calls {
		select {
		case r := <-replies:
			if r.err != nil {
				t.Fatal(r.err)
			}
			if f := fault(t, r.msg); f.Code != wire.FaultDisconnected {
				t.Fatalf("fault %+v, want DISCONNECTED", f)
			}
		case <-time.After(waitLimit):
			t.Fatal("pending call not failed after the device disconnected")
		}
	}
	t.Logf("pending calls failed %v after the drop", time.Since(start))
	off := w.nextKind(wire.DeviceOffline)
	if off.SessionID != online.SessionID || off.Reason == "" {
		t.Fatalf("offline event: %+v", off)
	}
	// With the session gone nobody serves the subject: callers fail fast.
	if _, err := rpcErr(e.nc, testTenant, dev, callBody("self.get_device_status", `{}`), time.Second); !isNoResponders(err) {
		t.Fatalf("call to an offline device: %v, want no responders", err)
	}
}

type wireReply struct {
	msg *nats.Msg
	err error
}

func TestNewSessionReplacesOld(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{})
	const mac = "aa:bb:cc:00:00:07"
	dev := canonical(t, mac)
	w := watch(t, e, testTenant, dev)
	d1 := connect(t, hub, mac, nil)
	on1 := w.nextKind(wire.DeviceOnline)
	release := d1.Hold()
	defer release()
	pending := make(chan *wireReply, 1)
	go func() {
		m, err := rpcErr(e.nc, testTenant, dev, callBody("self.audio_speaker.set_volume", `{"volume":1}`), time.Minute)
		pending <- &wireReply{m, err}
	}()
	eventually.True(t, "call held on the first session", func() bool { return d1.Held() == 1 })

	d2 := connect(t, hub, mac, nil)
	eventually.Closed(t, d1.Done(), "old connection closed")
	r := <-pending
	if r.err != nil || fault(t, r.msg).Code != wire.FaultDisconnected {
		t.Fatalf("pending call on the replaced session: %v", r.err)
	}
	off := w.next()
	conn2 := w.next()
	on2 := w.next()
	if off.Kind != wire.DeviceOffline || off.SessionID != on1.SessionID {
		t.Fatalf("first event after replacement: %+v, want offline of %s", off, on1.SessionID)
	}
	if conn2.Kind != wire.DeviceConnecting || conn2.SessionID != d2.SessionID() || len(conn2.Tools) != 0 {
		t.Fatalf("second event after replacement: %+v, want connecting of %s", conn2, d2.SessionID())
	}
	if on2.Kind != wire.DeviceOnline || on2.SessionID != d2.SessionID() || on2.SessionID <= on1.SessionID {
		t.Fatalf("third event after replacement: %+v, want online of %s (sorting after %s)", on2, d2.SessionID(), on1.SessionID)
	}
	decodeResponse(t, rpc(t, e.nc, testTenant, dev, callBody("self.audio_speaker.set_volume", `{"volume":9}`), 5*time.Second))
	if d2.Volume() != 9 || d1.Volume() == 9 {
		t.Fatal("call did not reach the new session")
	}
	if hub.Sessions() != 1 {
		t.Fatalf("hub holds %d sessions", hub.Sessions())
	}
}

func TestTwoReplicasServeTheirOwnDevices(t *testing.T) {
	e := newEnv(t)
	hubA := startHub(t, e, devicehub.Config{Instance: "hub-a"})
	hubB := startHub(t, e, devicehub.Config{Instance: "hub-b"})
	macA, macB := "aa:bb:cc:00:0a:01", "aa:bb:cc:00:0b:01"
	wA, wB := watch(t, e, testTenant, canonical(t, macA)), watch(t, e, testTenant, canonical(t, macB))
	dA := connect(t, hubA, macA, nil)
	dB := connect(t, hubB, macB, nil)
	if ev := wA.nextKind(wire.DeviceOnline); ev.Hub != "hub-a" {
		t.Fatalf("device A announced by %s", ev.Hub)
	}
	if ev := wB.nextKind(wire.DeviceOnline); ev.Hub != "hub-b" {
		t.Fatalf("device B announced by %s", ev.Hub)
	}
	decodeResponse(t, rpc(t, e.nc, testTenant, canonical(t, macA), callBody("self.audio_speaker.set_volume", `{"volume":11}`), 5*time.Second))
	decodeResponse(t, rpc(t, e.nc, testTenant, canonical(t, macB), callBody("self.audio_speaker.set_volume", `{"volume":22}`), 5*time.Second))
	if dA.Volume() != 11 || dB.Volume() != 22 {
		t.Fatalf("volumes %d, %d", dA.Volume(), dB.Volume())
	}

	// Device A moves to hub B: hub A closes its older session.
	oldSession := dA.SessionID()
	dA2 := connect(t, hubB, macA, nil)
	eventually.Closed(t, dA.Done(), "session on hub A closed after the device reconnected to hub B")
	// Hub A announces the end after dropping its subscription; hub B
	// announces the new session after taking its own.
	var sawOffline, sawOnline bool
	for !sawOffline || !sawOnline {
		switch ev := wA.next(); {
		case ev.Kind == wire.DeviceOffline && ev.SessionID == oldSession && ev.Hub == "hub-a":
			sawOffline = true
		case ev.Kind == wire.DeviceOnline && ev.SessionID == dA2.SessionID() && ev.Hub == "hub-b":
			sawOnline = true
		}
	}
	if hubA.Sessions() != 0 {
		t.Fatal("hub A still holds the device")
	}
	decodeResponse(t, rpc(t, e.nc, testTenant, canonical(t, macA), callBody("self.audio_speaker.set_volume", `{"volume":33}`), 5*time.Second))
	if dA2.Volume() != 33 {
		t.Fatal("call did not reach the device's session on hub B")
	}
}

func TestWrongCredentialsRefusedBeforeUpgrade(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{AuthFailures: announceEach})
	authFails := subscribeAuthFailures(t, e.nc)
	for _, tc := range []struct {
		name   string
		mutate func(*xzsim.Config)
	}{
		{"wrong token", func(c *xzsim.Config) { c.Token = "nope" }},
		{"no token", func(c *xzsim.Config) { c.Token = "" }},
		{"wrong token in query", func(c *xzsim.Config) { c.Token = "nope"; c.AuthInQuery = true }},
	} {
		d := newDevice(t, hub, "aa:bb:cc:00:00:08", tc.mutate)
		err := d.Connect(context.Background())
		var he *xzsim.HandshakeError
		if !errors.As(err, &he) || he.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: %v, want HTTP 401", tc.name, err)
		}
	}
	// A raw upgrade request: 401 and no 101, for a bad token and a bad device id.
	for _, hdr := range []map[string]string{
		{"Authorization": "Bearer nope", "Device-Id": "aa:bb:cc:00:00:08"},
		{"Authorization": "Bearer " + testToken, "Device-Id": "not a device!"},
		{"Authorization": "Bearer " + testToken},
	} {
		status, upgrade := rawUpgrade(t, hub, hdr)
		if status != http.StatusUnauthorized || upgrade != "" {
			t.Errorf("%v: HTTP %d, Upgrade %q; want 401 without upgrade", hdr, status, upgrade)
		}
	}
	if hub.Sessions() != 0 {
		t.Fatal("a refused device got a session")
	}
	// Every refusal is announced for the audit trail, without the token.
	reasons := expectAuthFailures(t, authFails, 6, wire.TransportWebSocket, "nope", testToken)
	if reasons["unauthenticated"] != 3 || reasons["invalid device id"] != 1 {
		t.Errorf("auth failure reasons %v", reasons)
	}
	// The query fallback authenticates like the headers.
	connect(t, hub, "aa:bb:cc:00:00:09", func(c *xzsim.Config) { c.AuthInQuery = true })
	eventually.True(t, "query-authenticated session", func() bool { return hub.Sessions() == 1 })
}

func TestTenantComesFromTheToken(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{})
	const mac = "aa:bb:cc:00:00:0a"
	w := watch(t, e, "acme", canonical(t, mac))
	connect(t, hub, mac, func(c *xzsim.Config) { c.Token = "tok-acme" })
	if ev := w.nextKind(wire.DeviceOnline); ev.Tenant != "acme" {
		t.Fatalf("tenant %s", ev.Tenant)
	}
	if _, err := rpcErr(e.nc, testTenant, canonical(t, mac), callBody("self.get_device_status", `{}`), time.Second); !isNoResponders(err) {
		t.Fatalf("device of tenant acme reachable as tenant dev: %v", err)
	}
}

func TestMalformedAndOversizedFramesCloseOnlyThatSession(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{MaxFrameBytes: 16 << 10})
	good := connectOnline(t, e, hub, "aa:bb:cc:00:01:01", nil)
	bad := connect(t, hub, "aa:bb:cc:00:01:02", nil)
	big := connect(t, hub, "aa:bb:cc:00:01:03", nil)
	eventually.True(t, "three sessions", func() bool { return hub.Sessions() == 3 })

	ctx := context.Background()
	// Binary audio and unknown JSON types are fine.
	if err := bad.SendBinary(ctx, make([]byte, 300)); err != nil {
		t.Fatal(err)
	}
	if err := bad.SendText(ctx, []byte(`{"session_id":"x","type":"abort","reason":"wake_word_detected"}`)); err != nil {
		t.Fatal(err)
	}
	if err := bad.SendText(ctx, []byte(`{"type":"hello",`)); err != nil {
		t.Fatal(err)
	}
	eventually.Closed(t, bad.Done(), "session with a malformed frame closed")
	if got := bad.CloseStatus(); got != websocket.StatusInvalidFramePayloadData {
		t.Errorf("malformed frame: close status %v", got)
	}
	_ = big.SendText(ctx, []byte(`{"type":"mcp","payload":"`+strings.Repeat("x", 20<<10)+`"}`))
	eventually.Closed(t, big.Done(), "session with an oversized frame closed")
	if got := big.CloseStatus(); got != websocket.StatusMessageTooBig {
		t.Errorf("oversized frame: close status %v", got)
	}

	eventually.True(t, "only the good session left", func() bool { return hub.Sessions() == 1 })
	decodeResponse(t, rpc(t, e.nc, testTenant, canonical(t, good.MAC()), callBody("self.audio_speaker.set_volume", `{"volume":5}`), 5*time.Second))
	if good.Volume() != 5 {
		t.Fatal("the good device stopped working")
	}
}

func TestRequestDeadlineHonoured(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{CallTimeout: time.Minute})
	const mac = "aa:bb:cc:00:00:0b"
	dev := canonical(t, mac)
	d := connectOnline(t, e, hub, mac, nil)
	release := d.Hold()
	defer release()

	start := time.Now()
	m := rpc(t, e.nc, testTenant, dev, callBody("self.get_device_status", `{}`), 300*time.Millisecond)
	if f := fault(t, m); f.Code != wire.FaultTimeout {
		t.Fatalf("fault %+v, want TIMEOUT", f)
	}
	t.Logf("TIMEOUT after %v for a 300ms caller deadline", time.Since(start))
	// The late reply is dropped and the session keeps working.
	release()
	decodeResponse(t, rpc(t, e.nc, testTenant, dev, callBody("self.get_device_status", `{}`), 5*time.Second))
}

func TestBusyCap(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{MaxInFlight: 3})
	const mac = "aa:bb:cc:00:00:0c"
	dev := canonical(t, mac)
	w := watch(t, e, testTenant, dev)
	d := connect(t, hub, mac, nil)
	w.nextKind(wire.DeviceOnline) // discovery's own calls are done
	release := d.Hold()
	replies := make(chan *wireReply, 3)
	for range 3 {
		go func() {
			m, err := rpcErr(e.nc, testTenant, dev, callBody("self.get_device_status", `{}`), 10*time.Second)
			replies <- &wireReply{m, err}
		}()
	}
	eventually.True(t, "three calls in flight", func() bool { return d.Held() == 3 })
	if f := fault(t, rpc(t, e.nc, testTenant, dev, callBody("self.get_device_status", `{}`), 5*time.Second)); f.Code != wire.FaultBusy {
		t.Fatalf("fourth call: %+v, want BUSY", f)
	}
	release()
	for range 3 {
		r := <-replies
		if r.err != nil {
			t.Fatal(r.err)
		}
		decodeResponse(t, r.msg)
	}
}

func TestInvalidAndOversizedRequests(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{MaxFrameBytes: 4 << 10})
	const mac = "aa:bb:cc:00:00:0d"
	dev := canonical(t, mac)
	d := connectOnline(t, e, hub, mac, nil)
	for body, code := range map[string]string{
		`not json`:                             wire.FaultInvalidRequest,
		`{"params":{}}`:                        wire.FaultInvalidRequest,
		`{"method":"tools/call","params":[1]}`: wire.FaultInvalidRequest,
		callBody("self.get_device_status", `{"pad":"`+strings.Repeat("x", 5<<10)+`"}`): wire.FaultTooLarge,
	} {
		if f := fault(t, rpc(t, e.nc, testTenant, dev, body, 5*time.Second)); f.Code != code {
			t.Errorf("%.40s: %+v, want %s", body, f, code)
		}
	}
	if d.Calls() != 0 {
		t.Fatal("an invalid request reached the device")
	}
	decodeResponse(t, rpc(t, e.nc, testTenant, dev, callBody("self.get_device_status", `{}`), 5*time.Second))
}

func TestNotificationsPublished(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{})
	const mac = "aa:bb:cc:00:00:0e"
	w := watch(t, e, testTenant, canonical(t, mac))
	d := connect(t, hub, mac, nil)
	online := w.nextKind(wire.DeviceOnline)
	if err := d.Notify(context.Background(), "notifications/state_changed", json.RawMessage(`{"newState":"listening"}`)); err != nil {
		t.Fatal(err)
	}
	ev := w.nextKind(wire.DeviceNotification)
	var n struct {
		Method string
		Params struct{ NewState string }
	}
	if err := json.Unmarshal(ev.Notification, &n); err != nil || n.Method != "notifications/state_changed" || n.Params.NewState != "listening" {
		t.Fatalf("notification %s", ev.Notification)
	}
	if ev.SessionID != online.SessionID {
		t.Fatalf("notification of session %s, online %s", ev.SessionID, online.SessionID)
	}
}

func TestResyncRepublishesOnline(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{})
	const mac = "aa:bb:cc:00:00:0f"
	w := watch(t, e, testTenant, canonical(t, mac))
	connect(t, hub, mac, func(c *xzsim.Config) { c.ExtraTools = 40 })
	first := w.nextKind(wire.DeviceOnline)
	if err := e.nc.Publish(wire.SubjectHubResync, nil); err != nil {
		t.Fatal(err)
	}
	again := w.nextKind(wire.DeviceOnline)
	if again.SessionID != first.SessionID || string(again.Tools) != string(first.Tools) || string(again.Hello) != string(first.Hello) {
		t.Fatalf("resync online differs: %+v", again)
	}
}

func TestIdleAndHelloTimeouts(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{IdleTimeout: 300 * time.Millisecond, HelloTimeout: 300 * time.Millisecond})
	const mac = "aa:bb:cc:00:00:10"
	w := watch(t, e, testTenant, canonical(t, mac))
	d := connect(t, hub, mac, nil)
	w.nextKind(wire.DeviceOnline)
	eventually.Closed(t, d.Done(), "idle session closed")
	if off := w.nextKind(wire.DeviceOffline); !strings.Contains(off.Reason, "idle") {
		t.Fatalf("offline reason %q", off.Reason)
	}

	ws := dialRaw(t, hub, "silent-1", testToken) // never says hello
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if _, _, err := ws.Read(ctx); err == nil || ctx.Err() != nil {
		t.Fatalf("connection without hello not closed: %v", err)
	}
}

func TestShutdownEndsSessions(t *testing.T) {
	e := newEnv(t)
	nc, err := e.ns.Connect("hub")
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	svc, err := devicehub.New(devicehub.Config{DeviceAddr: "127.0.0.1:0", Auth: deviceAuth()}, nc, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	<-svc.Ready()
	const mac = "aa:bb:cc:00:00:11"
	w := watch(t, e, testTenant, canonical(t, mac))
	d := connect(t, svc, mac, nil)
	w.nextKind(wire.DeviceOnline)
	release := d.Hold()
	defer release()
	pending := make(chan *wireReply, 1)
	go func() {
		m, err := rpcErr(e.nc, testTenant, canonical(t, mac), callBody("self.get_device_status", `{}`), time.Minute)
		pending <- &wireReply{m, err}
	}()
	eventually.True(t, "call held", func() bool { return d.Held() == 1 })
	cancel()
	if r := <-pending; r.err != nil || fault(t, r.msg).Code != wire.FaultDisconnected {
		t.Fatalf("pending call at shutdown: %v", r.err)
	}
	if off := w.nextKind(wire.DeviceOffline); off.Reason == "" {
		t.Fatal("offline event without reason")
	}
	eventually.Closed(t, d.Done(), "device connection closed at shutdown")
	if got := d.CloseStatus(); got != websocket.StatusGoingAway {
		t.Errorf("close status %v, want going away", got)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(waitLimit):
		t.Fatal("Run did not return")
	}
}

func TestDirectCall(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{})
	const mac = "aa:bb:cc:00:00:12"
	d := connectOnline(t, e, hub, mac, nil)
	raw, err := hub.Call(context.Background(), testTenant, canonical(t, mac), []byte(callBody("self.screen.set_theme", `{"theme":"dark"}`)))
	if err != nil || !strings.Contains(string(raw), `"text":"true"`) || d.Theme() != "dark" {
		t.Fatalf("direct call: %s, %v, theme %s", raw, err, d.Theme())
	}
	_, err = hub.Call(context.Background(), testTenant, "nobody", []byte(callBody("x", `{}`)))
	var f *wire.Fault
	if !errors.As(err, &f) || f.Code != wire.FaultNotConnected {
		t.Fatalf("call to unknown device: %v", err)
	}
}

func TestConfigValidation(t *testing.T) {
	if err := (devicehub.Config{}).Validate(); err == nil || !strings.Contains(err.Error(), "Auth") {
		t.Fatalf("missing Auth: %v", err)
	}
	if err := (devicehub.Config{Auth: deviceAuth(), MaxFrameBytes: 10}).Validate(); err == nil {
		t.Fatal("tiny MaxFrameBytes accepted")
	}
	if err := (devicehub.Config{Auth: deviceAuth(), DeviceAddr: "nonsense"}).Validate(); err == nil {
		t.Fatal("bad DeviceAddr accepted")
	}
	if err := (devicehub.Config{Auth: deviceAuth()}).Validate(); err != nil {
		t.Fatal(err)
	}
}

// dialRaw opens a WebSocket with the given device id and token, without a hello.
func dialRaw(t *testing.T, svc *devicehub.Service, deviceID, token string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, wsURL(svc), &websocket.DialOptions{HTTPHeader: http.Header{
		"Authorization": {"Bearer " + token}, "Device-Id": {deviceID},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.CloseNow() })
	return ws
}

func writeText(t *testing.T, ws *websocket.Conn, s string) {
	t.Helper()
	if err := ws.Write(context.Background(), websocket.MessageText, []byte(s)); err != nil {
		t.Fatal(err)
	}
}

func readText(t *testing.T, ws *websocket.Conn) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	_, b, err := ws.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// rawUpgrade sends a WebSocket upgrade request by hand and returns the
// status and Upgrade header of the answer.
func rawUpgrade(t *testing.T, svc *devicehub.Service, hdr map[string]string) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", svc.DeviceAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := "GET /xiaozhi/v1/ HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
	for k, v := range hdr {
		req += fmt.Sprintf("%s: %s\r\n", k, v)
	}
	if _, err := c.Write([]byte(req + "\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Upgrade")
}

// A client may send its hello in the same packet as the upgrade request;
// those bytes arrive buffered in net/http and must not be lost.
func TestHelloPipelinedWithUpgradeRequest(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{})
	c, err := net.Dial("tcp", hub.DeviceAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := "GET /xiaozhi/v1/ HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n" +
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n" +
		"Authorization: Bearer " + testToken + "\r\nDevice-Id: pipelined-1\r\n\r\n"
	hello := []byte(`{"type":"hello","version":1,"transport":"websocket"}`)
	frame := []byte{0x81, 0x80 | byte(len(hello)), 1, 2, 3, 4}
	for i, b := range hello {
		frame = append(frame, b^[]byte{1, 2, 3, 4}[i%4])
	}
	if _, err := c.Write(append([]byte(req), frame...)); err != nil {
		t.Fatal(err)
	}
	if err := c.SetReadDeadline(time.Now().Add(waitLimit)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	var hdr [2]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		t.Fatal(err)
	}
	n := int(hdr[1] & 0x7f)
	if n == 126 {
		var ext [2]byte
		if _, err := io.ReadFull(br, ext[:]); err != nil {
			t.Fatal(err)
		}
		n = int(ext[0])<<8 | int(ext[1])
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(br, payload); err != nil {
		t.Fatal(err)
	}
	if hdr[0] != 0x81 || !strings.Contains(string(payload), `"type":"hello"`) {
		t.Fatalf("first frame %x %s, want the server hello", hdr, payload)
	}
}

func TestSlowConsumerClosed(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{WriteTimeout: 300 * time.Millisecond, CallTimeout: time.Minute})
	w := watch(t, e, testTenant, "slow-1")
	ws := dialRaw(t, hub, "slow-1", testToken)
	writeText(t, ws, `{"type":"hello","version":1,"transport":"websocket"}`)
	readText(t, ws) // the server hello; after it this device reads nothing more
	w.nextKind(wire.DeviceOnline)

	// Large requests fill the socket buffers; then writes stall.
	body := callBody("x", `{"pad":"`+strings.Repeat("p", 100<<10)+`"}`)
	const calls = 60
	replies := make(chan *wireReply, calls)
	for range calls {
		go func() {
			m, err := rpcErr(e.nc, testTenant, "slow-1", body, time.Minute)
			replies <- &wireReply{m, err}
		}()
	}
	off := w.nextKind(wire.DeviceOffline)
	if !strings.Contains(off.Reason, "slow consumer") {
		t.Fatalf("offline reason %q", off.Reason)
	}
	for range calls {
		r := <-replies
		if r.err != nil && !isNoResponders(r.err) {
			t.Fatal(r.err)
		}
		if r.err == nil {
			if f := fault(t, r.msg); f.Code != wire.FaultDisconnected {
				t.Fatalf("call to a slow consumer: %+v", f)
			}
		}
	}
}

// subscribeAuthFailures collects the devicehub's device auth failure
// announcements.
func subscribeAuthFailures(t *testing.T, nc *nats.Conn) chan *nats.Msg {
	t.Helper()
	ch := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(wire.SubjectDeviceAuthFailure, ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return ch
}

// expectAuthFailures waits for n announcements of transport, checks that
// none holds any of secrets, and counts them by reason.
// announceEach makes a hub announce every refusal on its own (no folding
// per interval), for tests of the announcements' content.
var announceEach = authguard.Config{SummaryInterval: time.Nanosecond}

func expectAuthFailures(t *testing.T, ch chan *nats.Msg, n int, transport string, secrets ...string) map[string]int {
	t.Helper()
	reasons := map[string]int{}
	deadline := time.After(waitLimit)
	for i := 0; i < n; {
		select {
		case m := <-ch:
			for _, s := range secrets {
				if s != "" && strings.Contains(string(m.Data), s) {
					t.Fatalf("auth failure announcement holds a credential: %s", m.Data)
				}
			}
			var f wire.DeviceAuthFailure
			if err := json.Unmarshal(m.Data, &f); err != nil || f.Transport != transport || f.Hub == "" || f.RemoteIP == "" || f.AtMs == 0 {
				t.Fatalf("auth failure announcement %s (%v)", m.Data, err)
			}
			reasons[f.Reason] += max(f.Count, 1)
			i += max(f.Count, 1)
		case <-deadline:
			t.Fatalf("%d of %d auth failure announcements", i, n)
		}
	}
	return reasons
}

// An MCP session is announced connecting (without a catalog) once the
// device is initialized, online once its tools are listed, and offline if
// it ends in between.
func TestConnectingUntilToolsListed(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{})
	const mac = "aa:bb:cc:00:00:31"
	w := watch(t, e, testTenant, canonical(t, mac))
	d := newDevice(t, hub, mac, nil)
	release := d.HoldToolsList()
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := d.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	ev := w.next()
	if ev.Kind != wire.DeviceConnecting || ev.SessionID != d.SessionID() || !ev.MCP || len(ev.Tools) != 0 || len(ev.ServerInfo) == 0 || len(ev.Hello) == 0 {
		t.Fatalf("first event %+v, want connecting of %s with server info, without a catalog", ev, d.SessionID())
	}
	eventually.True(t, "tools/list asked", func() bool { return d.Requests("tools/list") == 1 })
	select {
	case m := <-w.ch:
		t.Fatalf("event before the device listed its tools: %s", m.Data)
	default:
	}
	release()
	ev = w.next()
	if ev.Kind != wire.DeviceOnline || ev.SessionID != d.SessionID() || len(toolNames(t, ev.Tools)) == 0 || len(ev.ServerInfo) == 0 {
		t.Fatalf("event after listing %+v, want online with the catalog", ev)
	}

	// A session that ends while listing goes offline.
	const mac2 = "aa:bb:cc:00:00:32"
	w2 := watch(t, e, testTenant, canonical(t, mac2))
	d2 := newDevice(t, hub, mac2, nil)
	release2 := d2.HoldToolsList()
	defer release2()
	if err := d2.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	if ev := w2.next(); ev.Kind != wire.DeviceConnecting {
		t.Fatalf("first event %+v, want connecting", ev)
	}
	eventually.True(t, "tools/list asked", func() bool { return d2.Requests("tools/list") == 1 })
	_ = d2.Close()
	if ev := w2.next(); ev.Kind != wire.DeviceOffline || ev.SessionID != d2.SessionID() {
		t.Fatalf("event after the device left %+v, want offline", ev)
	}
}

// A device that never answers tools/list goes online without a catalog
// (unknown, not empty), so the registry keeps the node's last one.
func TestOnlineWithoutCatalogWhenListingFails(t *testing.T) {
	e := newEnv(t)
	hub := startHub(t, e, devicehub.Config{CallTimeout: 200 * time.Millisecond})
	const mac = "aa:bb:cc:00:00:33"
	w := watch(t, e, testTenant, canonical(t, mac))
	d := newDevice(t, hub, mac, nil)
	release := d.HoldToolsList()
	defer release()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := d.Connect(ctx); err != nil {
		t.Fatal(err)
	}
	ev := w.nextKind(wire.DeviceOnline)
	if ev.SessionID != d.SessionID() || !ev.MCP || ev.Tools != nil || len(ev.ServerInfo) == 0 {
		t.Fatalf("online after a failed listing: %+v, want server info and no tools", ev)
	}
}
