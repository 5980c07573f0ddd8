package upstream

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/xiaoclaw/xiaoclaw/pkg/eventually"
	"github.com/xiaoclaw/xiaoclaw/pkg/occlient"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

type fakeInvoker struct {
	mu    sync.Mutex
	calls []Call
	fault *wire.Fault
}

func (f *fakeInvoker) Invoke(_ context.Context, c Call) (json.RawMessage, *wire.Fault) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, c)
	if f.fault != nil {
		return nil, f.fault
	}
	return json.RawMessage(`{"content":[{"type":"text","text":"ok"}],"isError":false}`), nil
}

func (f *fakeInvoker) last() (Call, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) == 0 {
		return Call{}, 0
	}
	return f.calls[len(f.calls)-1], len(f.calls)
}

// linkToken is the upstream token the links of these tests present.
const linkToken = "upstream-secret"

// fastTiming keeps tests short; each test overrides what it exercises.
var fastTiming = Timing{ConnectTimeout: 2 * time.Second, BackoffMin: 10 * time.Millisecond,
	BackoffMax: 40 * time.Millisecond, AuthRetry: time.Hour, StableAfter: time.Hour}

func startLink(t *testing.T, gw *fakeGateway, timing Timing, inv Invoker) *link {
	t.Helper()
	l := newLink(linkConfig{
		upstream: Upstream{Name: "home", Tenant: "acme", URL: gw.url(), Token: linkToken},
		node:     Node{NodeID: "xz-aabbccddeeff", DisplayName: "Kitchen speaker", Version: "1.6.0", DeviceFamily: "ESP32-S3"},
		identity: occlient.NewIdentity(), invoker: inv, timing: timing, log: slog.New(slog.DiscardHandler),
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("link did not stop after cancel")
		}
	})
	return l
}

func waitState(t *testing.T, l *link, want State) Status {
	t.Helper()
	var st Status
	if !eventually.Until(eventually.Limit, func() bool { st = l.Status(); return st.State == want }) {
		t.Fatalf("state %s (last error %q), want %s", st.State, st.LastError, want)
	}
	return st
}

func TestLinkConnectsAsNodeHostAndServesInvokes(t *testing.T) {
	gw := newFakeGateway(t)
	inv := &fakeInvoker{}
	l := startLink(t, gw, fastTiming, inv)
	c := gw.next(t)
	st := waitState(t, l, StateOnline)

	p := c.params
	if p.Role != "node" || p.Client.ID != "node-host" || p.Client.Mode != "node" || p.Client.Platform != Platform ||
		p.Client.DisplayName != "Kitchen speaker" || p.Client.DeviceFamily != "ESP32-S3" || p.Client.Version != "1.6.0" {
		t.Fatalf("connect claims: %+v", p)
	}
	if p.MinProtocol != 4 || p.MaxProtocol != 4 || len(p.Scopes) != 0 {
		t.Fatalf("protocol %d..%d scopes %v", p.MinProtocol, p.MaxProtocol, p.Scopes)
	}
	if strings.Join(p.Caps, ",") != "mcp" || strings.Join(p.Commands, ",") != strings.Join(Commands, ",") {
		t.Fatalf("caps %v commands %v", p.Caps, p.Commands)
	}
	if st.DeviceID != p.Device.ID {
		t.Fatalf("status device id %s, connected as %s", st.DeviceID, p.Device.ID)
	}

	// A tool call: forwarded with the xiaoclaw node id, answered with the
	// device id as nodeId and the payload as a JSON string.
	c.send(t, "node.invoke.request", map[string]any{"id": "inv-1", "nodeId": p.Device.ID, "command": "mcp.tools.call",
		"paramsJSON": `{"name":"self.audio_speaker.set_volume","arguments":{"volume":30}}`, "timeoutMs": 5000, "idempotencyKey": "k1"})
	var res invokeResult
	_ = json.Unmarshal(c.request(t, "node.invoke.result"), &res)
	if res.ID != "inv-1" || res.NodeID != p.Device.ID || !res.OK || !strings.Contains(res.PayloadJSON, `"text":"ok"`) {
		t.Fatalf("result %+v", res)
	}
	call, _ := inv.last()
	if call.NodeID != "xz-aabbccddeeff" || call.Command != "mcp.tools.call" || call.Upstream != "home" ||
		call.IdempotencyKey != "k1" || !strings.Contains(string(call.Params), "set_volume") {
		t.Fatalf("forwarded call %+v", call)
	}

	// paramsJSON null, as OpenClaw sends absent params.
	c.send(t, "node.invoke.request", map[string]any{"id": "inv-2", "nodeId": p.Device.ID, "command": "mcp.tools.list",
		"paramsJSON": nil, "idempotencyKey": "k2"})
	res = invokeResult{}
	_ = json.Unmarshal(c.request(t, "node.invoke.result"), &res)
	if res.ID != "inv-2" || !res.OK {
		t.Fatalf("result %+v", res)
	}
	if call, _ := inv.last(); call.Params != nil || call.Command != "mcp.tools.list" {
		t.Fatalf("forwarded call %+v", call)
	}

	// An undeclared command never reaches xiaoclaw.
	_, before := inv.last()
	c.send(t, "node.invoke.request", map[string]any{"id": "inv-3", "nodeId": p.Device.ID, "command": "system.run",
		"paramsJSON": `{"command":["id"]}`, "idempotencyKey": "k3"})
	res = invokeResult{}
	_ = json.Unmarshal(c.request(t, "node.invoke.result"), &res)
	if res.OK || res.Error == nil || res.Error.Code != "UNAVAILABLE" || res.Error.Message != "command not supported" {
		t.Fatalf("result %+v", res)
	}
	if _, after := inv.last(); after != before {
		t.Fatal("an undeclared command was forwarded")
	}

	// A refusal of xiaoclaw (policy) goes back as the node's error.
	inv.mu.Lock()
	inv.fault = &wire.Fault{Code: "POLICY_DENIED", Message: "denied by policy rule rul_x"}
	inv.mu.Unlock()
	c.send(t, "node.invoke.request", map[string]any{"id": "inv-4", "nodeId": p.Device.ID, "command": "mcp.tools.call",
		"paramsJSON": `{"name":"self.reboot","arguments":{}}`, "idempotencyKey": "k4"})
	res = invokeResult{}
	_ = json.Unmarshal(c.request(t, "node.invoke.result"), &res)
	if res.OK || res.Error == nil || res.Error.Code != "POLICY_DENIED" || !strings.Contains(res.Error.Message, "rul_x") {
		t.Fatalf("result %+v", res)
	}

	// Device events go up as node.event.
	l.sendEvent(wire.EventMCPNotification, json.RawMessage(`{"method":"notifications/x"}`))
	var ev struct {
		Event       string `json:"event"`
		PayloadJSON string `json:"payloadJSON"`
	}
	_ = json.Unmarshal(c.request(t, "node.event"), &ev)
	if ev.Event != wire.EventMCPNotification || ev.PayloadJSON != `{"method":"notifications/x"}` {
		t.Fatalf("node.event %+v", ev)
	}
}

func TestLinkClosesDeadLinkAfterTwoTicksAndReconnects(t *testing.T) {
	gw := newFakeGateway(t)
	gw.tickMs = 40 // and no ticks are sent
	l := startLink(t, gw, fastTiming, &fakeInvoker{})
	first := gw.next(t)
	waitState(t, l, StateOnline)
	if code := first.closeStatus(t); code != 4000 {
		t.Fatalf("close status %d, want 4000 tick timeout", code)
	}
	gw.next(t) // reconnected
	waitState(t, l, StateOnline)
}

func TestLinkKeepsLiveLinkWithTicks(t *testing.T) {
	gw := newFakeGateway(t)
	gw.tickMs, gw.sendTicks = 100, true
	l := startLink(t, gw, fastTiming, &fakeInvoker{})
	c := gw.next(t)
	waitState(t, l, StateOnline)
	// Ten tick intervals with ticks arriving: the link must stay up. A
	// dead-link close would show on the server within 2 intervals.
	select {
	case code := <-c.closed:
		t.Fatalf("live link closed with %d", code)
	case <-time.After(10 * 100 * time.Millisecond):
	}
	if n := gw.connectCount(); n != 1 {
		t.Fatalf("%d connects, want 1", n)
	}
}

func TestLinkFallsBackToProtocol3(t *testing.T) {
	gw := newFakeGateway(t)
	gw.refuse = func(_ int, p connectParams) *gwError {
		if p.MinProtocol > 3 {
			return &gwError{Code: "INVALID_REQUEST", Message: "protocol mismatch",
				Details: map[string]any{"code": "PROTOCOL_MISMATCH", "expectedProtocol": 3}}
		}
		return nil
	}
	l := startLink(t, gw, fastTiming, &fakeInvoker{})
	c := gw.next(t)
	waitState(t, l, StateOnline)
	if c.params.MinProtocol != 3 || c.params.MaxProtocol != 3 || c.params.Client.DeviceFamily != "" {
		t.Fatalf("fallback connect: protocol %d..%d family %q", c.params.MinProtocol, c.params.MaxProtocol, c.params.Client.DeviceFamily)
	}
}

func TestLinkWaitsInPairingUntilApproved(t *testing.T) {
	gw := newFakeGateway(t)
	var mu sync.Mutex
	isApproved := false
	gw.refuse = func(int, connectParams) *gwError {
		mu.Lock()
		defer mu.Unlock()
		if !isApproved {
			return &gwError{Code: "NOT_PAIRED", Message: "pairing required",
				Details: map[string]any{"code": "PAIRING_REQUIRED", "requestId": "req-42", "reason": "not-paired"}}
		}
		return nil
	}
	timing := fastTiming
	timing.BackoffMin, timing.BackoffMax = 5*time.Millisecond, 20*time.Millisecond
	l := startLink(t, gw, timing, &fakeInvoker{})
	st := waitState(t, l, StatePairing)
	if st.RequestID != "req-42" || !strings.Contains(st.LastError, "pairing required") {
		t.Fatalf("pairing status %+v", st)
	}
	// It keeps asking (with backoff) while it waits.
	eventually.Within(t, 5*time.Second, "3 connects while pairing", func() bool { return gw.connectCount() >= 3 })
	mu.Lock()
	isApproved = true
	mu.Unlock()
	gw.next(t)
	if st := waitState(t, l, StateOnline); st.RequestID != "" || st.LastError != "" {
		t.Fatalf("online status keeps the pairing facts: %+v", st)
	}
}

func TestLinkWrongTokenIsDisabledAndDoesNotSpin(t *testing.T) {
	gw := newFakeGateway(t)
	gw.token = "the-right-one"
	l := startLink(t, gw, fastTiming, &fakeInvoker{})
	st := waitState(t, l, StateDisabled)
	if !strings.Contains(st.LastError, "token mismatch") {
		t.Fatalf("disabled status %+v", st)
	}
	if strings.Contains(st.LastError, linkToken) {
		t.Fatal("the status shows the token")
	}
	// An observation window of 20 × BackoffMax (no event to await): a
	// spinning link would have reconnected many times in it.
	time.Sleep(20 * fastTiming.BackoffMax)
	if n := gw.connectCount(); n != 1 {
		t.Fatalf("%d connects after an auth refusal, want 1", n)
	}
}

func TestLinkReconnectsPromptlyAfterShutdown(t *testing.T) {
	gw := newFakeGateway(t)
	timing := fastTiming
	// A drop would wait at least an hour; a restart announcement must not.
	timing.BackoffMin, timing.BackoffMax = time.Hour, time.Hour
	timing.StableAfter = time.Millisecond
	l := startLink(t, gw, timing, &fakeInvoker{})
	c := gw.next(t)
	waitState(t, l, StateOnline)
	c.send(t, "shutdown", map[string]any{"reason": "restart", "restartExpectedMs": 100})
	c.ws.Close(websocket.StatusServiceRestart, "service restart")
	gw.next(t)
	waitState(t, l, StateOnline)
}

func TestLinkBacksOffWhenGatewayIsDown(t *testing.T) {
	gw := newFakeGateway(t)
	url := gw.url()
	gw.srv.Close() // nothing listens
	l := newLink(linkConfig{
		upstream: Upstream{Name: "home", Tenant: "acme", URL: url, Token: "x"},
		node:     Node{NodeID: "xz-aabbccddeeff"}, identity: occlient.NewIdentity(), invoker: &fakeInvoker{},
		timing: Timing{ConnectTimeout: time.Second, BackoffMin: time.Hour, BackoffMax: time.Hour},
		log:    slog.New(slog.DiscardHandler),
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.run(ctx) }()
	st := waitState(t, l, StateBackoff)
	if !strings.Contains(st.LastError, "refused") {
		t.Fatalf("backoff with the error %q, want the refused connection", st.LastError)
	}
	// Cancel during the (hour-long) backoff ends the link at once.
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("cancel did not end the link in backoff")
	}
}

func TestBackoffBounds(t *testing.T) {
	for _, r := range []float64{0, 0.5, 0.9999} {
		b := backoff{min: time.Second, max: 30 * time.Second, rand: func() float64 { return r }}
		prev := time.Duration(0)
		for attempt := range 12 {
			d := b.delay(attempt)
			if d < time.Second || d > 30*time.Second {
				t.Fatalf("rand %v attempt %d: delay %s outside [1s, 30s]", r, attempt, d)
			}
			if d < prev {
				t.Fatalf("rand %v attempt %d: delay %s shrank from %s", r, attempt, d, prev)
			}
			prev = d
		}
		if d := b.delay(20); r == 0.9999 && d != 30*time.Second {
			t.Fatalf("cap: %s", d)
		}
	}
	b := backoff{min: time.Second, max: 30 * time.Second, rand: func() float64 { return 0.5 }}
	for attempt, want := range []time.Duration{1, 2, 4, 8, 16, 30, 30} {
		if d := b.delay(attempt); d != want*time.Second {
			t.Fatalf("attempt %d: %s, want %ds", attempt, d, want)
		}
	}
}

func TestLinkGivesUpAConnectAfterTheTimeout(t *testing.T) {
	gw := newFakeGateway(t)
	gw.silent = true
	timing := fastTiming
	timing.ConnectTimeout = 100 * time.Millisecond
	l := startLink(t, gw, timing, &fakeInvoker{})
	st := waitState(t, l, StateBackoff)
	if !strings.Contains(st.LastError, "connect timed out after 100ms") {
		t.Fatalf("status %+v", st)
	}
	// And it tries again.
	eventually.Within(t, 5*time.Second, "a second connect", func() bool { return gw.connectCount() >= 2 })
}

// blockingInvoker holds every call until release is closed.
type blockingInvoker struct {
	started chan struct{}
	release chan struct{}
}

func (b *blockingInvoker) Invoke(ctx context.Context, _ Call) (json.RawMessage, *wire.Fault) {
	b.started <- struct{}{}
	select {
	case <-b.release:
		return json.RawMessage(`{}`), nil
	case <-ctx.Done():
		return nil, &wire.Fault{Code: wire.FaultTimeout, Message: "timed out"}
	}
}

func TestLinkBoundsCallsInFlight(t *testing.T) {
	gw := newFakeGateway(t)
	inv := &blockingInvoker{started: make(chan struct{}, 64), release: make(chan struct{})}
	l := startLink(t, gw, fastTiming, inv)
	c := gw.next(t)
	waitState(t, l, StateOnline)
	for i := range maxInflightPerLink {
		c.send(t, "node.invoke.request", map[string]any{"id": fmt.Sprint("held-", i), "nodeId": c.params.Device.ID,
			"command": "mcp.tools.list", "paramsJSON": nil, "timeoutMs": 10000, "idempotencyKey": fmt.Sprint(i)})
	}
	for range maxInflightPerLink {
		<-inv.started
	}
	c.send(t, "node.invoke.request", map[string]any{"id": "over", "nodeId": c.params.Device.ID,
		"command": "mcp.tools.list", "paramsJSON": nil, "timeoutMs": 10000, "idempotencyKey": "over"})
	var res invokeResult
	_ = json.Unmarshal(c.request(t, "node.invoke.result"), &res)
	if res.ID != "over" || res.OK || res.Error == nil || res.Error.Code != "UNAVAILABLE" {
		t.Fatalf("call over the bound: %+v", res)
	}
	close(inv.release)
	for range maxInflightPerLink {
		res = invokeResult{}
		_ = json.Unmarshal(c.request(t, "node.invoke.result"), &res)
		if !res.OK {
			t.Fatalf("held call: %+v", res)
		}
	}
}

func TestLinksOfOneUpstreamBoundTheirHandshakes(t *testing.T) {
	gw := newFakeGateway(t)
	// Every handshake lasts 50 ms, then the gateway closes the socket.
	gw.silent, gw.holdFor = true, 50*time.Millisecond
	timing := fastTiming
	timing.ConnectTimeout = 10 * time.Second
	slots := newHandshakeSlots()
	const links = 3 * handshakeSlots
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range links {
		l := newLink(linkConfig{
			upstream: Upstream{Name: "home", Tenant: "acme", URL: gw.url(), Token: linkToken},
			node:     Node{NodeID: fmt.Sprintf("xz-%012x", i)}, identity: occlient.NewIdentity(), invoker: &fakeInvoker{},
			timing: timing, log: slog.New(slog.DiscardHandler), handshakes: slots,
		})
		wg.Add(1)
		l.start(ctx, wg.Done)
	}
	// Every link gets its turns, never more than the bound at once (the
	// upstream would turn the others away).
	eventually.True(t, "every link dialed", func() bool { return gw.connectCount() >= links })
	cancel()
	wg.Wait()
	gw.mu.Lock()
	defer gw.mu.Unlock()
	if gw.maxOpen > handshakeSlots {
		t.Fatalf("%d handshakes at once, bound %d", gw.maxOpen, handshakeSlots)
	}
	if gw.maxOpen < handshakeSlots/2 {
		t.Fatalf("at most %d handshakes at once: the bound is not used", gw.maxOpen)
	}
}

func TestLinkStopsACallTheUpstreamCancels(t *testing.T) {
	gw := newFakeGateway(t)
	inv := &blockingInvoker{started: make(chan struct{}, 64), release: make(chan struct{})}
	l := startLink(t, gw, fastTiming, inv)
	c := gw.next(t)
	waitState(t, l, StateOnline)
	invoke := func(id string) {
		c.send(t, "node.invoke.request", map[string]any{"id": id, "nodeId": c.params.Device.ID,
			"command": "mcp.tools.list", "paramsJSON": nil, "timeoutMs": 60000, "idempotencyKey": id})
	}
	invoke("cancelled")
	<-inv.started
	c.send(t, "node.invoke.cancel", map[string]any{"invokeId": "unknown", "nodeId": c.params.Device.ID})
	c.send(t, "node.invoke.cancel", map[string]any{"invokeId": "cancelled", "nodeId": c.params.Device.ID})
	eventually.True(t, "the cancelled call to give up its place in flight", func() bool { return l.inflight.Load() == 0 })

	// The next result the upstream hears is the next call's: the cancelled
	// one is not answered.
	close(inv.release)
	invoke("next")
	var res invokeResult
	_ = json.Unmarshal(c.request(t, "node.invoke.result"), &res)
	if res.ID != "next" || !res.OK {
		t.Fatalf("result after a cancel: %+v", res)
	}
}
