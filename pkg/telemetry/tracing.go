package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Config of a tracer provider. The OpenTelemetry SDK reads the standard
// OTEL_* variables of the process itself (see docs/observability.md); the
// fields cover what only the program knows.
type Config struct {
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
	// exporter, and turns tracing on by itself (tests: an in-memory recorder).
	SpanProcessor sdktrace.SpanProcessor
}

// TracerProvider is one service's tracer provider, always the OpenTelemetry
// SDK's. With tracing off it samples nothing and has no exporter: spans do
// not record, but every call still gets a W3C trace id (a new one, or the
// caller's), so audit rows, log lines and replies can name it.
type TracerProvider struct {
	trace.TracerProvider
	sdk     *sdktrace.TracerProvider
	enabled bool
	service string
	summary string
}

// Enabled reports whether spans are recorded and exported.
func (p *TracerProvider) Enabled() bool { return p.enabled }

// ServiceName is the service.name the provider's spans carry.
func (p *TracerProvider) ServiceName() string { return p.service }

// String describes the configuration for a start-up log line (no secrets).
func (p *TracerProvider) String() string { return p.summary }

// ForceFlush exports every finished span now.
func (p *TracerProvider) ForceFlush(ctx context.Context) error { return p.sdk.ForceFlush(ctx) }

// Shutdown flushes the spans still queued and stops the exporter. Call it
// last when a service stops; calling it again does nothing.
func (p *TracerProvider) Shutdown(ctx context.Context) error { return p.sdk.Shutdown(ctx) }

// NewTracerProvider builds the tracer provider of one service from cfg and
// the standard OTEL_* variables, which the SDK reads: the exporter
// (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_*, through autoexport), the batch
// span processor (OTEL_BSP_*), the sampler (OTEL_TRACES_SAMPLER,
// OTEL_TRACES_SAMPLER_ARG) and the resource (OTEL_RESOURCE_ATTRIBUTES,
// OTEL_SERVICE_NAME). It never installs a global provider.
//
// Tracing is on when OTEL_TRACES_EXPORTER names an exporter other than none,
// or when it is unset and an OTLP endpoint variable is set (the
// specification's default, otlp, would otherwise send to a collector nobody
// configured), or when cfg.SpanProcessor is given; OTEL_SDK_DISABLED=true
// turns it off whatever else is set.
//
// Tracing off means the sampler never samples, not even under a caller's
// sampled traceparent: there is nowhere to send the span. The caller's trace
// id is kept (the SDK always continues the parent's trace), and the flag
// sent on says "not sampled".
func NewTracerProvider(ctx context.Context, serviceName string, cfg Config) (*TracerProvider, error) {
	if serviceName == "" {
		return nil, errors.New("telemetry: service name is required")
	}
	res, err := newResource(ctx, serviceName, cfg)
	if err != nil {
		return nil, err
	}
	name := serviceName
	if v, ok := res.Set().Value(semconv.ServiceNameKey); ok {
		name = v.AsString()
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	var parts []string
	disabled := strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true")
	if !disabled && exporterConfigured() {
		exp, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return nil, fmt.Errorf("telemetry: trace exporter %q (OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_*): %w",
				exporterSummary(), err)
		}
		if !autoexport.IsNoneSpanExporter(exp) {
			// NewBatchSpanProcessor reads OTEL_BSP_* itself.
			opts = append(opts, sdktrace.WithBatcher(exp))
			parts = append(parts, exporterSummary())
		}
	}
	if !disabled && cfg.SpanProcessor != nil {
		opts = append(opts, sdktrace.WithSpanProcessor(cfg.SpanProcessor))
		parts = append(parts, "extra span processor")
	}
	p := &TracerProvider{service: name, enabled: len(parts) > 0}
	if p.enabled {
		// No sampler option: the SDK takes OTEL_TRACES_SAMPLER(_ARG), by
		// default parentbased_always_on.
		p.summary = "tracing on: sampler=" + samplerSummary() + ", " + strings.Join(parts, ", ")
	} else {
		opts = append(opts, sdktrace.WithSampler(sdktrace.NeverSample()))
		p.summary = "tracing off: trace ids only, nothing recorded"
	}
	p.sdk = sdktrace.NewTracerProvider(opts...)
	p.TracerProvider = p.sdk
	return p, nil
}

// exporterConfigured tells whether the environment asks for an exporter:
// OTEL_TRACES_EXPORTER set, or an OTLP endpoint given.
func exporterConfigured() bool {
	for _, k := range []string{"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"} {
		if strings.TrimSpace(os.Getenv(k)) != "" {
			return true
		}
	}
	return false
}

// exporterSummary names the exporter, protocol and endpoint for the start-up
// log line; credentials in the endpoint are redacted, headers left out.
func exporterSummary() string {
	kind := envOr("otlp", "OTEL_TRACES_EXPORTER")
	if kind != "otlp" {
		return kind
	}
	proto := envOr("http/protobuf", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
	endpoint := envOr("default endpoint", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
	return "otlp " + proto + " " + redactURL(endpoint)
}

func samplerSummary() string {
	s := envOr("parentbased_always_on", "OTEL_TRACES_SAMPLER")
	if arg := strings.TrimSpace(os.Getenv("OTEL_TRACES_SAMPLER_ARG")); arg != "" {
		s += "(" + arg + ")"
	}
	return s
}

// envOr returns the first of keys that is set, else def.
func envOr(def string, keys ...string) string {
	for _, k := range keys {
		if v := strings.TrimSpace(os.Getenv(k)); v != "" {
			return v
		}
	}
	return def
}

// newResource builds a provider's resource: the SDK's facts, namespace
// "xiaoclaw", instance, version and service name from the program, then
// OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME (later ones win), then,
// in a shared process, the service name again.
func newResource(ctx context.Context, service string, cfg Config) (*resource.Resource, error) {
	attrs := []attribute.KeyValue{semconv.ServiceNamespace("xiaoclaw"), semconv.ServiceName(service)}
	if cfg.Instance != "" {
		attrs = append(attrs, semconv.ServiceInstanceID(cfg.Instance))
	}
	if cfg.Version != "" {
		attrs = append(attrs, semconv.ServiceVersion(cfg.Version))
	}
	opts := []resource.Option{
		resource.WithTelemetrySDK(),
		resource.WithAttributes(attrs...),
		resource.WithFromEnv(),
	}
	if cfg.SharedProcess {
		opts = append(opts, resource.WithAttributes(semconv.ServiceName(service)))
	}
	res, err := resource.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME): %w", err)
	}
	return res, nil
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
