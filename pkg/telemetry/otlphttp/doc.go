// Package otlphttp is an OTLP/HTTP span exporter that writes the protobuf
// encoding of an ExportTraceServiceRequest straight from the SDK's
// [sdktrace.ReadOnlySpan] values into a reused buffer and POSTs it to a
// collector.
//
// It exists for CPU and garbage: the official otlptracehttp exporter first
// converts every span into generated protobuf structs (a struct per span,
// attribute, value, event and link) and then marshals them with the
// reflection-driven protobuf runtime. Profiles showed that this costs about as
// much CPU as creating the spans in the first place. This package produces the
// same request — field for field what otlptracehttp v1.47.0 sends for the same
// spans, which the conformance test checks with proto.Equal — using
// google.golang.org/protobuf/encoding/protowire, without intermediate
// structs and, once its buffers have grown, without allocating per span.
//
// [AppendExportRequest] is the encoder; [Exporter] is the
// [sdktrace.SpanExporter] that sends what it encodes, with optional gzip,
// the retry rules of the OTLP/HTTP specification (429, 502, 503 and 504 are
// retried with capped exponential backoff and jitter, honouring Retry-After)
// and partial-success reporting.
package otlphttp
