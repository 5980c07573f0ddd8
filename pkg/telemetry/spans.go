package telemetry

import (
	"context"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// The span helpers below start spans under a constant name and set the
// real name and the attributes only when the span records: with tracing off
// or the trace not sampled they allocate nothing beyond the tracer's own work.

// StartOperatorRequest starts the SERVER span of one operator request frame
// at the gateway (method "node.invoke", ...). traceparent is the optional
// protocol-v4 field of the frame: when valid it becomes the remote parent,
// otherwise the span starts a new trace (and records that an invalid value
// was ignored).
func StartOperatorRequest(ctx context.Context, tracer trace.Tracer, method, traceparent string, info CallInfo) (context.Context, trace.Span) {
	var parented, invalid bool
	if traceparent != "" {
		if ctx, parented = ContextWithTraceparent(ctx, traceparent); !parented {
			invalid = true
		}
	}
	var span trace.Span
	if parented {
		ctx, span = tracer.Start(ctx, "operator.request", trace.WithSpanKind(trace.SpanKindServer))
	} else {
		ctx, span = tracer.Start(ctx, "operator.request", trace.WithSpanKind(trace.SpanKindServer), trace.WithNewRoot())
	}
	if span.IsRecording() {
		span.SetName(method)
		attrs := make([]attribute.KeyValue, 0, 12)
		attrs = append(attrs,
			semconv.RPCSystemNameKey.String("openclaw"),
			semconv.RPCMethod(method),
			semconv.NetworkProtocolName("websocket"),
		)
		attrs = info.Attributes(attrs)
		if invalid {
			attrs = append(attrs, AttrTraceparentInvalid.Bool(true))
		}
		span.SetAttributes(attrs...)
	}
	return ctx, span
}

// StartNATSRequest starts the CLIENT span of a NATS request and writes its
// trace context into msg's header; send msg with ctx, then call
// EndNATSRequest. The span is named "request <subject template>", e.g.
// "request xc.{tenant}.dev.{device}.rpc", so names and attributes stay low
// in cardinality; the tenant (from the subject when info has none) and the
// other ids go into xiaoclaw.* attributes.
func StartNATSRequest(ctx context.Context, tracer trace.Tracer, msg *nats.Msg, info CallInfo) (context.Context, trace.Span) {
	ctx, span := tracer.Start(ctx, "nats.request", trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		setMessagingAttributes(span, "request", "send", msg, info)
	}
	InjectMsg(ctx, msg)
	return ctx, span
}

// EndNATSRequest ends a span from StartNATSRequest with the outcome of the
// request: the transport error, else the Xc-Fault header of the reply. When
// the reply reports its error in the payload (wire.InvokeReply), decode it
// and call EndSpan with its code instead.
func EndNATSRequest(span trace.Span, reply *nats.Msg, err error) {
	code := FaultCode(err)
	if err == nil && reply != nil && reply.Header != nil {
		code = reply.Header.Get(wire.HeaderFault)
	}
	EndSpan(span, code, err)
}

// StartNATSHandler starts the SERVER span of a handler of a NATS request or
// message, as a child of the trace context in msg's header (a new trace when
// there is none). Named "process <subject template>". End it with EndSpan.
func StartNATSHandler(ctx context.Context, tracer trace.Tracer, msg *nats.Msg, info CallInfo) (context.Context, trace.Span) {
	ctx = ExtractHeader(ctx, msg.Header)
	ctx, span := tracer.Start(ctx, "nats.process", trace.WithSpanKind(trace.SpanKindServer))
	if span.IsRecording() {
		setMessagingAttributes(span, "process", "process", msg, info)
	}
	return ctx, span
}

func setMessagingAttributes(span trace.Span, op, opType string, msg *nats.Msg, info CallInfo) {
	tmpl := SubjectTemplate(msg.Subject)
	span.SetName(op + " " + tmpl)
	if info.Tenant == "" || info.Device == "" {
		if t, d, ok := wire.DeviceFromSubject(msg.Subject); ok {
			info.Tenant, info.Device = orDefault(info.Tenant, t), orDefault(info.Device, d)
		} else if t, ok := wire.TenantFromSubject(msg.Subject); ok && info.Tenant == "" {
			info.Tenant = t
		}
	}
	// destination.name holds the template: the real subject would put tenant
	// and device ids into a field meant for grouping; they have attributes
	// of their own.
	attrs := make([]attribute.KeyValue, 0, 12)
	attrs = append(attrs,
		semconv.MessagingSystemKey.String("nats"),
		semconv.MessagingOperationName(op),
		semconv.MessagingOperationTypeKey.String(opType),
		semconv.MessagingDestinationName(tmpl),
	)
	span.SetAttributes(info.Attributes(attrs)...)
}

func orDefault(v, def string) string {
	if v != "" {
		return v
	}
	return def
}

// StartDeviceCall starts the CLIENT span of one JSON-RPC round trip between
// the devicehub and a device (method "tools/call", ...): from writing the
// request to the session until the matching reply, the deadline or the end
// of the session. End it with EndSpan.
func StartDeviceCall(ctx context.Context, tracer trace.Tracer, method string, requestID int64, transport string, info CallInfo) (context.Context, trace.Span) {
	ctx, span := tracer.Start(ctx, "device.call", trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetName(method)
		attrs := make([]attribute.KeyValue, 0, 14)
		attrs = append(attrs,
			semconv.RPCSystemNameJSONRPC,
			semconv.RPCMethod(method),
			semconv.JSONRPCProtocolVersion("2.0"),
			semconv.JSONRPCRequestID(strconv.FormatInt(requestID, 10)),
			semconv.NetworkProtocolName(transport),
		)
		span.SetAttributes(info.Attributes(attrs)...)
	}
	return ctx, span
}

// EndSpan records the outcome of a call and ends span. code is "" on
// success, else a wire.Fault code or CodeDenied; err (optional) supplies the
// status message. Failed calls get status Error, error.type and
// xiaoclaw.error.code.
func EndSpan(span trace.Span, code string, err error) {
	if span.IsRecording() {
		outcome := OutcomeOf(code)
		if code == "" {
			span.SetAttributes(AttrOutcome.String(outcome))
		} else {
			span.SetAttributes(AttrOutcome.String(outcome), AttrErrorCode.String(code), semconv.ErrorTypeKey.String(code))
			msg := code
			if err != nil {
				msg = scrubString(err.Error())
			}
			span.SetStatus(codes.Error, msg)
		}
	}
	span.End()
}

// AddPolicyDecision records the gateway's policy decision on the span of the
// request as an event (cheaper than a span of its own).
func AddPolicyDecision(span trace.Span, effect, rule string) {
	if !span.IsRecording() {
		return
	}
	span.AddEvent("policy.decision", trace.WithAttributes(AttrEffect.String(effect), AttrPolicyRule.String(rule)))
}

// TraceIDs returns the trace and span id of the span in ctx as lowercase hex,
// for audit rows and replies; both are "" when ctx has no valid span.
func TraceIDs(ctx context.Context) (traceID, spanID string) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return "", ""
	}
	return sc.TraceID().String(), sc.SpanID().String()
}

// SubjectTemplate replaces the tenant, device and node tokens of an xiaoclaw
// subject by placeholders: "xc.acme.dev.a1b2c3d4e5f6.rpc" becomes
// "xc.{tenant}.dev.{device}.rpc", "xc.acme.ocnode.<id>.invoke" becomes
// "xc.{tenant}.ocnode.{node}.invoke", and a reply inbox becomes "_INBOX".
// System subjects (xc._sys.…) and other subjects are returned as they are.
func SubjectTemplate(subject string) string {
	if strings.HasPrefix(subject, "_INBOX.") {
		return "_INBOX"
	}
	rest, ok := strings.CutPrefix(subject, "xc.")
	if !ok || rest == "" || rest[0] == '_' {
		return subject
	}
	_, rest, ok = strings.Cut(rest, ".") // drop the tenant
	if !ok {
		return "xc.{tenant}"
	}
	var b strings.Builder
	b.Grow(len(subject) + 16)
	b.WriteString("xc.{tenant}.")
	kind, tail, hasTail := strings.Cut(rest, ".")
	b.WriteString(kind)
	if !hasTail {
		return b.String()
	}
	switch kind {
	case "dev", "ocnode":
		_, after, more := strings.Cut(tail, ".")
		if kind == "dev" {
			b.WriteString(".{device}")
		} else {
			b.WriteString(".{node}")
		}
		if more {
			b.WriteByte('.')
			b.WriteString(after)
		}
	default:
		b.WriteByte('.')
		b.WriteString(tail)
	}
	return b.String()
}
