package telemetry

import (
	"context"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// Span is one service's span of a call: the OpenTelemetry span and the
// facts about the call that become its attributes when it ends. A hop learns
// about its call in stages (the gateway reads the node and command after the
// span starts, the shim after parsing), and the SDK grows and de-duplicates a
// span's attribute list on every SetAttributes; gathering the facts here and
// setting them once in End keeps a sampled span at one attribute allocation.
//
// The Start* helpers return a nil *Span when nothing records: tracing off or
// the trace not sampled. Every method is safe on nil, so a call site never
// asks; the context they return still carries the call's trace context (an
// unsampled span of the SDK with its own ids, or with a no-op provider the
// caller's remote parent) for audit rows, logs and propagation.
type Span struct {
	span trace.Span
	info CallInfo
	kind spanKind
	// name: the operator request's or device call's method; the NATS subject
	// of a handler (its span name is derived at End).
	name      string
	transport string // device call: websocket or mqtt
	rpcID     int64  // device call: the JSON-RPC id, 0 until assigned
	invalidTP bool   // operator request: the frame's traceparent was ignored
	// denyingRule: operator request, the policy rule that refused the call.
	denyingRule string
}

type spanKind uint8

const (
	operatorSpan spanKind = iota
	handlerSpan
	deviceSpan
)

// StartOperatorRequest starts the SERVER span of one operator request frame
// at the gateway (method "node.invoke", ...). traceparent is the optional
// protocol-v4 field of the frame: when valid it becomes the remote parent,
// otherwise the span starts a new trace (and records that an invalid value
// was ignored). With tracing off (a provider that samples nothing) the
// returned context still carries the call's trace id, the caller's or a new
// one, so it reaches the audit row, the logs, the reply and the hops after
// the gateway.
func StartOperatorRequest(ctx context.Context, tracer trace.Tracer, method, traceparent string, info CallInfo) (context.Context, *Span) {
	var parented, invalid bool
	if traceparent != "" {
		if ctx, parented = ContextWithTraceparent(ctx, traceparent); !parented {
			invalid = true
		}
	}
	if isNoop(tracer) {
		return ctx, nil
	}
	var span trace.Span
	if parented || !trace.SpanContextFromContext(ctx).IsValid() {
		ctx, span = tracer.Start(ctx, method, serverSpan...)
	} else { // a span in the connection's context must not become the parent
		ctx, span = tracer.Start(ctx, method, serverRootSpan...)
	}
	if !span.IsRecording() {
		return ctx, nil
	}
	return ctx, &Span{span: span, kind: operatorSpan, name: method, info: info, invalidTP: invalid}
}

// StartNATSHandler starts the SERVER span of a handler of a NATS request or
// message, as a child of the trace context in msg's header (a new trace when
// there is none). It is named "process <subject template>", e.g.
// "process xc.{tenant}.node.invoke", so names and attributes stay low in
// cardinality; the tenant and device (from the subject when info has none)
// and the other ids become xiaoclaw.* attributes. A request the handler sends
// on carries this span's context (InjectMsg): no client span of its own, one
// span per service and hop.
func StartNATSHandler(ctx context.Context, tracer trace.Tracer, msg *nats.Msg, info CallInfo) (context.Context, *Span) {
	ctx = ExtractHeader(ctx, msg.Header)
	if isNoop(tracer) {
		return ctx, nil
	}
	ctx, span := tracer.Start(ctx, "nats.process", serverSpan...)
	if !span.IsRecording() {
		return ctx, nil
	}
	return ctx, &Span{span: span, kind: handlerSpan, name: msg.Subject, info: info}
}

// StartDeviceCall starts the devicehub's span of one call: the CLIENT span
// of a JSON-RPC request (method "tools/call", ...) to a device, from the
// parsed request until the device's reply, the deadline or the end of the
// session. It is the hub's only span of the call, a child of the trace
// context in ctx (for a NATS request, ExtractHeader of its header): a NATS
// handler span of its own would cost as much and differ from this one only
// by the hub's few microseconds of parsing and replying. The hub sets the
// request id once it is assigned (SetRequestID).
func StartDeviceCall(ctx context.Context, tracer trace.Tracer, method, transport string, info CallInfo) (context.Context, *Span) {
	if isNoop(tracer) {
		return ctx, nil
	}
	ctx, span := tracer.Start(ctx, method, clientSpan...)
	if !span.IsRecording() {
		return ctx, nil
	}
	return ctx, &Span{span: span, kind: deviceSpan, name: method, transport: transport, info: info}
}

// The options of the helpers' spans, built once: a variadic list passed
// to an interface method escapes, and would cost an allocation per span.
// Never modified.
var (
	serverSpan     = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}
	serverRootSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer), trace.WithNewRoot()}
	clientSpan     = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}
)

// isNoop tells the tracer of a no-op provider (a service built without
// one), so the helpers skip even the no-op span and its context.
func isNoop(tracer trace.Tracer) bool {
	_, ok := tracer.(noop.Tracer)
	return ok
}

// Recording reports whether the span records (false on nil), for callers
// that would compute an attribute only for it.
func (s *Span) Recording() bool { return s != nil }

// AddInfo adds the non-empty fields of info to what the span says about its
// call when it ends.
func (s *Span) AddInfo(info CallInfo) {
	if s == nil {
		return
	}
	s.info.merge(info)
}

// SetRequestID records the JSON-RPC id the hub gave a device call.
func (s *Span) SetRequestID(id int64) {
	if s == nil {
		return
	}
	s.rpcID = id
}

// SetDenyingRule records that the policy refused the call and the rule
// that did: the xiaoclaw.policy.rule attribute. An allowed call's span says
// nothing of the policy beyond going on (its rule is in the audit row, which
// carries the trace id): an event or attribute on every call would cost
// about a tenth of the span.
func (s *Span) SetDenyingRule(rule string) {
	if s == nil {
		return
	}
	s.denyingRule = rule
}

// attrBuffers recycles the attribute lists End builds: the SDK copies them
// into the span, and a list of the span's size escapes to the heap through
// the trace.Span interface on every call otherwise.
var attrBuffers = sync.Pool{New: func() any { return new([maxSpanAttrs]attribute.KeyValue) }}

// maxSpanAttrs bounds the attributes one span gets (the failure path's
// included).
const maxSpanAttrs = 16

// End records the outcome of the call and ends the span. code is "" on
// success, else a wire.Fault code or CodeDenied; err (optional) supplies the
// status message. Failed calls get status Error, error.type and
// xiaoclaw.error.code.
func (s *Span) End(code string, err error) {
	if s == nil {
		return
	}
	var tmpl string // a handler's subject template: its name and destination
	if s.kind == handlerSpan {
		var name string
		name, tmpl = handlerSpanName(s.name)
		s.span.SetName(name)
	}
	buf := attrBuffers.Get().(*[maxSpanAttrs]attribute.KeyValue)
	attrs := s.attributes(buf[:0], tmpl)
	attrs = append(attrs, AttrOutcome.String(OutcomeOf(code)))
	if code != "" {
		attrs = append(attrs, AttrErrorCode.String(code), semconv.ErrorTypeKey.String(code))
	}
	s.span.SetAttributes(attrs...)
	clear(attrs)
	attrBuffers.Put(buf)
	if code != "" {
		msg := code
		if err != nil {
			msg = Scrub(err.Error())
		}
		s.span.SetStatus(codes.Error, msg)
	}
	s.span.End()
}

// attributes appends the span's attributes but the outcome: the semantic
// conventions' for its kind, then the xiaoclaw.* ones. A successful call's
// span stays within eight attributes, the most the SDK de-duplicates without
// growing a map. tmpl is a handler's subject template.
func (s *Span) attributes(dst []attribute.KeyValue, tmpl string) []attribute.KeyValue {
	info := s.info
	switch s.kind {
	case operatorSpan:
		dst = append(dst, semconv.RPCSystemNameKey.String("openclaw"), semconv.RPCMethod(s.name))
		if s.invalidTP {
			dst = append(dst, AttrTraceparentInvalid.Bool(true))
		}
		if s.denyingRule != "" {
			dst = append(dst, AttrPolicyRule.String(s.denyingRule))
		}
	case handlerSpan:
		// destination.name holds the template: the real subject would put
		// tenant and device ids into a field meant for grouping; they have
		// attributes of their own.
		dst = append(dst,
			semconv.MessagingSystemKey.String("nats"),
			semconv.MessagingOperationName("process"),
			semconv.MessagingOperationTypeKey.String("process"),
			semconv.MessagingDestinationName(tmpl),
		)
		if info.Tenant == "" {
			if t, ok := wire.TenantFromSubject(s.name); ok {
				info.Tenant = t
			}
		}
		if info.Device == "" {
			if _, d, ok := wire.DeviceFromSubject(s.name); ok {
				info.Device = d
			}
		}
	case deviceSpan:
		dst = append(dst,
			semconv.RPCSystemNameJSONRPC,
			semconv.RPCMethod(s.name),
			semconv.JSONRPCProtocolVersion("2.0"),
			semconv.NetworkProtocolName(s.transport),
		)
		if s.rpcID > 0 {
			dst = append(dst, semconv.JSONRPCRequestID(strconv.FormatInt(s.rpcID, 10)))
		}
	}
	return info.Attributes(dst)
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
	return string(appendSubjectTemplate(nil, subject))
}

// appendSubjectTemplate appends the template of subject (SubjectTemplate).
func appendSubjectTemplate(b []byte, subject string) []byte {
	if strings.HasPrefix(subject, "_INBOX.") {
		return append(b, "_INBOX"...)
	}
	rest, ok := strings.CutPrefix(subject, "xc.")
	if !ok || rest == "" || rest[0] == '_' {
		return append(b, subject...)
	}
	_, rest, ok = strings.Cut(rest, ".") // drop the tenant
	if !ok {
		return append(b, "xc.{tenant}"...)
	}
	b = append(b, "xc.{tenant}."...)
	kind, tail, hasTail := strings.Cut(rest, ".")
	b = append(b, kind...)
	if !hasTail {
		return b
	}
	switch kind {
	case "dev", "ocnode":
		_, after, more := strings.Cut(tail, ".")
		if kind == "dev" {
			b = append(b, ".{device}"...)
		} else {
			b = append(b, ".{node}"...)
		}
		if more {
			b = append(b, '.')
			b = append(b, after...)
		}
	default:
		b = append(b, '.')
		b = append(b, tail...)
	}
	return b
}

// handlerSpanName returns a handler span's name, "process <template>", and
// the template, a suffix of the name: one allocation for both.
func handlerSpanName(subject string) (name, tmpl string) {
	const prefix = "process "
	var buf [128]byte
	name = string(appendSubjectTemplate(append(buf[:0], prefix...), subject))
	return name, name[len(prefix):]
}
