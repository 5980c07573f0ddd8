package wire

import (
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
)

// NATS header names. Trace context travels in the W3C "traceparent" and
// "tracestate" headers, written by the OpenTelemetry propagator. Requests
// carry no more than they need (every message header costs encoding,
// parsing and, with a sampled traceparent, a header map in nats-server):
// the subject names tenant, device or node.
const (
	// HeaderTenant repeats the subject's tenant on events and audit
	// messages, for consumers of wildcard subscriptions.
	HeaderTenant = "Xc-Tenant"
	// HeaderTimeout is the time the sender still waits for the reply, in
	// milliseconds, measured when the message was sent. Relative, so that
	// clock skew between machines does not shorten or stretch it.
	HeaderTimeout = "Xc-Timeout-Ms"
	// HeaderFault marks a reply that carries a Fault produced by a service
	// rather than a normal reply; its value is the Fault's code.
	HeaderFault = "Xc-Fault"
)

// SetTimeout writes the time left until deadline into h.
func SetTimeout(h nats.Header, deadline time.Time) {
	ms := time.Until(deadline).Milliseconds()
	if ms < 1 {
		ms = 1
	}
	h.Set(HeaderTimeout, strconv.FormatInt(ms, 10))
}

// Deadline returns the absolute deadline a received message asks for,
// measured from now, capped at max; max also applies when no header is set
// or it cannot be parsed.
func Deadline(h nats.Header, max time.Duration) time.Time {
	d := max
	if v := h.Get(HeaderTimeout); v != "" {
		if ms, err := strconv.ParseInt(v, 10, 64); err == nil && ms > 0 && time.Duration(ms)*time.Millisecond < max {
			d = time.Duration(ms) * time.Millisecond
		}
	}
	return time.Now().Add(d)
}
