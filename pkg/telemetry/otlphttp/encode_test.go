package otlphttp

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// everyType has one attribute of every attribute.Type of otel v1.47, with
// edge values: zero, negative, empty, long, nested, and slices long enough to
// leave the attribute package's fixed-size fast paths.
func everyType(prefix string) []attribute.KeyValue {
	k := func(s string) string { return prefix + s }
	return []attribute.KeyValue{
		attribute.Bool(k("bool.true"), true),
		attribute.Bool(k("bool.false"), false),
		attribute.Int64(k("int.zero"), 0),
		attribute.Int64(k("int.neg"), -42),
		attribute.Int64(k("int.min"), math.MinInt64),
		attribute.Int64(k("int.max"), math.MaxInt64),
		attribute.Float64(k("float.zero"), 0),
		attribute.Float64(k("float.pi"), math.Pi),
		attribute.Float64(k("float.neg"), -1e300),
		attribute.Float64(k("float.inf"), math.Inf(1)),
		attribute.String(k("string.empty"), ""),
		attribute.String(k("string"), "héllo wörld"),
		attribute.String(k("string.127"), strings.Repeat("x", 127)),
		attribute.String(k("string.300"), strings.Repeat("y", 300)),
		attribute.String(k("string.20k"), strings.Repeat("z", 20000)),
		attribute.BoolSlice(k("bools"), []bool{true, false, true}),
		attribute.BoolSlice(k("bools.empty"), []bool{}),
		attribute.Int64Slice(k("ints"), []int64{0, -1, 1, math.MaxInt64, math.MinInt64, 300}),
		attribute.Int64Slice(k("ints.one"), []int64{7}),
		attribute.Float64Slice(k("floats"), []float64{0, 1.5, -2.25, math.SmallestNonzeroFloat64}),
		attribute.StringSlice(k("strings"), []string{"a", "", strings.Repeat("b", 200), "ç"}),
		attribute.StringSlice(k("strings.empty"), nil),
		attribute.ByteSlice(k("bytes"), []byte{0, 1, 2, 0xff}),
		attribute.ByteSlice(k("bytes.empty"), []byte{}),
		attribute.Slice(k("slice"),
			attribute.StringValue("s"), attribute.Int64Value(1), attribute.BoolValue(false),
			attribute.Float64Value(2.5), attribute.ByteSliceValue([]byte("raw")),
			attribute.Int64SliceValue([]int64{1, 2}),
			attribute.SliceValue(attribute.StringValue("nested"), attribute.Value{}),
			attribute.MapValue(attribute.String("in", "map"), attribute.Int("n", 2)),
			attribute.Value{},
		),
		attribute.Slice(k("slice.empty")),
		attribute.Map(k("map"),
			attribute.String("z", "last"), attribute.String("a", "first"),
			attribute.Int64Slice("ints", []int64{3, 4}),
			attribute.Slice("list", attribute.StringValue(strings.Repeat("q", 150))),
			attribute.Map("inner", attribute.Bool("deep", true)),
			attribute.Float64("f", 0.5),
			attribute.KeyValue{Key: "nothing"},
		),
		attribute.Map(k("map.empty")),
	}
}

var (
	remoteTraceID = trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36}
	remoteSpanID  = trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7}
)

func mustTraceState(t testing.TB, s string) trace.TraceState {
	t.Helper()
	ts, err := trace.ParseTraceState(s)
	if err != nil {
		t.Fatal(err)
	}
	return ts
}

// sdkSpans records spans with real SDK tracer providers: two resources (one
// with a schema URL and attributes of every type), three scopes (one with
// version, schema URL and attributes), spans interleaved between them, every
// span kind, a remote parent with trace state, local parents, events with
// attributes, links (remote with trace state, local, unsampled), error and
// ok statuses, and span limits low enough to drop attributes, events, links
// and event and link attributes.
func sdkSpans(t testing.TB) []sdktrace.ReadOnlySpan {
	t.Helper()
	rec := tracetest.NewSpanRecorder()

	limits := sdktrace.NewSpanLimits()
	limits.AttributeCountLimit = 40
	limits.EventCountLimit = 3
	limits.LinkCountLimit = 3
	limits.AttributePerEventCountLimit = 2
	limits.AttributePerLinkCountLimit = 1

	res1 := resource.NewWithAttributes("https://opentelemetry.io/schemas/1.26.0",
		append([]attribute.KeyValue{attribute.String("service.name", "gateway")}, everyType("res.")...)...)
	res2 := resource.NewSchemaless(attribute.String("service.name", "shim"), attribute.Int("pid", 4242))
	tp1 := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithResource(res1),
		sdktrace.WithRawSpanLimits(limits), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	tp2 := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithResource(res2),
		sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() {
		_ = tp1.Shutdown(context.Background())
		_ = tp2.Shutdown(context.Background())
	})

	tA := tp1.Tracer("xiaoclaw/gateway",
		trace.WithInstrumentationVersion("1.2.3"),
		trace.WithSchemaURL("https://opentelemetry.io/schemas/1.24.0"),
		trace.WithInstrumentationAttributes(attribute.String("scope.kind", "http"), attribute.Int("scope.n", 3)))
	tB := tp1.Tracer("xiaoclaw/shim")
	tC := tp2.Tracer("xiaoclaw/devicehub", trace.WithInstrumentationVersion("0.1"))

	remote := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    remoteTraceID,
		SpanID:     remoteSpanID,
		TraceFlags: trace.FlagsSampled,
		TraceState: mustTraceState(t, "xc=tenant-7,vendor=abc"),
		Remote:     true,
	})
	unsampledRemote := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:  trace.SpanID{8, 7, 6, 5, 4, 3, 2, 1},
		Remote:  true,
	})
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), remote)

	// Server span under the remote parent, with every attribute type.
	sctx, server := tA.Start(ctx, "POST /v1/invoke", trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(everyType("span.")...))

	// A span of the other resource, between two of the first.
	_, c1 := tC.Start(context.Background(), "devicehub publish", trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("messaging.system", "nats")))
	c1.SetStatus(codes.Ok, "ignored by the SDK for ok")
	c1.End()

	// Internal child in another scope, with events, links and limits hit.
	_, child := tB.Start(sctx, "shim invoke", trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithLinks(
			// The oldest link goes when the limit is hit.
			trace.Link{SpanContext: remote},
			trace.Link{SpanContext: server.SpanContext()},
			trace.Link{SpanContext: unsampledRemote, Attributes: []attribute.KeyValue{attribute.Bool("link.c", true)}},
			trace.Link{SpanContext: remote, Attributes: []attribute.KeyValue{attribute.String("link.a", "1"), attribute.String("link.b", "2")}},
		))
	for i := range 5 {
		child.AddEvent(fmt.Sprintf("event %d", i), trace.WithAttributes(
			attribute.Int("i", i), attribute.String("s", "v"), attribute.Bool("dropped", true)),
			trace.WithTimestamp(time.Unix(1700000000, int64(i))))
	}
	child.AddEvent("") // no name, no attributes
	for i := range 45 {
		child.SetAttributes(attribute.Int(fmt.Sprintf("a%02d", i), i))
	}
	child.RecordError(fmt.Errorf("boom"))
	child.SetStatus(codes.Error, "invoke failed: device offline")
	child.End()

	// Every kind, in the first scope and on the second resource.
	for _, k := range []trace.SpanKind{trace.SpanKindUnspecified, trace.SpanKindInternal, trace.SpanKindServer,
		trace.SpanKindClient, trace.SpanKindProducer, trace.SpanKindConsumer} {
		_, s := tA.Start(sctx, "kind "+k.String(), trace.WithSpanKind(k))
		s.End()
		_, s = tC.Start(context.Background(), "kind "+k.String(), trace.WithSpanKind(k),
			trace.WithLinks(trace.Link{SpanContext: unsampledRemote}))
		s.SetStatus(codes.Ok, "")
		s.End()
	}

	// An empty name, a new root, an explicit timestamp and a span of about
	// 20 KiB (a three-byte length).
	_, s := tB.Start(sctx, "", trace.WithNewRoot(), trace.WithTimestamp(time.Unix(1, 5)))
	s.End(trace.WithTimestamp(time.Unix(2, 7)))
	_, s = tB.Start(sctx, "big", trace.WithAttributes(attribute.String("blob", strings.Repeat("b", 20000))))
	s.End()

	// String attributes whose value, AnyValue and KeyValue lengths each
	// cross 127/128 bytes (a two-byte length), and keys of those lengths.
	var lengths []attribute.KeyValue
	for n := 112; n <= 130; n++ {
		lengths = append(lengths, attribute.String(fmt.Sprintf("len.%03d", n), strings.Repeat("v", n)))
	}
	lengths = append(lengths,
		attribute.String(strings.Repeat("k", 127), ""),
		attribute.String(strings.Repeat("K", 128), "v"))
	_, s = tB.Start(sctx, "lengths", trace.WithAttributes(lengths...))
	s.End()

	server.SetStatus(codes.Error, "")
	server.End()

	spans := rec.Ended()
	if len(spans) < 10 {
		t.Fatalf("recorded %d spans", len(spans))
	}
	var droppedAttrs, droppedEvents, droppedLinks, droppedEventAttrs, droppedLinkAttrs bool
	for _, sp := range spans {
		droppedAttrs = droppedAttrs || sp.DroppedAttributes() > 0
		droppedEvents = droppedEvents || sp.DroppedEvents() > 0
		droppedLinks = droppedLinks || sp.DroppedLinks() > 0
		for _, ev := range sp.Events() {
			droppedEventAttrs = droppedEventAttrs || ev.DroppedAttributeCount > 0
		}
		for _, l := range sp.Links() {
			droppedLinkAttrs = droppedLinkAttrs || l.DroppedAttributeCount > 0
		}
	}
	if !droppedAttrs || !droppedEvents || !droppedLinks || !droppedEventAttrs || !droppedLinkAttrs {
		t.Fatalf("span limits did not drop everything they should: attrs %v events %v links %v event attrs %v link attrs %v",
			droppedAttrs, droppedEvents, droppedLinks, droppedEventAttrs, droppedLinkAttrs)
	}
	return spans
}

// stubSpans covers what the SDK never produces but a ReadOnlySpan may hold:
// a nil resource, a zero scope and a scope with only a schema URL, unknown
// kinds and status codes, negative and huge dropped counts, zero times,
// empty values and keys, an invalid link, and a scope group over 2 MiB (a
// four-byte length).
func stubSpans(t testing.TB) []sdktrace.ReadOnlySpan {
	t.Helper()
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    remoteTraceID,
		SpanID:     trace.SpanID{9, 9, 9, 9, 9, 9, 9, 9},
		TraceFlags: trace.FlagsSampled | 0x80,
		TraceState: mustTraceState(t, "k=v"),
	})
	local := trace.NewSpanContext(trace.SpanContextConfig{TraceID: remoteTraceID, SpanID: remoteSpanID})
	schemaOnly := instrumentation.Scope{SchemaURL: "https://example.com/schema"}
	withAttrs := instrumentation.Scope{Name: "stub", Attributes: attribute.NewSet(everyType("scope.")...)}
	stubs := tracetest.SpanStubs{
		{
			Name:        "zero scope, nil resource",
			SpanContext: sc,
			Parent:      local,
			SpanKind:    trace.SpanKind(42),
			Attributes: append(everyType(""),
				attribute.KeyValue{Key: "empty"},
				attribute.KeyValue{Key: "", Value: attribute.StringValue("no key")},
				attribute.KeyValue{},
			),
			Events: []sdktrace.Event{
				{Name: "zero time"},
				{Name: "negative drop", DroppedAttributeCount: -3, Time: time.Unix(0, 1)},
				{Name: "huge drop", DroppedAttributeCount: math.MaxInt, Time: time.Unix(-5, 0)},
			},
			Links: []sdktrace.Link{
				{},
				{SpanContext: sc, DroppedAttributeCount: math.MaxInt, Attributes: []attribute.KeyValue{attribute.KeyValue{Key: "e"}}},
			},
			Status:            sdktrace.Status{Code: codes.Code(7), Description: "unknown code"},
			DroppedAttributes: -1,
			DroppedEvents:     math.MaxInt,
			DroppedLinks:      1 << 20,
		},
		{
			Name:                 "schema-only scope",
			SpanContext:          sc,
			StartTime:            time.Unix(1700000000, 123),
			EndTime:              time.Unix(1700000001, 456),
			InstrumentationScope: schemaOnly,
			Resource:             resource.Empty(),
			Status:               sdktrace.Status{Code: codes.Ok, Description: "ok with a message"},
		},
		{
			Name:                 "scope attributes",
			SpanContext:          local,
			InstrumentationScope: withAttrs,
			Resource:             resource.NewWithAttributes("https://example.com/r", attribute.String("r", "x")),
			Status:               sdktrace.Status{Code: codes.Unset, Description: "unset with a message"},
		},
		{
			Name:                 "over 2 MiB",
			SpanContext:          local,
			InstrumentationScope: instrumentation.Scope{Name: "huge"},
			Resource:             resource.NewWithAttributes("https://example.com/r", attribute.String("r", "x")),
			Attributes:           []attribute.KeyValue{attribute.String("blob", strings.Repeat("h", 2<<20+10))},
		},
		{
			Name:                 "same group as the first",
			SpanContext:          sc,
			InstrumentationScope: instrumentation.Scope{},
			Resource:             resource.Empty(),
		},
	}
	return stubs.Snapshots()
}

// officialBody exports spans with otlptracehttp and returns the request body
// it sent.
func officialBody(t testing.TB, spans []sdktrace.ReadOnlySpan) []byte {
	t.Helper()
	var (
		mu     sync.Mutex
		bodies [][]byte
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := readBody(r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		bodies = append(bodies, b)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer srv.Close()

	ctx := context.Background()
	exp, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(srv.URL+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	if err := exp.ExportSpans(ctx, spans); err != nil {
		t.Fatal(err)
	}
	if err := exp.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 1 {
		t.Fatalf("official exporter sent %d requests, want 1", len(bodies))
	}
	return bodies[0]
}

// readBody returns a request's body, gunzipped when it says so.
func readBody(r *http.Request) ([]byte, error) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			return nil, err
		}
		body = zr
	}
	return io.ReadAll(body)
}

func unmarshalRequest(t testing.TB, b []byte) *coltracepb.ExportTraceServiceRequest {
	t.Helper()
	req := new(coltracepb.ExportTraceServiceRequest)
	if err := proto.Unmarshal(b, req); err != nil {
		t.Fatalf("unmarshal: %v", err)
	}
	return req
}

// requireSameRequest compares two requests with proto.Equal, taking the
// resources in any order (the official exporter's order is random), and on
// a difference names the first differing resource, scope or span.
func requireSameRequest(t testing.TB, want, got *coltracepb.ExportTraceServiceRequest) {
	t.Helper()
	if len(want.ResourceSpans) != len(got.ResourceSpans) {
		t.Fatalf("%d resource groups, want %d", len(got.ResourceSpans), len(want.ResourceSpans))
	}
	ordered := make([]*tracepb.ResourceSpans, 0, len(got.ResourceSpans))
	for _, g := range got.ResourceSpans {
		i := slices.IndexFunc(want.ResourceSpans, func(w *tracepb.ResourceSpans) bool {
			return proto.Equal(w.Resource, g.Resource) && w.SchemaUrl == g.SchemaUrl
		})
		if i < 0 {
			t.Fatalf("resource group not sent by the official exporter:\n%s", short(g.Resource))
		}
		ordered = append(ordered, want.ResourceSpans[i])
	}
	for ri, w := range ordered {
		g := got.ResourceSpans[ri]
		if len(w.ScopeSpans) != len(g.ScopeSpans) {
			t.Fatalf("resource %d: %d scope groups, want %d", ri, len(g.ScopeSpans), len(w.ScopeSpans))
		}
		for si, ws := range w.ScopeSpans {
			gs := g.ScopeSpans[si]
			if !proto.Equal(ws.Scope, gs.Scope) || ws.SchemaUrl != gs.SchemaUrl {
				t.Fatalf("resource %d scope %d:\ngot  %s %q\nwant %s %q", ri, si, short(gs.Scope), gs.SchemaUrl, short(ws.Scope), ws.SchemaUrl)
			}
			if len(ws.Spans) != len(gs.Spans) {
				t.Fatalf("resource %d scope %d: %d spans, want %d", ri, si, len(gs.Spans), len(ws.Spans))
			}
			for i := range ws.Spans {
				if !proto.Equal(ws.Spans[i], gs.Spans[i]) {
					t.Fatalf("resource %d scope %d span %d differs:\ngot  %s\nwant %s", ri, si, i, short(gs.Spans[i]), short(ws.Spans[i]))
				}
			}
		}
	}
	// Everything above should imply this; it also covers fields the loops
	// do not look at.
	wantOrdered := &coltracepb.ExportTraceServiceRequest{ResourceSpans: ordered}
	if !proto.Equal(wantOrdered, got) {
		t.Fatal("requests differ")
	}
}

func short(m proto.Message) string {
	s := prototext.MarshalOptions{}.Format(m)
	if len(s) > 4000 {
		s = s[:4000] + "…"
	}
	return s
}

// TestConformance is the main guarantee of the package: for the same spans,
// the request AppendExportRequest encodes is proto.Equal to the one the
// official otlptracehttp exporter sends.
func TestConformance(t *testing.T) {
	sdk := sdkSpans(t)
	stubs := stubSpans(t)
	cases := map[string][]sdktrace.ReadOnlySpan{
		"sdk":   sdk,
		"stubs": stubs,
		// Resource and scope groups that were already seen, interleaved,
		// and nil spans, which both exporters skip.
		"mixed": append(append(append([]sdktrace.ReadOnlySpan{nil}, stubs...), sdk...), nil, stubs[0], sdk[0]),
		"one":   sdk[:1],
	}
	for name, spans := range cases {
		t.Run(name, func(t *testing.T) {
			want := unmarshalRequest(t, officialBody(t, spans))
			got := unmarshalRequest(t, AppendExportRequest(nil, spans))
			requireSameRequest(t, want, got)

			var n int
			for _, rs := range got.ResourceSpans {
				for _, ss := range rs.ScopeSpans {
					n += len(ss.Spans)
				}
			}
			if nonNil := len(spans) - countNil(spans); n != nonNil {
				t.Fatalf("encoded %d spans, want %d", n, nonNil)
			}
		})
	}
}

// TestConformanceBytes: with a single resource the official exporter's order
// is deterministic, and the bytes are the same too — same field order, same
// minimal lengths.
func TestConformanceBytes(t *testing.T) {
	for name, all := range map[string][]sdktrace.ReadOnlySpan{"sdk": sdkSpans(t), "stubs": stubSpans(t)} {
		t.Run(name, func(t *testing.T) {
			first := all[0].Resource().Equivalent()
			var spans []sdktrace.ReadOnlySpan
			for _, s := range all {
				if s.Resource().Equivalent() == first {
					spans = append(spans, s)
				}
			}
			want := officialBody(t, spans)
			got := AppendExportRequest(nil, spans)
			if !bytes.Equal(want, got) {
				i := 0
				for i < len(want) && i < len(got) && want[i] == got[i] {
					i++
				}
				t.Fatalf("bodies differ at byte %d (lengths %d and %d)", i, len(got), len(want))
			}
		})
	}
}

func countNil(spans []sdktrace.ReadOnlySpan) int {
	n := 0
	for _, s := range spans {
		if s == nil {
			n++
		}
	}
	return n
}

// TestGroupOrder: resources and, within them, scopes come in the order of
// their first span, and spans keep their order within a scope.
func TestGroupOrder(t *testing.T) {
	r1 := resource.NewSchemaless(attribute.String("service.name", "one"))
	r2 := resource.NewSchemaless(attribute.String("service.name", "two"))
	sA := instrumentation.Scope{Name: "a"}
	sB := instrumentation.Scope{Name: "b"}
	var stubs tracetest.SpanStubs
	add := func(name string, r *resource.Resource, s instrumentation.Scope) {
		stubs = append(stubs, tracetest.SpanStub{Name: name, Resource: r, InstrumentationScope: s})
	}
	add("1", r2, sB)
	add("2", r1, sA)
	add("3", r2, sA)
	add("4", r2, sB)
	add("5", r1, sA)
	add("6", r2, sA)
	got := unmarshalRequest(t, AppendExportRequest(nil, stubs.Snapshots()))
	var b strings.Builder
	for _, rs := range got.ResourceSpans {
		fmt.Fprintf(&b, "%s:", rs.Resource.Attributes[0].Value.GetStringValue())
		for _, ss := range rs.ScopeSpans {
			fmt.Fprintf(&b, " %s(", ss.Scope.Name)
			for _, s := range ss.Spans {
				b.WriteString(s.Name)
			}
			b.WriteString(")")
		}
		b.WriteString("; ")
	}
	if want := "two: b(14) a(36); one: a(25); "; b.String() != want {
		t.Fatalf("groups %q, want %q", b.String(), want)
	}
}

// TestManyGroups crosses the point where the encoder switches from scanning
// its groups to a map, twice in a row with the same encoder.
func TestManyGroups(t *testing.T) {
	var stubs tracetest.SpanStubs
	for i := range 3 * maxScanGroups {
		r := resource.NewSchemaless(attribute.Int("r", i%3))
		stubs = append(stubs, tracetest.SpanStub{
			Name:                 fmt.Sprint(i),
			Resource:             r,
			InstrumentationScope: instrumentation.Scope{Name: fmt.Sprint("s", i%(2*maxScanGroups))},
		})
	}
	spans := stubs.Snapshots()
	spans = append(spans, spans...)
	want := unmarshalRequest(t, officialBody(t, spans))
	var buf []byte
	for range 2 {
		buf = AppendExportRequest(buf[:0], spans)
		requireSameRequest(t, want, unmarshalRequest(t, buf))
	}
}

func TestEmpty(t *testing.T) {
	if b := AppendExportRequest([]byte("x"), nil); string(b) != "x" {
		t.Fatalf("got %q", b)
	}
	if b := AppendExportRequest(nil, []sdktrace.ReadOnlySpan{nil, nil}); len(b) != 0 {
		t.Fatalf("got %q", b)
	}
}

// TestAppendsToDst: the request is appended after what dst holds.
func TestAppendsToDst(t *testing.T) {
	spans := sdkSpans(t)[:3]
	alone := AppendExportRequest(nil, spans)
	prefixed := AppendExportRequest([]byte("prefix"), spans)
	if string(prefixed[:6]) != "prefix" || !bytes.Equal(prefixed[6:], alone) {
		t.Fatal("AppendExportRequest did not append")
	}
}

// TestMessageLengths checks beginMessage/endMessage around every varint size
// boundary, for every reservation: the result must be what protowire writes
// with a minimal length.
func TestMessageLengths(t *testing.T) {
	for _, n := range []int{0, 1, 127, 128, 300, 16383, 16384, 1<<21 - 1, 1 << 21} {
		content := bytes.Repeat([]byte{0xab}, n)
		want := protowire.AppendBytes(protowire.AppendTag([]byte("pre"), 5, protowire.BytesType), content)
		for reserve := 1; reserve <= 3; reserve++ {
			b, m := beginMessage([]byte("pre"), 5, reserve)
			b = append(b, content...)
			b = endMessage(b, m)
			if !bytes.Equal(b, want) {
				t.Fatalf("length %d, reserve %d: wrong encoding", n, reserve)
			}
		}
	}
}

func TestTraceState(t *testing.T) {
	for _, s := range []string{"", "a=b", "xc=tenant-7,vendor=abc", "a=1,b=2,c=3,d=4"} {
		ts := mustTraceState(t, s)
		b := appendTraceState(nil, 3, ts)
		if s == "" {
			if len(b) != 0 {
				t.Fatalf("empty trace state wrote %q", b)
			}
			continue
		}
		want := protowire.AppendString(protowire.AppendTag(nil, 3, protowire.BytesType), ts.String())
		if !bytes.Equal(b, want) {
			t.Fatalf("trace state %q: got %q, want %q", s, b, want)
		}
	}
}

// TestNoAllocations: once dst has grown, encoding spans with scalar
// attributes, events, links and trace state allocates nothing.
func TestNoAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are meaningless under the race detector")
	}
	spans := benchSpans(t, 64)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	remote := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: remoteTraceID, SpanID: remoteSpanID, TraceFlags: trace.FlagsSampled,
		TraceState: mustTraceState(t, "a=b,c=d"), Remote: true,
	})
	_, s := tp.Tracer("t").Start(trace.ContextWithRemoteSpanContext(context.Background(), remote), "linked",
		trace.WithLinks(trace.Link{SpanContext: remote, Attributes: []attribute.KeyValue{attribute.Int("n", 1)}}))
	s.AddEvent("e", trace.WithAttributes(attribute.Float64("f", 1), attribute.Bool("b", true)))
	s.SetStatus(codes.Error, "x")
	s.End()
	spans = append(spans, rec.Ended()...)

	buf := AppendExportRequest(nil, spans)
	allocs := testing.AllocsPerRun(50, func() {
		buf = AppendExportRequest(buf[:0], spans)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per encoding, want 0", allocs)
	}
}
