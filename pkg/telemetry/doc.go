// Package telemetry holds the observability building blocks every xiaoclaw
// service uses: OpenTelemetry SDK tracer providers configured from the
// standard OTEL_* variables (one provider per service, so spans of services
// embedded in one process still say which service they belong to; with
// tracing off they still give every call a trace id), W3C trace context over
// NATS headers and OpenClaw request frames (the SDK's propagator), span
// helpers shaped after the OpenTelemetry semantic conventions, a log/slog
// handler that adds trace ids and redacts secrets, the Prometheus metric
// declarations, and StartProcess, which builds a service process's logger,
// tracer provider and registry. The ops HTTP server is in package ops, the
// NATS connection of a service in package natsconn.
//
// Nothing here installs process-wide state: no global tracer provider or
// propagator, no default Prometheus registerer. The OpenTelemetry SDK reads
// the OTEL_* environment variables itself when a provider is built; main
// builds the pieces and passes them in.
package telemetry
