//go:build xc_omit_tracing

package telemetry

// compiledIn is false: this build was made with -tags xc_omit_tracing. The
// span helpers return at once, nothing reads or writes trace context, and
// NewTracerProvider hands out no-op providers whatever OTEL_* says. The tag
// exists to measure what the instrumentation costs with tracing off against
// a build without it (scripts/bench-tracing.sh); the SDK is still linked.
const compiledIn = false
