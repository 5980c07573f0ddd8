package telemetry

import (
	"cmp"
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/attribute"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// ScopeName is the instrumentation scope of every xiaoclaw tracer:
// tp.Tracer(telemetry.ScopeName).
const ScopeName = "github.com/xiaoclaw/xiaoclaw"

// Service names, used as the OpenTelemetry service.name of each service's
// tracer provider and, without the prefix, as the "service" metric label.
const (
	ServiceGateway   = "xiaoclaw-gateway"
	ServiceShim      = "xiaoclaw-shim"
	ServiceDevicehub = "xiaoclaw-devicehub"
)

// xiaoclaw span attributes. The OpenTelemetry semantic conventions have no
// names for these, so they live under the xiaoclaw. prefix.
const (
	AttrTenant     = attribute.Key("xiaoclaw.tenant")
	AttrPrincipal  = attribute.Key("xiaoclaw.principal")
	AttrNode       = attribute.Key("xiaoclaw.node")
	AttrDevice     = attribute.Key("xiaoclaw.device")
	AttrCommand    = attribute.Key("xiaoclaw.command")
	AttrTool       = attribute.Key("xiaoclaw.tool")
	AttrOutcome    = attribute.Key("xiaoclaw.outcome")
	AttrErrorCode  = attribute.Key("xiaoclaw.error.code")
	AttrPolicyRule = attribute.Key("xiaoclaw.policy.rule")
	// AttrTraceparentInvalid marks a root span started because the operator's
	// frame carried a traceparent that failed validation.
	AttrTraceparentInvalid = attribute.Key("xiaoclaw.traceparent.invalid")
)

// Outcomes of a call: the values of the xiaoclaw.outcome span attribute and
// of the "outcome" metric label. A small fixed set, so metric cardinality
// stays bounded whatever the error.
const (
	OutcomeOK          = "ok"
	OutcomeDenied      = "denied"       // the policy refused the call
	OutcomeInvalid     = "invalid"      // bad command, arguments or size
	OutcomeOffline     = "offline"      // no session, or it ended mid-call
	OutcomeTimeout     = "timeout"      // the deadline passed
	OutcomeDeviceError = "device_error" // the device answered with an error
	OutcomeBusy        = "busy"         // too many calls in flight (BUSY, RATE_LIMITED)
	OutcomeError       = "error"        // anything else
)

// CodeDenied is the error code recorded for a call the policy refused. It is
// not a wire.Fault code: a denied call never leaves the gateway.
const CodeDenied = "DENIED"

// CodeCanceled is the error code recorded for a call its caller gave up on.
const CodeCanceled = "CANCELED"

// OutcomeOf maps an error code (a wire.Fault code, CodeDenied, or "" for
// success) to its outcome.
func OutcomeOf(code string) string {
	switch code {
	case "":
		return OutcomeOK
	case CodeDenied:
		return OutcomeDenied
	case wire.FaultInvalidRequest, wire.FaultTooLarge:
		return OutcomeInvalid
	case wire.FaultNotConnected, wire.FaultDisconnected:
		return OutcomeOffline
	case wire.FaultTimeout:
		return OutcomeTimeout
	case wire.FaultDeviceError:
		return OutcomeDeviceError
	case wire.FaultBusy, wire.FaultRateLimited:
		return OutcomeBusy
	default:
		return OutcomeError
	}
}

// FaultCode returns the error code of err: the code of a *wire.Fault in its
// chain, NOT_CONNECTED for NATS "no responders", TIMEOUT for deadlines,
// CANCELED for a canceled context, UNAVAILABLE for anything else, and "" for
// nil.
func FaultCode(err error) string {
	if err == nil {
		return ""
	}
	var f *wire.Fault
	switch {
	case errors.As(err, &f):
		return f.Code
	case errors.Is(err, nats.ErrNoResponders):
		return wire.FaultNotConnected
	case errors.Is(err, nats.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return wire.FaultTimeout
	case errors.Is(err, context.Canceled):
		return CodeCanceled
	default:
		return wire.FaultUnavailable
	}
}

// CallInfo names what a span is about. Empty fields are left out. Spans
// turn it into attributes only when they end, and only when they record, so
// a disabled tracer costs no allocations.
type CallInfo struct {
	Tenant    string
	Principal string
	Node      string
	Device    string
	Command   string
	Tool      string
}

// merge sets the fields of c that o has.
func (c *CallInfo) merge(o CallInfo) {
	c.Tenant = cmp.Or(o.Tenant, c.Tenant)
	c.Principal = cmp.Or(o.Principal, c.Principal)
	c.Node = cmp.Or(o.Node, c.Node)
	c.Device = cmp.Or(o.Device, c.Device)
	c.Command = cmp.Or(o.Command, c.Command)
	c.Tool = cmp.Or(o.Tool, c.Tool)
}

// Attributes appends the non-empty fields of c to dst as xiaoclaw.* attributes.
func (c CallInfo) Attributes(dst []attribute.KeyValue) []attribute.KeyValue {
	add := func(k attribute.Key, v string) {
		if v != "" {
			dst = append(dst, k.String(v))
		}
	}
	add(AttrTenant, c.Tenant)
	add(AttrPrincipal, c.Principal)
	add(AttrNode, c.Node)
	add(AttrDevice, c.Device)
	add(AttrCommand, c.Command)
	add(AttrTool, c.Tool)
	return dst
}
