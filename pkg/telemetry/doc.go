// Package telemetry holds the observability building blocks every xiaoclaw
// service uses: OpenTelemetry tracer providers configured from the standard
// OTEL_* variables (one provider per service, so spans of services embedded
// in one process still say which service they belong to), W3C trace context
// over NATS headers and OpenClaw request frames, span helpers shaped after the
// OpenTelemetry semantic conventions, a log/slog handler that adds trace ids
// and redacts secrets, the Prometheus metric declarations, and the ops HTTP
// server (/healthz, /readyz, /metrics, /debug/loglevel).
//
// Nothing here touches process-wide state: no global tracer provider, no
// default Prometheus registerer, no environment reads. main builds the
// pieces and passes them in.
package telemetry
