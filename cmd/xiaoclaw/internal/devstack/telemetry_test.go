package devstack

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/xiaoclaw/xiaoclaw/pkg/ops"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry/telemetrytest"
)

// v4Operator is a bare protocol-v4 operator connection, for request frames
// with fields occlient does not send (traceparent).
type v4Operator struct {
	ws *websocket.Conn
}

func dialV4(t *testing.T, url string) *v4Operator {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ws.CloseNow() })
	o := &v4Operator{ws: ws}
	o.read(t, func(f map[string]json.RawMessage) bool { return string(f["event"]) == `"connect.challenge"` })
	o.write(t, map[string]any{"type": "req", "id": "c1", "method": "connect", "params": map[string]any{
		"minProtocol": 4, "maxProtocol": 4,
		"client": map[string]any{"id": "cli", "version": "test", "platform": "linux", "mode": "cli"},
		"role":   "operator", "scopes": []string{"operator.read", "operator.write"}, "caps": []string{},
		"auth": map[string]any{"token": testOperatorToken},
	}})
	if res := o.read(t, isResponse("c1")); string(res["ok"]) != "true" {
		t.Fatalf("connect refused: %s", res["error"])
	}
	return o
}

func isResponse(id string) func(map[string]json.RawMessage) bool {
	return func(f map[string]json.RawMessage) bool {
		return string(f["type"]) == `"res"` && string(f["id"]) == `"`+id+`"`
	}
}

func (o *v4Operator) write(t *testing.T, frame any) {
	t.Helper()
	b, _ := json.Marshal(frame)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := o.ws.Write(ctx, websocket.MessageText, b); err != nil {
		t.Fatal(err)
	}
}

// read returns the first frame that match accepts.
func (o *v4Operator) read(t *testing.T, match func(map[string]json.RawMessage) bool) map[string]json.RawMessage {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	for {
		_, b, err := o.ws.Read(ctx)
		if err != nil {
			t.Fatalf("read: %v", err)
		}
		var f map[string]json.RawMessage
		if err := json.Unmarshal(b, &f); err != nil {
			t.Fatalf("frame is not JSON: %s", b)
		}
		if match(f) {
			return f
		}
	}
}

// invoke sends node.invoke mcp.tools.call with a traceparent and returns the response frame.
func (o *v4Operator) invoke(t *testing.T, id, node, tool, traceparent string) map[string]json.RawMessage {
	t.Helper()
	o.write(t, map[string]any{"type": "req", "id": id, "method": "node.invoke", "traceparent": traceparent, "params": map[string]any{
		"nodeId": node, "command": "mcp.tools.call", "idempotencyKey": id,
		"params": map[string]any{"name": tool, "arguments": map[string]any{}},
	}})
	return o.read(t, isResponse(id))
}

// tracedStack starts a stack whose services record spans into rec and
// metrics into one registry, served with the health endpoints on the
// gateway's port as in `xiaoclaw dev`.
func tracedStack(t *testing.T, rec *telemetrytest.Recorder) *Stack {
	t.Helper()
	reg := telemetry.NewRegistry()
	ops, err := ops.NewServer(ops.Config{Gatherer: reg}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return startStack(t, Config{
		GatewayTracerProvider: rec.Provider(t, telemetry.ServiceGateway, nil),
		ShimTracerProvider:    rec.Provider(t, telemetry.ServiceShim, nil),
		HubTracerProvider:     rec.Provider(t, telemetry.ServiceDevicehub, nil),
		Registerer:            reg,
		Ops:                   ops.Handler(),
	})
}

func TestInvokeTraceAcrossServices(t *testing.T) {
	rec := telemetrytest.NewRecorder()
	st := tracedStack(t, rec)
	dev := connectDevices(t, st, 0, 1, 21, nil)[0]
	node := nodeID(dev)
	waitNodes(t, operator(t, st.GatewayURL(0)), true, node)
	op := dialV4(t, st.GatewayURL(0))

	// The operator's own span: the gateway's span must be its child.
	const opTrace, opSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	res := op.invoke(t, "inv-1", node, "self.get_device_status", "00-"+opTrace+"-"+opSpan+"-01")
	if string(res["ok"]) != "true" {
		t.Fatalf("node.invoke failed: %s", res["error"])
	}
	traceID, _ := trace.TraceIDFromHex(opTrace)
	spans := rec.WaitForTrace(t, traceID, 3)
	device := findSpan(t, spans, telemetry.ServiceDevicehub, "tools/call")
	chain := telemetrytest.Chain(spans, device)
	want := []struct{ service, name string }{
		{telemetry.ServiceGateway, "node.invoke"},
		{telemetry.ServiceShim, "process xc.{tenant}.node.invoke"},
		{telemetry.ServiceDevicehub, "tools/call"},
	}
	if len(chain) != len(want) {
		t.Fatalf("chain of %d spans, want %d:\n%s", len(chain), len(want), telemetrytest.Dump(chain))
	}
	for i, w := range want {
		if got := chain[i]; telemetrytest.Service(got) != w.service || got.Name() != w.name {
			t.Errorf("span %d = %s %q, want %s %q", i, telemetrytest.Service(got), got.Name(), w.service, w.name)
		}
	}
	root := chain[0]
	if p := root.Parent(); !p.IsRemote() || p.SpanID().String() != opSpan {
		t.Errorf("gateway span's parent = %s (remote %v), want the operator's span %s", p.SpanID(), p.IsRemote(), opSpan)
	}
	wantAttrs(t, root, map[string]string{
		"rpc.system.name": "openclaw", "rpc.method": "node.invoke",
		"xiaoclaw.tenant": DevTenant, "xiaoclaw.principal": "dev-operator", "xiaoclaw.node": node,
		"xiaoclaw.command": "mcp.tools.call", "xiaoclaw.tool": "self.get_device_status",
		"xiaoclaw.outcome": "ok",
	})
	wantAttrs(t, chain[1], map[string]string{
		"messaging.system": "nats", "messaging.operation.name": "process", "messaging.operation.type": "process",
		"messaging.destination.name": "xc.{tenant}.node.invoke", "xiaoclaw.tenant": DevTenant,
		"xiaoclaw.node": node, "xiaoclaw.command": "mcp.tools.call", "xiaoclaw.outcome": "ok",
	})
	wantAttrs(t, device, map[string]string{
		"rpc.system.name": "jsonrpc", "rpc.method": "tools/call", "jsonrpc.protocol.version": "2.0",
		"network.protocol.name": "websocket", "xiaoclaw.device": canonical(dev), "xiaoclaw.tool": "self.get_device_status",
		"xiaoclaw.outcome": "ok",
	})
	if telemetrytest.Attr(device, "jsonrpc.request.id") == "" {
		t.Errorf("device call lacks its request id")
	}
	for _, s := range chain[1:] {
		if s.SpanContext().TraceID() != traceID {
			t.Errorf("%s left the operator's trace", s.Name())
		}
	}

	// A call the shim refuses (the device declares no such tool): both hops
	// say so, with the code.
	rec.Reset()
	const failTrace = "5bf92f3577b34da6a3ce929d0e0e4737"
	res = op.invoke(t, "inv-2", node, "self.no_such_tool", "00-"+failTrace+"-"+opSpan+"-01")
	if string(res["ok"]) == "true" {
		t.Fatal("unknown tool succeeded")
	}
	failID, _ := trace.TraceIDFromHex(failTrace)
	spans = rec.WaitForTrace(t, failID, 2)
	for _, s := range []sdktrace.ReadOnlySpan{
		findSpan(t, spans, telemetry.ServiceGateway, "node.invoke"),
		findSpan(t, spans, telemetry.ServiceShim, "process xc.{tenant}.node.invoke"),
	} {
		wantAttrs(t, s, map[string]string{"xiaoclaw.outcome": "invalid", "xiaoclaw.error.code": "INVALID_REQUEST", "error.type": "INVALID_REQUEST"})
		if s.Status().Code.String() != "Error" {
			t.Errorf("%s %s: status %v, want Error", telemetrytest.Service(s), s.Name(), s.Status())
		}
	}

	// The metrics of all three services on the gateway's port.
	body := httpGet(t, "http://"+st.Gateways[0].Addr()+"/metrics")
	for _, want := range []string{
		`xiaoclaw_invokes_total{command="mcp.tools.call",outcome="ok",service="gateway"} 1`,
		`xiaoclaw_invokes_total{command="mcp.tools.call",outcome="ok",service="shim"} 1`,
		`xiaoclaw_invokes_total{command="mcp.tools.call",outcome="ok",service="devicehub"}`,
		`xiaoclaw_invokes_total{command="mcp.tools.call",outcome="invalid",service="gateway"} 1`,
		`xiaoclaw_devices_connected{tenant="dev",transport="websocket"} 1`,
		`xiaoclaw_policy_decisions_total{effect="allow"} 2`,
		`xiaoclaw_hop_duration_seconds_count{hop="invoke"} 2`,
		`xiaoclaw_hop_duration_seconds_count{hop="gateway_shim"} 2`,
		`xiaoclaw_hop_duration_seconds_count{hop="shim_devicehub"} 1`,
		`xiaoclaw_hop_duration_seconds_count{hop="devicehub_device"}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

func TestInvokeWithoutTraceparentStartsTrace(t *testing.T) {
	rec := telemetrytest.NewRecorder()
	st := tracedStack(t, rec)
	dev := connectDevices(t, st, 0, 1, 22, nil)[0]
	op := operator(t, st.GatewayURL(0))
	node := nodeID(dev)
	waitNodes(t, op, true, node)
	if _, err := callTool(context.Background(), op, node, "self.get_device_status", map[string]any{}, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	spans := rec.WaitFor(t, "a device call", func(s []sdktrace.ReadOnlySpan) bool {
		return telemetrytest.Find(s, "tools/call") != nil && telemetrytest.Find(s, "node.invoke") != nil
	})
	// The invoke's chain starts at the gateway's root span.
	var device sdktrace.ReadOnlySpan
	root := telemetrytest.Find(spans, "node.invoke")
	for _, s := range telemetrytest.InTrace(spans, root.SpanContext().TraceID()) {
		if s.Name() == "tools/call" {
			device = s
		}
	}
	if device == nil {
		t.Fatalf("no device call in the invoke's trace:\n%s", telemetrytest.Dump(spans))
	}
	if chain := telemetrytest.Chain(spans, device); len(chain) != 3 || chain[0] != root || root.Parent().IsValid() {
		t.Fatalf("want a 3-span chain from a root node.invoke span:\n%s", telemetrytest.Dump(chain))
	}
}

func findSpan(t *testing.T, spans []sdktrace.ReadOnlySpan, service, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range spans {
		if telemetrytest.Service(s) == service && s.Name() == name {
			return s
		}
	}
	t.Fatalf("no %s span %q in:\n%s", service, name, telemetrytest.Dump(spans))
	return nil
}

func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got := telemetrytest.Attr(s, k); got != v {
			t.Errorf("%s %q: %s = %q, want %q", telemetrytest.Service(s), s.Name(), k, got, v)
		}
	}
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s = %d %s", url, resp.StatusCode, b)
	}
	return string(b)
}
