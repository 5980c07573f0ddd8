package telemetry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry/otlphttp"
)

// Config of a tracer provider. The OTEL_* variables (see docs/observability.md)
// come through Env; the fields cover what only the program knows.
type Config struct {
	// Env looks up an environment variable, usually os.Getenv. Nil means no
	// variable is set: tracing is off unless SpanProcessor is given.
	Env func(string) string
	// Instance becomes service.instance.id (main passes --instance).
	Instance string
	// Version becomes service.version.
	Version string
	// SharedProcess says several services run in this process with one
	// environment (`xiaoclaw dev`). Then OTEL_SERVICE_NAME and a service.name
	// in OTEL_RESOURCE_ATTRIBUTES are ignored, so every provider keeps the
	// service name it was created with.
	SharedProcess bool
	// SpanProcessor, when set, receives every span besides the configured
	// exporters, and turns tracing on by itself (tests: an in-memory recorder).
	SpanProcessor sdktrace.SpanProcessor
	// ConsoleWriter receives the spans of OTEL_TRACES_EXPORTER=console, one
	// JSON object each; required for that exporter.
	ConsoleWriter io.Writer
}

// TracerProvider is one service's tracer provider: the OpenTelemetry SDK
// when tracing is on, a no-op provider when it is off.
type TracerProvider struct {
	trace.TracerProvider
	sdk     *sdktrace.TracerProvider
	batches []*BatchProcessor // one per exporter
	service string
	summary string
}

// Enabled reports whether spans are recorded and exported.
func (p *TracerProvider) Enabled() bool { return p.sdk != nil }

// DroppedSpans is the number of spans dropped so far because an exporter's
// queue was full (a slow or unreachable backend).
func (p *TracerProvider) DroppedSpans() uint64 {
	var n uint64
	for _, b := range p.batches {
		n += b.Dropped()
	}
	return n
}

// ServiceName is the service.name the provider's spans carry.
func (p *TracerProvider) ServiceName() string { return p.service }

// String describes the configuration for a start-up log line (no secrets).
func (p *TracerProvider) String() string { return p.summary }

// ForceFlush exports every finished span now.
func (p *TracerProvider) ForceFlush(ctx context.Context) error {
	if p.sdk == nil {
		return nil
	}
	return p.sdk.ForceFlush(ctx)
}

// Shutdown flushes the spans still queued and stops the exporters. Call it
// last when a service stops; calling it again does nothing.
func (p *TracerProvider) Shutdown(ctx context.Context) error {
	if p.sdk == nil {
		return nil
	}
	return p.sdk.Shutdown(ctx)
}

// NewTracerProvider builds the tracer provider of one service from cfg and
// the standard OTEL_* variables. It never installs a global provider. With
// tracing off it returns a no-op provider whose spans cost next to nothing.
//
// Tracing is on when OTEL_TRACES_EXPORTER names an exporter, or when it is
// unset and an OTLP endpoint variable is set, or when cfg.SpanProcessor is
// given; OTEL_SDK_DISABLED=true turns it off whatever else is set.
func NewTracerProvider(ctx context.Context, serviceName string, cfg Config) (*TracerProvider, error) {
	if serviceName == "" {
		return nil, errors.New("telemetry: service name is required")
	}
	env := cfg.Env
	if env == nil {
		env = func(string) string { return "" }
	}
	s, err := parseTraceEnv(env)
	if err != nil {
		return nil, err
	}
	name := serviceName
	if !cfg.SharedProcess {
		if n, ok := s.resourceServiceName(); ok {
			name = n
		}
		if s.serviceName != "" {
			name = s.serviceName
		}
	}
	if s.disabled || (len(s.exporters) == 0 && cfg.SpanProcessor == nil) {
		return &TracerProvider{TracerProvider: noop.NewTracerProvider(), service: name, summary: "tracing off"}, nil
	}
	if !compiledIn {
		return &TracerProvider{TracerProvider: noop.NewTracerProvider(), service: name,
			summary: "tracing off: compiled out of this build (xc_omit_tracing)"}, nil
	}

	opts := []sdktrace.TracerProviderOption{
		sdktrace.WithSampler(s.sampler),
		sdktrace.WithResource(s.resource(name, cfg)),
	}
	var batches []*BatchProcessor
	summary := []string{"sampler=" + s.samplerDesc}
	for _, kind := range s.exporters {
		exp, desc, err := s.newExporter(ctx, kind, cfg)
		if err != nil {
			for _, b := range batches { // stops its goroutine and its exporter
				_ = b.Shutdown(ctx)
			}
			return nil, err
		}
		summary = append(summary, desc)
		batch := NewBatchProcessor(exp, s.batchOptions())
		batches = append(batches, batch)
		opts = append(opts, sdktrace.WithSpanProcessor(batch))
	}
	if cfg.SpanProcessor != nil {
		opts = append(opts, sdktrace.WithSpanProcessor(cfg.SpanProcessor))
		summary = append(summary, "extra span processor")
	}
	stp := sdktrace.NewTracerProvider(opts...)
	return &TracerProvider{
		TracerProvider: stp,
		sdk:            stp,
		batches:        batches,
		service:        name,
		summary:        "tracing on: " + strings.Join(summary, ", "),
	}, nil
}

// traceSettings is what the OTEL_* variables ask for.
type traceSettings struct {
	disabled    bool
	exporters   []string // "otlp", "console"
	protocol    string   // "grpc" or "http/protobuf"
	endpoint    string   // as configured, "" for the default
	signalURL   bool     // endpoint came from the traces-specific variable
	insecure    bool     // for a gRPC endpoint without a scheme
	headers     map[string]string
	timeout     time.Duration
	compression string // "gzip" or ""
	sampler     sdktrace.Sampler
	samplerDesc string
	serviceName string
	attrs       []attribute.KeyValue // OTEL_RESOURCE_ATTRIBUTES in order

	bspDelay, bspExportTimeout time.Duration
	bspQueue, bspBatch         int
}

const (
	protocolGRPC = "grpc"
	protocolHTTP = "http/protobuf"
)

func parseTraceEnv(env func(string) string) (traceSettings, error) {
	var s traceSettings
	get := func(k string) string { return strings.TrimSpace(env(k)) }
	// signal-specific variable first, then the generic one
	pick := func(signal, generic string) (string, string) {
		if v := get(signal); v != "" {
			return v, signal
		}
		return get(generic), generic
	}

	if v := get("OTEL_SDK_DISABLED"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return s, fmt.Errorf("telemetry: OTEL_SDK_DISABLED=%q: want true or false", v)
		}
		s.disabled = b
	}

	endpoint, endpointVar := pick("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
	s.endpoint, s.signalURL = endpoint, endpointVar == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"

	switch v := strings.ToLower(get("OTEL_TRACES_EXPORTER")); v {
	case "":
		// The specification's default is otlp; exporting to a collector
		// nobody configured would only produce errors, so an unset variable
		// means otlp only when an endpoint is given.
		if endpoint != "" {
			s.exporters = []string{"otlp"}
		}
	case "none":
	default:
		for _, e := range strings.Split(v, ",") {
			switch e = strings.TrimSpace(e); e {
			case "otlp", "console":
				s.exporters = append(s.exporters, e)
			case "none":
				return s, fmt.Errorf("telemetry: OTEL_TRACES_EXPORTER=%q: none cannot be combined with other exporters", v)
			default:
				return s, fmt.Errorf("telemetry: OTEL_TRACES_EXPORTER=%q: unsupported exporter %q (want otlp, console or none)", v, e)
			}
		}
	}

	proto, protoVar := pick("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
	switch proto {
	case "":
		s.protocol = protocolHTTP
	case protocolGRPC, protocolHTTP:
		s.protocol = proto
	default:
		return s, fmt.Errorf("telemetry: %s=%q: want grpc or http/protobuf", protoVar, proto)
	}

	if v, name := pick("OTEL_EXPORTER_OTLP_TRACES_INSECURE", "OTEL_EXPORTER_OTLP_INSECURE"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return s, fmt.Errorf("telemetry: %s=%q: want true or false", name, v)
		}
		s.insecure = b
	}

	if v, name := pick("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS"); v != "" {
		kvs, err := parseKeyValues(v)
		if err != nil {
			// The value may hold credentials: never echo it.
			return s, fmt.Errorf("telemetry: %s: %w", name, err)
		}
		s.headers = make(map[string]string, len(kvs))
		for _, kv := range kvs {
			s.headers[kv[0]] = kv[1]
		}
	}

	s.timeout = 10 * time.Second
	if v, name := pick("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT"); v != "" {
		d, err := parseMillis(name, v)
		if err != nil {
			return s, err
		}
		s.timeout = d
	}

	switch v, name := pick("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "OTEL_EXPORTER_OTLP_COMPRESSION"); v {
	case "", "none":
	case "gzip":
		s.compression = "gzip"
	default:
		return s, fmt.Errorf("telemetry: %s=%q: want gzip or none", name, v)
	}

	sampler, desc, err := parseSampler(get("OTEL_TRACES_SAMPLER"), get("OTEL_TRACES_SAMPLER_ARG"))
	if err != nil {
		return s, err
	}
	s.sampler, s.samplerDesc = sampler, desc

	s.serviceName = get("OTEL_SERVICE_NAME")
	if v := get("OTEL_RESOURCE_ATTRIBUTES"); v != "" {
		kvs, err := parseKeyValues(v)
		if err != nil {
			return s, fmt.Errorf("telemetry: OTEL_RESOURCE_ATTRIBUTES: %w", err)
		}
		for _, kv := range kvs {
			s.attrs = append(s.attrs, attribute.String(kv[0], kv[1]))
		}
	}

	for _, d := range []struct {
		name string
		dst  *time.Duration
	}{{"OTEL_BSP_SCHEDULE_DELAY", &s.bspDelay}, {"OTEL_BSP_EXPORT_TIMEOUT", &s.bspExportTimeout}} {
		if v := get(d.name); v != "" {
			if *d.dst, err = parseMillis(d.name, v); err != nil {
				return s, err
			}
		}
	}
	for _, n := range []struct {
		name string
		dst  *int
	}{{"OTEL_BSP_MAX_QUEUE_SIZE", &s.bspQueue}, {"OTEL_BSP_MAX_EXPORT_BATCH_SIZE", &s.bspBatch}} {
		if v := get(n.name); v != "" {
			i, err := strconv.Atoi(v)
			if err != nil || i <= 0 {
				return s, fmt.Errorf("telemetry: %s=%q: want a positive integer", n.name, v)
			}
			*n.dst = i
		}
	}
	return s, nil
}

func parseMillis(name, v string) (time.Duration, error) {
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms < 0 || ms > int64(24*time.Hour/time.Millisecond) {
		return 0, fmt.Errorf("telemetry: %s=%q: want milliseconds as a non-negative integer", name, v)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// parseSampler follows the OTEL_TRACES_SAMPLER values of the specification;
// the default is parentbased_always_on, so a service follows the caller's
// sampling decision carried in traceparent.
func parseSampler(name, arg string) (sdktrace.Sampler, string, error) {
	ratio := func() (float64, error) {
		if arg == "" {
			return 1, nil
		}
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return 0, fmt.Errorf("telemetry: OTEL_TRACES_SAMPLER_ARG=%q: want a ratio between 0 and 1", arg)
		}
		return r, nil
	}
	switch strings.ToLower(name) {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), "parentbased_always_on", nil
	case "always_on":
		return sdktrace.AlwaysSample(), "always_on", nil
	case "always_off":
		return sdktrace.NeverSample(), "always_off", nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), "parentbased_always_off", nil
	case "traceidratio":
		r, err := ratio()
		if err != nil {
			return nil, "", err
		}
		return sdktrace.TraceIDRatioBased(r), "traceidratio(" + strconv.FormatFloat(r, 'g', -1, 64) + ")", nil
	case "parentbased_traceidratio":
		r, err := ratio()
		if err != nil {
			return nil, "", err
		}
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)), "parentbased_traceidratio(" + strconv.FormatFloat(r, 'g', -1, 64) + ")", nil
	default:
		return nil, "", fmt.Errorf("telemetry: OTEL_TRACES_SAMPLER=%q: want always_on, always_off, traceidratio or their parentbased_ forms", name)
	}
}

// parseKeyValues parses the "k1=v1,k2=v2" form of OTEL_RESOURCE_ATTRIBUTES
// and OTEL_EXPORTER_OTLP_HEADERS; values are percent-decoded. Errors never
// quote values, which may be credentials.
func parseKeyValues(s string) ([][2]string, error) {
	var out [][2]string
	for i, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		k, v, ok := strings.Cut(item, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("entry %d is not key=value", i+1)
		}
		dv, err := url.PathUnescape(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("entry %d (%s): bad percent-encoding", i+1, k)
		}
		out = append(out, [2]string{k, dv})
	}
	return out, nil
}

func (s traceSettings) resourceServiceName() (string, bool) {
	for i := len(s.attrs) - 1; i >= 0; i-- {
		if s.attrs[i].Key == semconv.ServiceNameKey {
			return s.attrs[i].Value.AsString(), true
		}
	}
	return "", false
}

// resource builds the resource: SDK facts, namespace "xiaoclaw", instance
// and version from cfg, then OTEL_RESOURCE_ATTRIBUTES (which may override
// all of them), then service.name as decided by the caller.
func (s traceSettings) resource(service string, cfg Config) *resource.Resource {
	attrs := []attribute.KeyValue{
		semconv.TelemetrySDKName("opentelemetry"),
		semconv.TelemetrySDKLanguageGo,
		semconv.TelemetrySDKVersion(sdk.Version()),
		semconv.ServiceNamespace("xiaoclaw"),
	}
	if cfg.Instance != "" {
		attrs = append(attrs, semconv.ServiceInstanceID(cfg.Instance))
	}
	if cfg.Version != "" {
		attrs = append(attrs, semconv.ServiceVersion(cfg.Version))
	}
	for _, a := range s.attrs {
		if a.Key != semconv.ServiceNameKey {
			attrs = append(attrs, a)
		}
	}
	attrs = append(attrs, semconv.ServiceName(service))
	// NewWithAttributes keeps the last value of a repeated key.
	return resource.NewWithAttributes(semconv.SchemaURL, attrs...)
}

func (s traceSettings) batchOptions() BatchOptions {
	return BatchOptions{ScheduleDelay: s.bspDelay, ExportTimeout: s.bspExportTimeout, MaxQueueSize: s.bspQueue, MaxExportBatch: s.bspBatch}
}

// newExporter builds one exporter and a description of it for logs.
func (s traceSettings) newExporter(ctx context.Context, kind string, cfg Config) (sdktrace.SpanExporter, string, error) {
	if kind == "console" {
		if cfg.ConsoleWriter == nil {
			return nil, "", errors.New("telemetry: OTEL_TRACES_EXPORTER=console needs Config.ConsoleWriter")
		}
		exp, err := stdouttrace.New(stdouttrace.WithWriter(cfg.ConsoleWriter))
		if err != nil {
			return nil, "", fmt.Errorf("telemetry: console exporter: %w", err)
		}
		return exp, "console", nil
	}
	if s.protocol == protocolGRPC {
		return s.newGRPCExporter(ctx)
	}
	return s.newHTTPExporter(ctx)
}

func (s traceSettings) newHTTPExporter(ctx context.Context) (sdktrace.SpanExporter, string, error) {
	target := "http://localhost:4318/v1/traces"
	if s.endpoint != "" {
		u, err := url.Parse(s.endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, "", fmt.Errorf("telemetry: OTLP endpoint %q: want an http:// or https:// URL", redactURL(s.endpoint))
		}
		if !s.signalURL {
			// The generic endpoint is a base URL to which the signal path is appended.
			u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/traces"
		}
		target = u.String()
	}
	// The project's own exporter: it encodes straight from the SDK's spans,
	// where otlptracehttp builds protobuf structs for each span and marshals
	// them, which costs about as much CPU as making the spans.
	exp, err := otlphttp.New(otlphttp.Options{URL: target, Headers: s.headers, Timeout: s.timeout, Gzip: s.compression == "gzip"})
	if err != nil {
		return nil, "", fmt.Errorf("telemetry: OTLP/HTTP exporter: %w", err)
	}
	return exp, "otlp http/protobuf " + redactURL(target), nil
}

func (s traceSettings) newGRPCExporter(ctx context.Context) (sdktrace.SpanExporter, string, error) {
	opts := []otlptracegrpc.Option{otlptracegrpc.WithTimeout(s.timeout)}
	desc := "otlp grpc "
	switch {
	case s.endpoint == "":
		opts = append(opts, otlptracegrpc.WithEndpointURL("http://localhost:4317"))
		desc += "http://localhost:4317"
	case strings.Contains(s.endpoint, "://"):
		u, err := url.Parse(s.endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, "", fmt.Errorf("telemetry: OTLP endpoint %q: want http://host:port, https://host:port or host:port", redactURL(s.endpoint))
		}
		opts = append(opts, otlptracegrpc.WithEndpointURL(u.String()))
		desc += redactURL(u.String())
	default:
		// host:port without a scheme: TLS unless OTEL_EXPORTER_OTLP_INSECURE=true.
		if _, _, err := net.SplitHostPort(s.endpoint); err != nil {
			return nil, "", fmt.Errorf("telemetry: OTLP endpoint %q: want http://host:port, https://host:port or host:port", s.endpoint)
		}
		opts = append(opts, otlptracegrpc.WithEndpoint(s.endpoint))
		if s.insecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
			desc += "insecure "
		}
		desc += s.endpoint
	}
	if s.headers != nil {
		opts = append(opts, otlptracegrpc.WithHeaders(s.headers))
	}
	if s.compression == "gzip" {
		opts = append(opts, otlptracegrpc.WithCompressor("gzip"))
	}
	exp, err := otlptracegrpc.New(ctx, opts...)
	if err != nil {
		return nil, "", fmt.Errorf("telemetry: OTLP/gRPC exporter: %w", err)
	}
	return exp, desc, nil
}

// ErrorHandler returns an OpenTelemetry error handler that logs the SDK's
// own errors (mostly failed exports) at WARN, at most one line per interval
// with the number of errors held back. OpenTelemetry keeps its error
// handler process-wide: only main may install it, with
// otel.SetErrorHandler(telemetry.ErrorHandler(log, time.Minute)).
func ErrorHandler(log *slog.Logger, interval time.Duration) otel.ErrorHandler {
	var (
		mu         sync.Mutex
		last       time.Time
		suppressed int
	)
	return otel.ErrorHandlerFunc(func(err error) {
		mu.Lock()
		now := time.Now()
		if !last.IsZero() && now.Sub(last) < interval {
			suppressed++
			mu.Unlock()
			return
		}
		n := suppressed
		last, suppressed = now, 0
		mu.Unlock()
		log.Warn("opentelemetry error", "err", err, "suppressed_since_last", n)
	})
}
