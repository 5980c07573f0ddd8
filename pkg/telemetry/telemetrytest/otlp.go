package telemetrytest

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// ReceivedSpan is one span as an OTLP receiver decoded it.
type ReceivedSpan struct {
	Protocol     string // "grpc" or "http/protobuf"
	Service      string // resource service.name
	Resource     map[string]string
	Name         string
	Kind         string // "server", "client", ...
	TraceID      string // lowercase hex
	SpanID       string
	ParentSpanID string // "" for a root span
	Attributes   map[string]string
	StatusError  bool
}

// OTLPReceiver is an in-process OTLP trace receiver listening on loopback
// with both transports, the way a collector or Jaeger would.
type OTLPReceiver struct {
	// HTTPURL is the base URL of the OTLP/HTTP endpoint (POST /v1/traces).
	HTTPURL string
	// GRPCURL is the URL of the OTLP/gRPC endpoint.
	GRPCURL string

	mu      sync.Mutex
	spans   []ReceivedSpan
	headers []http.Header // of HTTP requests, for header tests
	changed chan struct{}
}

// StartOTLPReceiver starts a receiver that stops when the test ends.
func StartOTLPReceiver(t testing.TB) *OTLPReceiver {
	t.Helper()
	r := &OTLPReceiver{changed: make(chan struct{})}

	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("telemetrytest: listen: %v", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", r.serveHTTP)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(hl) }()
	r.HTTPURL = "http://" + hl.Addr().String()

	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("telemetrytest: listen: %v", err)
	}
	gs := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(gs, grpcTraceService{r: r})
	go func() { _ = gs.Serve(gl) }()
	r.GRPCURL = "http://" + gl.Addr().String()

	t.Cleanup(func() {
		gs.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
	})
	return r
}

// Env returns OTEL_* variables that send a provider's spans to r over
// protocol ("grpc" or "http/protobuf"), exported at once.
func (r *OTLPReceiver) Env(protocol string) map[string]string {
	ep := r.HTTPURL
	if protocol == "grpc" {
		ep = r.GRPCURL
	}
	return map[string]string{
		"OTEL_TRACES_EXPORTER":        "otlp",
		"OTEL_EXPORTER_OTLP_PROTOCOL": protocol,
		"OTEL_EXPORTER_OTLP_ENDPOINT": ep,
		"OTEL_BSP_SCHEDULE_DELAY":     "10",
	}
}

// Spans returns the spans received so far.
func (r *OTLPReceiver) Spans() []ReceivedSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]ReceivedSpan(nil), r.spans...)
}

// HTTPHeaders returns the headers of the HTTP export requests so far.
func (r *OTLPReceiver) HTTPHeaders() []http.Header {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]http.Header(nil), r.headers...)
}

// WaitForTrace waits until n spans of trace traceID (hex) arrived and
// returns them, failing the test after WaitTimeout.
func (r *OTLPReceiver) WaitForTrace(t testing.TB, traceID string, n int) []ReceivedSpan {
	t.Helper()
	deadline := time.NewTimer(WaitTimeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		var got []ReceivedSpan
		for _, s := range r.spans {
			if s.TraceID == traceID {
				got = append(got, s)
			}
		}
		changed := r.changed
		r.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("telemetrytest: %d spans of trace %s expected, %d arrived within %s (all: %+v)", n, traceID, len(got), WaitTimeout, r.Spans())
		}
	}
}

func (r *OTLPReceiver) add(protocol string, req *coltracepb.ExportTraceServiceRequest, h http.Header) {
	var spans []ReceivedSpan
	for _, rs := range req.GetResourceSpans() {
		res := kvMap(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				rsp := ReceivedSpan{
					Protocol:    protocol,
					Service:     res["service.name"],
					Resource:    res,
					Name:        s.GetName(),
					Kind:        spanKind(s.GetKind()),
					TraceID:     hex.EncodeToString(s.GetTraceId()),
					SpanID:      hex.EncodeToString(s.GetSpanId()),
					Attributes:  kvMap(s.GetAttributes()),
					StatusError: s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR,
				}
				if len(s.GetParentSpanId()) > 0 {
					rsp.ParentSpanID = hex.EncodeToString(s.GetParentSpanId())
				}
				spans = append(spans, rsp)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, spans...)
	if h != nil {
		r.headers = append(r.headers, h.Clone())
	}
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

func (r *OTLPReceiver) serveHTTP(w http.ResponseWriter, req *http.Request) {
	if ct := req.Header.Get("Content-Type"); ct != "application/x-protobuf" {
		http.Error(w, fmt.Sprintf("content type %q: only application/x-protobuf is supported", ct), http.StatusUnsupportedMediaType)
		return
	}
	var body io.Reader = http.MaxBytesReader(w, req.Body, 16<<20)
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(body)
		if err != nil {
			http.Error(w, "bad gzip body", http.StatusBadRequest)
			return
		}
		defer zr.Close()
		body = zr
	}
	b, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
		return
	}
	var msg coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(b, &msg); err != nil {
		http.Error(w, "decode ExportTraceServiceRequest: "+err.Error(), http.StatusBadRequest)
		return
	}
	r.add("http/protobuf", &msg, req.Header)
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

type grpcTraceService struct {
	coltracepb.UnimplementedTraceServiceServer
	r *OTLPReceiver
}

func (g grpcTraceService) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	g.r.add("grpc", req, nil)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func kvMap(kvs []*commonpb.KeyValue) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		v := kv.GetValue()
		switch x := v.GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = x.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = fmt.Sprint(x.IntValue)
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = fmt.Sprint(x.BoolValue)
		case *commonpb.AnyValue_DoubleValue:
			m[kv.GetKey()] = fmt.Sprint(x.DoubleValue)
		default:
			m[kv.GetKey()] = v.String()
		}
	}
	return m
}

func spanKind(k tracepb.Span_SpanKind) string {
	switch k {
	case tracepb.Span_SPAN_KIND_SERVER:
		return "server"
	case tracepb.Span_SPAN_KIND_CLIENT:
		return "client"
	case tracepb.Span_SPAN_KIND_PRODUCER:
		return "producer"
	case tracepb.Span_SPAN_KIND_CONSUMER:
		return "consumer"
	case tracepb.Span_SPAN_KIND_INTERNAL:
		return "internal"
	default:
		return "unspecified"
	}
}
