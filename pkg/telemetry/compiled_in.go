//go:build !xc_omit_tracing

package telemetry

// compiledIn is false in a build with the xc_omit_tracing tag, which removes
// the span helpers and trace propagation from the call path (see
// compiled_out.go).
const compiledIn = true
