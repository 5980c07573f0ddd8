package telemetry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed"
	"github.com/xiaoclaw/xiaoclaw/pkg/natsembed/natsembedtest"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry/telemetrytest"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// startNATS runs an embedded server and returns a connect func.
func startNATS(t testing.TB) (*natsembed.Server, func(name string) *nats.Conn) {
	t.Helper()
	srv := natsembedtest.Start(t)
	return srv, func(name string) *nats.Conn {
		nc := natsembedtest.Connect(t, srv, name)
		return nc
	}
}

// miniSystem is the call path of xiaoclaw reduced to its tracing: a gateway
// function, a shim and a devicehub subscribed on real NATS, and a simulated
// device answering JSON-RPC, each service with its own tracer provider, wired
// the way docs/observability.md tells the services to.
type miniSystem struct {
	gwTracer trace.Tracer
	gwConn   *nats.Conn
	// deviceAnswer decides the simulated device's reply to a tools/call.
	deviceAnswer func(tool string) (result json.RawMessage, fault *wire.Fault)
}

func startMiniSystem(t testing.TB, rec *telemetrytest.Recorder, env map[string]string) *miniSystem {
	t.Helper()
	_, connect := startNATS(t)
	gw := rec.Provider(t, telemetry.ServiceGateway, env)
	shim := rec.Provider(t, telemetry.ServiceShim, env)
	hub := rec.Provider(t, telemetry.ServiceDevicehub, env)
	m := &miniSystem{gwTracer: gw.Tracer(telemetry.ScopeName), gwConn: connect("gateway")}
	m.deviceAnswer = func(string) (json.RawMessage, *wire.Fault) { return json.RawMessage(`{"ok":true}`), nil }

	// devicehub: serves every device it holds; here one, "a1b2c3d4e5f6" of tenant "acme".
	hubConn := connect("devicehub")
	hubTracer := hub.Tracer(telemetry.ScopeName)
	device := make(chan string) // the simulated device's session: tool name in, reply decided by deviceAnswer
	deviceReply := make(chan struct {
		res   json.RawMessage
		fault *wire.Fault
	})
	go func() {
		for tool := range device {
			res, fault := m.deviceAnswer(tool)
			deviceReply <- struct {
				res   json.RawMessage
				fault *wire.Fault
			}{res, fault}
		}
	}()
	t.Cleanup(func() { close(device) })
	if _, err := hubConn.Subscribe(wire.DeviceRPC("acme", "a1b2c3d4e5f6"), func(msg *nats.Msg) {
		ctx := telemetry.ExtractHeader(context.Background(), msg.Header)
		var rpc struct {
			Method string `json:"method"`
			Params struct {
				Name string `json:"name"`
			} `json:"params"`
		}
		_ = json.Unmarshal(msg.Data, &rpc)
		_, dspan := telemetry.StartDeviceCall(ctx, hubTracer, rpc.Method, wire.TransportWebSocket,
			telemetry.CallInfo{Device: "a1b2c3d4e5f6", Tool: rpc.Params.Name})
		dspan.SetRequestID(7)
		device <- rpc.Params.Name
		r := <-deviceReply
		reply := nats.NewMsg(msg.Reply)
		code := ""
		if r.fault != nil {
			code = r.fault.Code
			reply.Header.Set(wire.HeaderFault, code)
			reply.Data, _ = json.Marshal(r.fault)
		} else {
			reply.Data = r.res
		}
		dspan.End(code, nil)
		_ = msg.RespondMsg(reply)
	}); err != nil {
		t.Fatal(err)
	}
	_ = hubConn.Flush()

	// shim: any replica takes a node.invoke and asks the device's hub.
	shimConn := connect("shim")
	shimTracer := shim.Tracer(telemetry.ScopeName)
	if _, err := shimConn.QueueSubscribe(wire.SubjectNodeInvokeAll, wire.QueueShim, func(msg *nats.Msg) {
		var req wire.InvokeRequest
		_ = json.Unmarshal(msg.Data, &req)
		tenant, _ := wire.TenantFromSubject(msg.Subject)
		ctx, span := telemetry.StartNATSHandler(context.Background(), shimTracer, msg, telemetry.CallInfo{})
		span.AddInfo(telemetry.CallInfo{Node: req.NodeID, Command: req.Command})
		device := strings.TrimPrefix(req.NodeID, "xz-")
		out := nats.NewMsg(wire.DeviceRPC(tenant, device))
		out.Data = []byte(`{"jsonrpc":"2.0","method":"tools/call","params":` + string(req.Params) + `}`)
		telemetry.InjectMsg(ctx, out)
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		res, err := shimConn.RequestMsgWithContext(rctx, out)
		cancel()
		var rep wire.InvokeReply
		switch {
		case err != nil:
			rep.Error = &wire.Fault{Code: telemetry.FaultCode(err), Message: err.Error()}
		case res.Header.Get(wire.HeaderFault) != "":
			rep.Error = &wire.Fault{}
			_ = json.Unmarshal(res.Data, rep.Error)
		default:
			rep.OK, rep.Payload = true, res.Data
		}
		data, _ := json.Marshal(rep)
		_ = msg.Respond(data)
		code := ""
		if rep.Error != nil {
			code = rep.Error.Code
		}
		span.End(code, nil)
	}); err != nil {
		t.Fatal(err)
	}
	_ = shimConn.Flush()
	return m
}

// invoke is the gateway's part of node.invoke: the operator's frame (with an
// optional v4 traceparent) in, the NATS request to a shim, the reply out.
func (m *miniSystem) invoke(traceparent, node, tool string) (trace.SpanContext, *wire.InvokeReply, error) {
	info := telemetry.CallInfo{Tenant: "acme", Principal: "ops@acme", Node: node, Command: "mcp.tools.call", Tool: tool}
	ctx, span := telemetry.StartOperatorRequest(context.Background(), m.gwTracer, "node.invoke", traceparent, info)
	sc := trace.SpanContextFromContext(ctx)
	req, _ := json.Marshal(wire.InvokeRequest{NodeID: node, Command: "mcp.tools.call", Params: json.RawMessage(`{"name":"` + tool + `","arguments":{}}`)})
	msg := nats.NewMsg(wire.NodeInvoke("acme"))
	msg.Data = req
	// No client spans: each service's span covers its request on, so one
	// invoke makes three spans (performance goal 8 allows five).
	telemetry.InjectMsg(ctx, msg)
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	res, err := m.gwConn.RequestMsgWithContext(rctx, msg)
	if err != nil {
		span.End(telemetry.FaultCode(err), err)
		return sc, nil, err
	}
	var rep wire.InvokeReply
	if err := json.Unmarshal(res.Data, &rep); err != nil {
		return sc, nil, err
	}
	code := ""
	if rep.Error != nil {
		code = rep.Error.Code
	}
	span.End(code, nil)
	return sc, &rep, nil
}

func TestOneTraceFromOperatorFrameToDevice(t *testing.T) {
	rec := telemetrytest.NewRecorder()
	m := startMiniSystem(t, rec, nil)
	const operatorTP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

	sc, rep, err := m.invoke(operatorTP, "xz-a1b2c3d4e5f6", "self.light.on")
	if err != nil || !rep.OK {
		t.Fatalf("invoke: %v %+v", err, rep)
	}
	if sc.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" {
		t.Fatalf("gateway span in trace %s, want the operator's trace", sc.TraceID())
	}
	spans := rec.WaitForTrace(t, sc.TraceID(), 3)
	if len(spans) != 3 {
		t.Fatalf("%d spans in the trace, want 3:\n%s", len(spans), telemetrytest.Dump(spans))
	}
	chain := telemetrytest.Chain(spans, telemetrytest.Find(spans, "tools/call"))
	want := []struct{ service, name, kind string }{
		{telemetry.ServiceGateway, "node.invoke", "server"},
		{telemetry.ServiceShim, "process xc.{tenant}.node.invoke", "server"},
		{telemetry.ServiceDevicehub, "tools/call", "client"},
	}
	if len(chain) != len(want) {
		t.Fatalf("chain from the device span to the root has %d spans, want %d:\n%s", len(chain), len(want), telemetrytest.Dump(chain))
	}
	for i, w := range want {
		s := chain[i]
		if telemetrytest.Service(s) != w.service || s.Name() != w.name || s.SpanKind().String() != w.kind {
			t.Errorf("hop %d: %s %s %q, want %s %s %q", i, telemetrytest.Service(s), s.SpanKind(), s.Name(), w.service, w.kind, w.name)
		}
		if telemetrytest.Attr(s, "xiaoclaw.outcome") != "ok" {
			t.Errorf("hop %d (%s): outcome %q", i, s.Name(), telemetrytest.Attr(s, "xiaoclaw.outcome"))
		}
	}
	root := chain[0]
	if root.Parent().SpanID().String() != "b7ad6b7169203331" || !root.Parent().IsRemote() {
		t.Errorf("root's parent %v, want the operator's span b7ad6b7169203331", root.Parent())
	}
	if ev := root.Events(); len(ev) != 0 {
		t.Errorf("gateway span events %v, want none", ev)
	}
	for k, v := range map[string]string{"xiaoclaw.tenant": "acme", "xiaoclaw.principal": "ops@acme", "xiaoclaw.tool": "self.light.on",
		"rpc.method": "node.invoke", "xiaoclaw.command": "mcp.tools.call"} {
		if got := telemetrytest.Attr(root, k); got != v {
			t.Errorf("gateway span %s = %q, want %q", k, got, v)
		}
	}
	shimProcess := chain[1]
	for k, v := range map[string]string{
		"messaging.system": "nats", "messaging.destination.name": "xc.{tenant}.node.invoke", "messaging.operation.name": "process",
		"xiaoclaw.tenant": "acme", "xiaoclaw.node": "xz-a1b2c3d4e5f6", "xiaoclaw.command": "mcp.tools.call",
	} {
		if got := telemetrytest.Attr(shimProcess, k); got != v {
			t.Errorf("shim span %s = %q, want %q", k, got, v)
		}
	}
	dev := chain[2]
	for k, v := range map[string]string{"rpc.system.name": "jsonrpc", "rpc.method": "tools/call", "jsonrpc.request.id": "7",
		"jsonrpc.protocol.version": "2.0", "network.protocol.name": "websocket", "xiaoclaw.device": "a1b2c3d4e5f6",
		"xiaoclaw.tool": "self.light.on"} {
		if got := telemetrytest.Attr(dev, k); got != v {
			t.Errorf("device span %s = %q, want %q", k, got, v)
		}
	}
}

func TestWithoutTraceparentTheGatewayStartsTheTrace(t *testing.T) {
	rec := telemetrytest.NewRecorder()
	m := startMiniSystem(t, rec, nil)
	for _, tp := range []string{"", "not-a-traceparent"} {
		sc, rep, err := m.invoke(tp, "xz-a1b2c3d4e5f6", "self.light.on")
		if err != nil || !rep.OK {
			t.Fatalf("invoke: %v %+v", err, rep)
		}
		spans := rec.WaitForTrace(t, sc.TraceID(), 3)
		root := telemetrytest.Find(spans, "node.invoke")
		if root.Parent().IsValid() {
			t.Errorf("traceparent %q: gateway span has parent %v, want a root span", tp, root.Parent())
		}
		if got := telemetrytest.Attr(root, "xiaoclaw.traceparent.invalid"); (tp != "") != (got == "true") {
			t.Errorf("traceparent %q: invalid marker %q", tp, got)
		}
	}
}

// The operator's sampling decision travels with the trace context: an
// unsampled traceparent leaves no span anywhere, though every hop sees it.
func TestUnsampledOperatorTraceIsRecordedNowhere(t *testing.T) {
	rec := telemetrytest.NewRecorder()
	m := startMiniSystem(t, rec, nil)
	sc, rep, err := m.invoke("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00", "xz-a1b2c3d4e5f6", "self.light.on")
	if err != nil || !rep.OK {
		t.Fatalf("invoke: %v %+v", err, rep)
	}
	if sc.IsSampled() {
		t.Fatal("gateway sampled a trace the operator did not")
	}
	// A later sampled call proves the handlers ran and finished their spans.
	sc2, _, _ := m.invoke("", "xz-a1b2c3d4e5f6", "self.light.on")
	rec.WaitForTrace(t, sc2.TraceID(), 3)
	if got := telemetrytest.InTrace(rec.Spans(), sc.TraceID()); len(got) != 0 {
		t.Fatalf("unsampled trace recorded:\n%s", telemetrytest.Dump(got))
	}
}

func TestFailuresCarryOutcomeAndErrorCode(t *testing.T) {
	rec := telemetrytest.NewRecorder()
	m := startMiniSystem(t, rec, nil)
	m.deviceAnswer = func(string) (json.RawMessage, *wire.Fault) {
		return nil, &wire.Fault{Code: wire.FaultDeviceError, Message: "volume out of range"}
	}
	sc, rep, err := m.invoke("", "xz-a1b2c3d4e5f6", "self.audio_speaker.set_volume")
	if err != nil || rep.OK || rep.Error.Code != wire.FaultDeviceError {
		t.Fatalf("invoke: %v %+v", err, rep)
	}
	for _, s := range rec.WaitForTrace(t, sc.TraceID(), 3) {
		if telemetrytest.Attr(s, "xiaoclaw.outcome") != telemetry.OutcomeDeviceError ||
			telemetrytest.Attr(s, "error.type") != wire.FaultDeviceError || s.Status().Code != codes.Error {
			t.Errorf("%s %q: outcome %q error.type %q status %v", telemetrytest.Service(s), s.Name(),
				telemetrytest.Attr(s, "xiaoclaw.outcome"), telemetrytest.Attr(s, "error.type"), s.Status())
		}
	}

	// A device no hub holds: NATS has no responders; the shim's span says offline.
	rec.Reset()
	sc, rep, err = m.invoke("", "xz-ffffffffffff", "self.light.on")
	if err != nil || rep.OK || rep.Error.Code != wire.FaultNotConnected {
		t.Fatalf("invoke offline device: %v %+v", err, rep)
	}
	spans := rec.WaitForTrace(t, sc.TraceID(), 2)
	shim := telemetrytest.Find(spans, "process xc.{tenant}.node.invoke")
	if shim == nil || telemetrytest.Attr(shim, "xiaoclaw.outcome") != telemetry.OutcomeOffline ||
		telemetrytest.Attr(shim, "xiaoclaw.error.code") != wire.FaultNotConnected {
		t.Fatalf("offline shim span:\n%s", telemetrytest.Dump(spans))
	}
}

func TestPolicyDenialNamesTheRule(t *testing.T) {
	rec := telemetrytest.NewRecorder()
	tr := rec.Provider(t, telemetry.ServiceGateway, nil).Tracer(telemetry.ScopeName)
	info := telemetry.CallInfo{Tenant: "acme", Principal: "ops@acme", Node: "xz-a1b2c3d4e5f6", Command: "mcp.tools.call", Tool: "self.reboot"}
	ctx, span := telemetry.StartOperatorRequest(context.Background(), tr, "node.invoke", "", info)
	span.SetDenyingRule("rule-no-reboot")
	span.End(telemetry.CodeDenied, nil)
	traceID, _ := telemetry.TraceIDs(ctx)
	tid, _ := trace.TraceIDFromHex(traceID)
	s := rec.WaitForTrace(t, tid, 1)[0]
	for k, v := range map[string]string{"xiaoclaw.policy.rule": "rule-no-reboot", "xiaoclaw.outcome": telemetry.OutcomeDenied,
		"xiaoclaw.error.code": telemetry.CodeDenied, "xiaoclaw.tool": "self.reboot"} {
		if got := telemetrytest.Attr(s, k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if s.Status().Code != codes.Error {
		t.Errorf("status %v, want Error", s.Status())
	}
}

func TestTracingOffStillPassesTheOperatorTraceAlong(t *testing.T) {
	_, connect := startNATS(t)
	off, err := telemetry.NewTracerProvider(context.Background(), telemetry.ServiceShim, telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tr := off.Tracer(telemetry.ScopeName)

	// Gateway: the operator's traceparent names the call in the audit row;
	// without one, a new trace id does.
	if ctx, _ := telemetry.StartOperatorRequest(context.Background(), tr, "node.invoke", "", telemetry.CallInfo{}); !trace.SpanContextFromContext(ctx).IsValid() {
		t.Fatal("tracing off: no trace id without a traceparent")
	}
	ctx, span := telemetry.StartOperatorRequest(context.Background(), tr, "node.invoke", validTP, telemetry.CallInfo{})
	if span.Recording() {
		t.Fatal("a provider with tracing off records")
	}
	if traceID, _ := telemetry.TraceIDs(ctx); traceID != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("trace id %q, want the operator's", traceID)
	}
	span.AddInfo(telemetry.CallInfo{Node: "xz-a1b2c3d4e5f6"}) // safe on a span that does not record
	span.SetDenyingRule("r1")
	span.End("", nil)

	// Shim: what arrives with the request leaves with the next one.
	nc := connect("x")
	got := make(chan nats.Header, 1)
	sub, _ := nc.Subscribe("xc.acme.dev.a1b2c3d4e5f6.rpc", func(msg *nats.Msg) {
		got <- msg.Header
		_ = msg.Respond(nil)
	})
	defer sub.Unsubscribe()
	in := nats.NewMsg("xc.acme.node.invoke")
	telemetry.InjectMsg(ctx, in)
	hctx, hspan := telemetry.StartNATSHandler(context.Background(), tr, in, telemetry.CallInfo{})
	out := nats.NewMsg("xc.acme.dev.a1b2c3d4e5f6.rpc")
	telemetry.InjectMsg(hctx, out)
	_, err = nc.RequestMsgWithContext(hctx, out)
	hspan.End(telemetry.FaultCode(err), err)
	// The operator's trace id, the shim's own span id, and "not sampled":
	// with tracing off nothing downstream records either.
	tp := (<-got).Get("traceparent")
	if !strings.HasPrefix(tp, validTP[:36]) || tp == validTP || !strings.HasSuffix(tp, "-00") {
		t.Fatalf("traceparent %q, want the operator's trace id %s, another span id, unsampled", tp, validTP[3:35])
	}
}

func TestHeaderPropagation(t *testing.T) {
	ts, _ := trace.ParseTraceState("vendor=abc,other=1")
	pctx, _ := telemetry.ContextWithTraceparent(context.Background(), validTP)
	sc := trace.SpanContextFromContext(pctx)
	ctx := trace.ContextWithSpanContext(context.Background(), sc.WithTraceState(ts))
	h := nats.Header{}
	telemetry.InjectHeader(ctx, h)
	if h.Get("traceparent") != validTP || h.Get("tracestate") != "vendor=abc,other=1" {
		t.Fatalf("injected %v", h)
	}
	back := trace.SpanContextFromContext(telemetry.ExtractHeader(context.Background(), h))
	if !back.Equal(sc.WithTraceState(ts)) {
		t.Fatalf("extracted %v, want %v", back, sc)
	}

	// Another client may capitalise the header names.
	h2 := nats.Header{"Traceparent": {validTP}}
	if !trace.SpanContextFromContext(telemetry.ExtractHeader(context.Background(), h2)).IsValid() {
		t.Fatal("Traceparent (capitalised) not found")
	}
	// A bad tracestate is dropped, the traceparent still counts.
	h3 := nats.Header{"traceparent": {validTP}, "tracestate": {"=bad=,,"}}
	if sc := trace.SpanContextFromContext(telemetry.ExtractHeader(context.Background(), h3)); !sc.IsValid() || sc.TraceState().Len() != 0 {
		t.Fatalf("with a bad tracestate: %v", sc)
	}
	for _, bad := range []nats.Header{nil, {}, {"traceparent": {"00-zz"}}, {"traceparent": {}}} {
		base := context.Background()
		if telemetry.ExtractHeader(base, bad) != base {
			t.Errorf("header %v changed the context", bad)
		}
	}
	// Without a span nothing is written.
	empty := nats.Header{}
	telemetry.InjectHeader(context.Background(), empty)
	msg := nats.NewMsg("x")
	msg.Header = nil
	telemetry.InjectMsg(context.Background(), msg)
	if len(empty) != 0 || msg.Header != nil {
		t.Fatal("inject without a span wrote headers")
	}
	// The carrier works with any propagator.
	c := telemetry.HeaderCarrier(nats.Header{})
	c.Set("k", "v")
	if c.Get("k") != "v" || c.Get("K") != "v" || len(c.Keys()) != 1 {
		t.Fatalf("carrier %v", c)
	}
}

func TestSubjectTemplate(t *testing.T) {
	for in, want := range map[string]string{
		wire.DeviceRPC("acme", "a1b2c3d4e5f6"):   "xc.{tenant}.dev.{device}.rpc",
		wire.DeviceState("acme", "a1b2c3d4e5f6"): "xc.{tenant}.dev.{device}.state",
		wire.NodeInvoke("acme"):                  "xc.{tenant}.node.invoke",
		wire.NodeEvent("t-2"):                    "xc.{tenant}.node.event",
		wire.OpenClawNodeInvoke("acme", "3f9a"):  "xc.{tenant}.ocnode.{node}.invoke",
		wire.SubjectHubResync:                    wire.SubjectHubResync,
		"_INBOX.abc.def":                         "_INBOX",
		"xc.acme":                                "xc.{tenant}",
		"xc.acme.dev":                            "xc.{tenant}.dev",
		"xc.acme.dev.d1":                         "xc.{tenant}.dev.{device}",
		"other.subject":                          "other.subject",
	} {
		if got := telemetry.SubjectTemplate(in); got != want {
			t.Errorf("SubjectTemplate(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestFaultCodeAndOutcome(t *testing.T) {
	for _, tc := range []struct {
		err     error
		code    string
		outcome string
	}{
		{nil, "", telemetry.OutcomeOK},
		{fmt.Errorf("wrapped: %w", &wire.Fault{Code: wire.FaultBusy}), wire.FaultBusy, telemetry.OutcomeBusy},
		{nats.ErrNoResponders, wire.FaultNotConnected, telemetry.OutcomeOffline},
		{nats.ErrTimeout, wire.FaultTimeout, telemetry.OutcomeTimeout},
		{context.DeadlineExceeded, wire.FaultTimeout, telemetry.OutcomeTimeout},
		{context.Canceled, telemetry.CodeCanceled, telemetry.OutcomeError},
		{errors.New("boom"), wire.FaultUnavailable, telemetry.OutcomeError},
	} {
		code := telemetry.FaultCode(tc.err)
		if code != tc.code || telemetry.OutcomeOf(code) != tc.outcome {
			t.Errorf("%v: code %q outcome %q, want %q %q", tc.err, code, telemetry.OutcomeOf(code), tc.code, tc.outcome)
		}
	}
	for code, want := range map[string]string{
		telemetry.CodeDenied: telemetry.OutcomeDenied, wire.FaultInvalidRequest: telemetry.OutcomeInvalid,
		wire.FaultTooLarge: telemetry.OutcomeInvalid, wire.FaultDisconnected: telemetry.OutcomeOffline,
	} {
		if got := telemetry.OutcomeOf(code); got != want {
			t.Errorf("OutcomeOf(%s) = %s, want %s", code, got, want)
		}
	}
}

func TestTraceIDs(t *testing.T) {
	if a, b := telemetry.TraceIDs(context.Background()); a != "" || b != "" {
		t.Fatal("ids without a span")
	}
	ctx, _ := telemetry.ContextWithTraceparent(context.Background(), validTP)
	if a, b := telemetry.TraceIDs(ctx); a != "4bf92f3577b34da6a3ce929d0e0e4736" || b != "00f067aa0ba902b7" {
		t.Fatalf("ids %s %s", a, b)
	}
}

var _ = sdktrace.ReadOnlySpan(nil)
