package shim_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed/natsembedtest"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/shim"
)

// waitFor bounds every wait on a condition in these tests.
const waitFor = 10 * time.Second

// xiaozhiTools is a catalog as a XiaoZhi board lists it (mcp_server.cc).
const xiaozhiTools = `[
 {"name":"self.get_device_status","description":"Provides the real-time information of the device","inputSchema":{"type":"object","properties":{}}},
 {"name":"self.audio_speaker.set_volume","description":"Set the volume of the audio speaker.","inputSchema":{"type":"object","properties":{"volume":{"type":"integer","minimum":0,"maximum":100}},"required":["volume"]}},
 {"name":"self.screen.set_theme","description":"Set the theme of the screen.","inputSchema":{"type":"object","properties":{"theme":{"type":"string"}},"required":["theme"]}},
 {"name":"self.reboot","description":"Reboot the device","inputSchema":{"type":"object","properties":{}}}
]`

const serverInfo = `{"name":"bread-compact-wifi","version":"1.9.2"}`

type env struct {
	srv *natsembed.Server
	nc  *nats.Conn // the test's own connection (gateway and devicehub side)
	kv  jetstream.KeyValue
}

func newEnv(t testing.TB) *env {
	t.Helper()
	srv := natsembedtest.Start(t)
	nc := connect(t, srv, "test")
	return &env{srv: srv, nc: nc}
}

func connect(t testing.TB, srv *natsembed.Server, name string) *nats.Conn {
	t.Helper()
	nc := natsembedtest.Connect(t, srv, name)
	return nc
}

type replica struct {
	svc    *shim.Service
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan struct{} // closed when Run returned
	err    error         // what Run returned
}

// stop cancels the replica and waits for Run to return.
func (r *replica) stop(t testing.TB) {
	t.Helper()
	r.cancel()
	select {
	case <-r.done:
		if r.err != nil {
			t.Errorf("Run returned %v", r.err)
		}
	case <-time.After(waitFor):
		t.Fatal("shim did not stop")
	}
}

// startShim runs a replica on its own connection and waits until it is ready.
func (e *env) startShim(t testing.TB, cfg shim.Config) *replica {
	t.Helper()
	nc := connect(t, e.srv, "shim")
	svc, err := shim.New(cfg, nc, slog.New(slog.NewTextHandler(logSink(), nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{svc: svc, nc: nc, cancel: cancel, done: make(chan struct{})}
	go func() {
		r.err = svc.Run(ctx)
		close(r.done)
	}()
	select {
	case <-svc.Ready():
	case <-r.done:
		t.Fatalf("shim stopped before ready: %v", r.err)
	case <-time.After(waitFor):
		t.Fatal("shim not ready")
	}
	t.Cleanup(func() { r.stop(t) })
	if e.kv == nil {
		js, err := jetstream.New(e.nc)
		if err != nil {
			t.Fatal(err)
		}
		if e.kv, err = js.KeyValue(context.Background(), wire.BucketNodes); err != nil {
			t.Fatal(err)
		}
	}
	return r
}

// publishEvent plays the devicehub announcing a device event.
func (e *env) publishEvent(t testing.TB, ev wire.DeviceEvent) {
	t.Helper()
	data, err := json.Marshal(ev)
	if err != nil {
		t.Fatal(err)
	}
	subject := wire.DeviceState(ev.Tenant, ev.Device)
	if ev.Kind == wire.DeviceNotification {
		subject = wire.DeviceNotify(ev.Tenant, ev.Device)
	}
	if err := e.nc.Publish(subject, data); err != nil {
		t.Fatal(err)
	}
}

// online is a typical online event of an MCP-speaking XiaoZhi board.
func online(tenant, device, session string, atMs int64) wire.DeviceEvent {
	return wire.DeviceEvent{
		Kind: wire.DeviceOnline, Tenant: tenant, Device: device, DeviceRaw: macOf(device),
		SessionID: session, Hub: "hub-1", Transport: wire.TransportWebSocket, AtMs: atMs,
		ClientID: "5f0e3a4c-0000-4000-8000-000000000001", RemoteIP: "192.0.2.10",
		MCP: true, ServerInfo: json.RawMessage(serverInfo), Tools: json.RawMessage(xiaozhiTools),
	}
}

func macOf(device string) string {
	if len(device) != 12 {
		return device
	}
	var b strings.Builder
	for i := 0; i < 12; i += 2 {
		if i > 0 {
			b.WriteByte(':')
		}
		b.WriteString(device[i : i+2])
	}
	return b.String()
}

// record reads a node record from the bucket; ok is false when absent.
func (e *env) record(t testing.TB, tenant, node string) (wire.NodeRecord, bool) {
	t.Helper()
	entry, err := e.kv.Get(context.Background(), wire.NodeKey(tenant, node))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return wire.NodeRecord{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	var rec wire.NodeRecord
	if err := json.Unmarshal(entry.Value(), &rec); err != nil {
		t.Fatal(err)
	}
	return rec, true
}

// waitRecord polls the bucket until cond holds for the node's record.
func (e *env) waitRecord(t testing.TB, tenant, node, what string, cond func(wire.NodeRecord) bool) wire.NodeRecord {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for {
		rec, ok := e.record(t, tenant, node)
		if ok && cond(rec) {
			return rec
		}
		if time.Now().After(deadline) {
			t.Fatalf("record %s/%s never became %s; last: %+v (present %v)", tenant, node, what, rec, ok)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// invoke sends node.invoke as the gateway does.
func (e *env) invoke(t testing.TB, tenant string, req wire.InvokeRequest, timeout time.Duration) wire.InvokeReply {
	t.Helper()
	r, err := e.tryInvoke(tenant, req, timeout)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// tryInvoke is invoke for goroutines: it reports failures instead of
// stopping the test.
func (e *env) tryInvoke(tenant string, req wire.InvokeRequest, timeout time.Duration) (wire.InvokeReply, error) {
	data, err := json.Marshal(req)
	if err != nil {
		return wire.InvokeReply{}, err
	}
	msg := &nats.Msg{Subject: wire.NodeInvoke(tenant), Header: nats.Header{}, Data: data}
	msg.Header.Set(wire.HeaderTimeout, strconv.FormatInt(timeout.Milliseconds(), 10))
	reply, err := e.nc.RequestMsg(msg, timeout+2*time.Second)
	if err != nil {
		return wire.InvokeReply{}, fmt.Errorf("node.invoke %s: %w", req.Command, err)
	}
	var r wire.InvokeReply
	if err := json.Unmarshal(reply.Data, &r); err != nil {
		return wire.InvokeReply{}, fmt.Errorf("InvokeReply %q: %w", reply.Data, err)
	}
	return r, nil
}

// events subscribes to a tenant's node events.
func (e *env) events(t testing.TB, tenant string) <-chan wire.NodeEventMsg {
	t.Helper()
	ch := make(chan wire.NodeEventMsg, 256)
	sub, err := e.nc.Subscribe(wire.NodeEvent(tenant), func(m *nats.Msg) {
		var ev wire.NodeEventMsg
		if err := json.Unmarshal(m.Data, &ev); err == nil {
			ch <- ev
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := e.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return ch
}

// nextEvent returns the next node event named name, skipping others.
func nextEvent(t testing.TB, ch <-chan wire.NodeEventMsg, name string) wire.NodeEventMsg {
	t.Helper()
	timeout := time.After(waitFor)
	for {
		select {
		case ev := <-ch:
			if ev.Event == name {
				return ev
			}
		case <-timeout:
			t.Fatalf("no %s node event", name)
		}
	}
}

// rpcRequest is what a fake device receives from the hub subject.
type rpcRequest struct {
	JSONRPC string          `json:"jsonrpc"`
	Method  string          `json:"method"`
	Params  json.RawMessage `json:"params"`
	Header  nats.Header     `json:"-"`
	Reply   string          `json:"-"`
}

// fakeDevice plays a devicehub holding a XiaoZhi board's session: it serves
// the device's rpc subject and answers as the firmware does (errors carry a
// message and no code, isError is always false).
type fakeDevice struct {
	mu       sync.Mutex
	requests []rpcRequest
	sub      *nats.Subscription
	// answer, when set, replaces the firmware behaviour.
	answer func(req rpcRequest) (data []byte, fault string)
	// hold, when set, delays every answer until it is closed.
	hold chan struct{}
}

func (e *env) fakeDevice(t testing.TB, nc *nats.Conn, tenant, device string) *fakeDevice {
	t.Helper()
	d := &fakeDevice{}
	sub, err := nc.Subscribe(wire.DeviceRPC(tenant, device), func(m *nats.Msg) {
		var req rpcRequest
		if err := json.Unmarshal(m.Data, &req); err != nil {
			t.Errorf("device got invalid JSON-RPC %q", m.Data)
			return
		}
		req.Header, req.Reply = m.Header, m.Reply
		d.mu.Lock()
		d.requests = append(d.requests, req)
		answer, hold := d.answer, d.hold
		d.mu.Unlock()
		respond := func() {
			var data []byte
			var fault string
			if answer != nil {
				data, fault = answer(req)
			} else {
				data = firmwareAnswer(req)
			}
			out := &nats.Msg{Subject: m.Reply, Data: data, Header: nats.Header{}}
			if fault != "" {
				out.Header.Set(wire.HeaderFault, fault)
			}
			_ = nc.PublishMsg(out)
		}
		if hold != nil {
			go func() { <-hold; respond() }()
			return
		}
		respond()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	d.sub = sub
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return d
}

func (d *fakeDevice) seen() []rpcRequest {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]rpcRequest(nil), d.requests...)
}

// firmwareAnswer answers like XiaoZhi firmware's McpServer (hub id 7).
func firmwareAnswer(req rpcRequest) []byte {
	result := func(r string) []byte { return []byte(`{"jsonrpc":"2.0","id":7,"result":` + r + `}`) }
	fail := func(msg string) []byte {
		b, _ := json.Marshal(msg)
		return []byte(`{"jsonrpc":"2.0","id":7,"error":{"message":` + string(b) + `}}`)
	}
	switch req.Method {
	case "initialize":
		return result(`{"protocolVersion":"2024-11-05","capabilities":{"tools":{}},"serverInfo":` + serverInfo + `}`)
	case "tools/list":
		return result(`{"tools":` + xiaozhiTools + `}`)
	case "tools/call":
		var p struct {
			Name      string         `json:"name"`
			Arguments map[string]any `json:"arguments"`
		}
		if json.Unmarshal(req.Params, &p) != nil {
			return fail("Missing params")
		}
		switch p.Name {
		case "self.get_device_status":
			return result(`{"content":[{"type":"text","text":"{\"audio_speaker\":{\"volume\":70}}"}],"isError":false}`)
		case "self.audio_speaker.set_volume":
			v, ok := p.Arguments["volume"].(float64)
			if !ok {
				return fail("Missing valid argument: volume")
			}
			if v > 100 {
				return fail("Value exceeds maximum allowed: 100")
			}
			return result(`{"content":[{"type":"text","text":"true"}],"isError":false}`)
		case "self.reboot":
			return fail("Reboot is not allowed while upgrading")
		}
		return fail("Unknown tool: " + p.Name)
	}
	return fail("Method not implemented: " + req.Method)
}

func logSink() io.Writer {
	if os.Getenv("SHIM_TEST_LOG") != "" {
		return os.Stderr
	}
	return io.Discard
}
