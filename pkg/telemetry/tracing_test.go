package telemetry_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry/telemetrytest"
)

// newProvider builds a provider with env set for the test (the SDK reads
// the process environment).
func newProvider(t *testing.T, service string, env map[string]string, cfg telemetry.Config) *telemetry.TracerProvider {
	t.Helper()
	telemetrytest.SetEnv(t, env)
	tp, err := telemetry.NewTracerProvider(context.Background(), service, cfg)
	if err != nil {
		t.Fatalf("NewTracerProvider: %v", err)
	}
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp
}

// With tracing off nothing records, yet every span still has a trace id:
// the audit row, the log lines and the reply name the call by it.
func TestTracingOffRecordsNothingButGivesTraceIDs(t *testing.T) {
	for name, env := range map[string]map[string]string{
		"no variables":          nil,
		"exporter none":         {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"},
		"sdk disabled":          {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"},
		"only protocol or name": {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "OTEL_SERVICE_NAME": "x"},
		"sampler alone":         {"OTEL_TRACES_SAMPLER": "always_on"},
	} {
		t.Run(name, func(t *testing.T) {
			tp := newProvider(t, telemetry.ServiceGateway, env, telemetry.Config{})
			if tp.Enabled() || !strings.HasPrefix(tp.String(), "tracing off") {
				t.Fatalf("tracing on, want off (%s)", tp)
			}
			tr := tp.Tracer(telemetry.ScopeName)
			ctx, span := tr.Start(context.Background(), "x")
			if span.IsRecording() || !span.SpanContext().IsValid() || span.SpanContext().IsSampled() {
				t.Fatalf("span recording=%v context %v: want a valid, unsampled, non-recording span", span.IsRecording(), span.SpanContext())
			}
			span.End()
			// A child continues the trace.
			_, child := tr.Start(ctx, "y")
			if child.SpanContext().TraceID() != span.SpanContext().TraceID() {
				t.Fatal("child span left the trace")
			}
			// A caller's sampled traceparent: its trace id is kept, nothing
			// records, and the flag sent on says "not sampled".
			pctx, _ := telemetry.ContextWithTraceparent(context.Background(), validTP)
			_, sp := tr.Start(pctx, "z")
			if sp.IsRecording() || sp.SpanContext().IsSampled() || sp.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
				t.Fatalf("under a sampled parent: recording=%v %v", sp.IsRecording(), sp.SpanContext())
			}
		})
	}
}

func TestSDKDisabledWinsOverSpanProcessor(t *testing.T) {
	tp := newProvider(t, "svc", map[string]string{"OTEL_SDK_DISABLED": "TRUE"}, telemetry.Config{SpanProcessor: tracetest.NewSpanRecorder()})
	if tp.Enabled() {
		t.Fatal("OTEL_SDK_DISABLED=true did not turn tracing off")
	}
}

// An endpoint alone turns OTLP export on: setting OTEL_EXPORTER_OTLP_ENDPOINT
// is how most deployments say "send traces there".
func TestEndpointAloneExportsOverOTLP(t *testing.T) {
	rcv := telemetrytest.StartOTLPReceiver(t)
	tp := newProvider(t, "svc", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": rcv.HTTPURL}, telemetry.Config{})
	if !tp.Enabled() {
		t.Fatal("tracing off with an OTLP endpoint set")
	}
	_, span := tp.Tracer(telemetry.ScopeName).Start(context.Background(), "one")
	span.End()
	if err := tp.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := rcv.WaitForTrace(t, span.SpanContext().TraceID().String(), 1)
	if got[0].Protocol != "http/protobuf" || got[0].Name != "one" {
		t.Fatalf("got %+v, want span 'one' over http/protobuf (the default protocol)", got[0])
	}
}

func TestExportOverOTLPBothProtocols(t *testing.T) {
	rcv := telemetrytest.StartOTLPReceiver(t)
	for _, proto := range []string{"grpc", "http/protobuf"} {
		t.Run(proto, func(t *testing.T) {
			env := rcv.Env(proto)
			env["OTEL_RESOURCE_ATTRIBUTES"] = "deployment.environment.name=test,region=eu%2Dwest"
			env["OTEL_EXPORTER_OTLP_COMPRESSION"] = "gzip"
			tp := newProvider(t, telemetry.ServiceGateway, env, telemetry.Config{Instance: "gw-1", Version: "v0.1.0"})
			if !tp.Enabled() || !strings.Contains(tp.String(), "otlp "+proto) {
				t.Fatalf("provider %q, want otlp %s", tp, proto)
			}
			ctx, span := telemetry.StartOperatorRequest(context.Background(), tp.Tracer(telemetry.ScopeName), "node.invoke", "",
				telemetry.CallInfo{Tenant: "acme", Node: "xz-a1b2c3d4e5f6", Command: "mcp.tools.call", Tool: "self.light.on"})
			span.End("", nil)
			traceID, _ := telemetry.TraceIDs(ctx)
			if err := tp.ForceFlush(context.Background()); err != nil {
				t.Fatal(err)
			}
			got := rcv.WaitForTrace(t, traceID, 1)[0]
			want := map[string]string{
				"service.name": telemetry.ServiceGateway, "service.namespace": "xiaoclaw", "service.instance.id": "gw-1",
				"service.version": "v0.1.0", "deployment.environment.name": "test", "region": "eu-west",
				"telemetry.sdk.language": "go",
			}
			for k, v := range want {
				if got.Resource[k] != v {
					t.Errorf("resource %s = %q, want %q", k, got.Resource[k], v)
				}
			}
			if got.Protocol != proto || got.Name != "node.invoke" || got.Kind != "server" || got.ParentSpanID != "" {
				t.Errorf("span %+v: want a root server span node.invoke over %s", got, proto)
			}
			for k, v := range map[string]string{
				"xiaoclaw.tenant": "acme", "xiaoclaw.node": "xz-a1b2c3d4e5f6", "xiaoclaw.tool": "self.light.on",
				"xiaoclaw.outcome": "ok", "rpc.method": "node.invoke",
			} {
				if got.Attributes[k] != v {
					t.Errorf("attribute %s = %q, want %q", k, got.Attributes[k], v)
				}
			}
		})
	}
}

func TestOTLPHeadersReachTheCollectorAndStayOutOfTheSummary(t *testing.T) {
	rcv := telemetrytest.StartOTLPReceiver(t)
	env := rcv.Env("http/protobuf")
	env["OTEL_EXPORTER_OTLP_TRACES_HEADERS"] = "Authorization=Bearer%20s3cr3t-otlp,X-Scope=team-a"
	tp := newProvider(t, "svc", env, telemetry.Config{})
	if strings.Contains(tp.String(), "s3cr3t") {
		t.Fatalf("summary %q shows the header secret", tp)
	}
	_, span := tp.Tracer(telemetry.ScopeName).Start(context.Background(), "h")
	span.End()
	_ = tp.ForceFlush(context.Background())
	rcv.WaitForTrace(t, span.SpanContext().TraceID().String(), 1)
	h := rcv.HTTPHeaders()[0]
	if h.Get("Authorization") != "Bearer s3cr3t-otlp" || h.Get("X-Scope") != "team-a" {
		t.Fatalf("collector saw headers %v", h)
	}
}

func TestTracesEndpointIsUsedAsIs(t *testing.T) {
	rcv := telemetrytest.StartOTLPReceiver(t)
	tp := newProvider(t, "svc", map[string]string{
		"OTEL_TRACES_EXPORTER":               "otlp",
		"OTEL_EXPORTER_OTLP_ENDPOINT":        "http://127.0.0.1:1/wrong",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": rcv.HTTPURL + "/v1/traces",
	}, telemetry.Config{})
	_, span := tp.Tracer(telemetry.ScopeName).Start(context.Background(), "s")
	span.End()
	_ = tp.ForceFlush(context.Background())
	rcv.WaitForTrace(t, span.SpanContext().TraceID().String(), 1)
}

func TestServiceNameRules(t *testing.T) {
	for _, tc := range []struct {
		name   string
		env    map[string]string
		shared bool
		want   string
	}{
		{"argument", nil, false, "xiaoclaw-shim"},
		{"resource attribute overrides argument", map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs"}, false, "from-attrs"},
		{"OTEL_SERVICE_NAME overrides both", map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs", "OTEL_SERVICE_NAME": "from-env"}, false, "from-env"},
		{"shared process keeps the argument", map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs", "OTEL_SERVICE_NAME": "from-env"}, true, "xiaoclaw-shim"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			tp := newProvider(t, "xiaoclaw-shim", tc.env, telemetry.Config{SharedProcess: tc.shared, SpanProcessor: rec})
			_, span := tp.Tracer(telemetry.ScopeName).Start(context.Background(), "s")
			span.End()
			if got := telemetrytest.Service(rec.Ended()[0]); got != tc.want || tp.ServiceName() != tc.want {
				t.Fatalf("service.name %q (ServiceName %q), want %q", got, tp.ServiceName(), tc.want)
			}
		})
	}
}

// In `xiaoclaw dev` three providers share one environment; each span still
// names its own service.
func TestProvidersPerServiceInOneProcess(t *testing.T) {
	rec := telemetrytest.NewRecorder()
	env := map[string]string{"OTEL_SERVICE_NAME": "ignored-in-shared-process"}
	gw := rec.Provider(t, telemetry.ServiceGateway, env)
	shim := rec.Provider(t, telemetry.ServiceShim, env)
	ctx, s1 := gw.Tracer(telemetry.ScopeName).Start(context.Background(), "a")
	_, s2 := shim.Tracer(telemetry.ScopeName).Start(ctx, "b")
	s2.End()
	s1.End()
	spans := rec.Spans()
	if telemetrytest.Service(spans[0]) != telemetry.ServiceShim || telemetrytest.Service(spans[1]) != telemetry.ServiceGateway {
		t.Fatalf("services: %s", telemetrytest.Dump(spans))
	}
}

func TestSamplers(t *testing.T) {
	sampledParent := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled, Remote: true,
	})
	unsampledParent := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{2}, SpanID: trace.SpanID{2}, Remote: true})
	for _, tc := range []struct {
		sampler, arg string
		parent       trace.SpanContext
		want         bool
	}{
		{"", "", trace.SpanContext{}, true},
		{"", "", unsampledParent, false}, // parentbased_always_on follows the caller
		{"", "", sampledParent, true},
		{"always_off", "", sampledParent, false},
		{"always_on", "", unsampledParent, true},
		{"traceidratio", "0", trace.SpanContext{}, false},
		{"traceidratio", "1", trace.SpanContext{}, true},
		{"parentbased_traceidratio", "0", sampledParent, true},
		{"parentbased_always_off", "", trace.SpanContext{}, false},
		{"parentbased_traceidratio", "0.1", trace.SpanContext{}, false}, // trace id {0x01,...} is above a tenth
	} {
		t.Run(tc.sampler+"/"+tc.arg+"/"+tc.parent.TraceFlags().String(), func(t *testing.T) {
			tp := newProvider(t, "svc", map[string]string{"OTEL_TRACES_SAMPLER": tc.sampler, "OTEL_TRACES_SAMPLER_ARG": tc.arg},
				telemetry.Config{SpanProcessor: tracetest.NewSpanRecorder()})
			ctx := context.Background()
			if tc.parent.IsValid() {
				ctx = trace.ContextWithRemoteSpanContext(ctx, tc.parent)
			}
			_, span := tp.Tracer(telemetry.ScopeName).Start(ctx, "s")
			defer span.End()
			if span.IsRecording() != tc.want {
				t.Fatalf("recording %v, want %v", span.IsRecording(), tc.want)
			}
		})
	}
}

func TestBadEnvironmentIsRefusedClearly(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"OTEL_TRACES_EXPORTER": "zipkin"}, "zipkin"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "protocol"},
		{map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "udp"}, "protocol"},
		{map[string]string{"OTEL_RESOURCE_ATTRIBUTES": "a=1,novalue"}, "OTEL_RESOURCE_ATTRIBUTES"},
	} {
		t.Run(fmt.Sprint(tc.env), func(t *testing.T) {
			telemetrytest.SetEnv(t, tc.env)
			_, err := telemetry.NewTracerProvider(context.Background(), "svc", telemetry.Config{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
	if _, err := telemetry.NewTracerProvider(context.Background(), "", telemetry.Config{}); err == nil {
		t.Error("an empty service name was accepted")
	}
}

// A batch provider must not lose queued spans at Shutdown: services call it
// last when they stop.
func TestShutdownFlushesQueuedSpans(t *testing.T) {
	rcv := telemetrytest.StartOTLPReceiver(t)
	env := rcv.Env("grpc")
	env["OTEL_BSP_SCHEDULE_DELAY"] = "60000" // nothing leaves before Shutdown
	telemetrytest.SetEnv(t, env)
	tp, err := telemetry.NewTracerProvider(context.Background(), "svc", telemetry.Config{})
	if err != nil {
		t.Fatal(err)
	}
	tr := tp.Tracer(telemetry.ScopeName)
	ctx, root := tr.Start(context.Background(), "root")
	for range 9 {
		_, s := tr.Start(ctx, "child")
		s.End()
	}
	root.End()
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	rcv.WaitForTrace(t, root.SpanContext().TraceID().String(), 10)
}

func TestErrorHandlerLogsAtMostOncePerInterval(t *testing.T) {
	log, buf := newTestLogger(t, "json", nil)
	h := telemetry.ErrorHandler(log, time.Hour)
	for i := range 5 {
		h.Handle(fmt.Errorf("export failed %d", i))
	}
	lines := jsonLines(t, buf)
	if len(lines) != 1 || lines[0]["err"] != "export failed 0" || lines[0]["level"] != "WARN" {
		t.Fatalf("lines %v", lines)
	}
	h2 := telemetry.ErrorHandler(log, 0)
	h2.Handle(errors.New("a"))
	h2.Handle(errors.New("b"))
	if n := len(jsonLines(t, buf)); n != 3 {
		t.Fatalf("%d lines with no interval, want 3", n)
	}
}
