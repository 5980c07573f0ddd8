package wire

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
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

// HeaderInflightLimits carries, on a node.invoke request, the in-flight
// limits of the calling tenant as "<per tenant>,<per device>": the gateway
// copies them from the tenant record, and the shim enforces them. 0 (and an
// absent header) means the shim's default.
const HeaderInflightLimits = "Xc-Inflight-Limits"

// MaxInflightLimit bounds either in-flight limit a tenant can be given.
const MaxInflightLimit = 1_000_000

// InflightLimits are a tenant's shares of a shim replica: how many invokes
// it may have in flight in all, and to any one device. 0 takes the shim's
// default.
type InflightLimits struct {
	Tenant int
	Device int
}

// SetInflightLimits writes l into h; limits that are both 0 write nothing.
func SetInflightLimits(h nats.Header, l InflightLimits) {
	if l == (InflightLimits{}) {
		return
	}
	b := make([]byte, 0, 24)
	b = strconv.AppendInt(b, int64(l.Tenant), 10)
	b = append(b, ',')
	b = strconv.AppendInt(b, int64(l.Device), 10)
	h.Set(HeaderInflightLimits, string(b))
}

// ParseInflightLimits reads a HeaderInflightLimits value; "" is no limits
// (both defaults). Each number must be a decimal in [0, MaxInflightLimit].
func ParseInflightLimits(v string) (InflightLimits, error) {
	if v == "" {
		return InflightLimits{}, nil
	}
	t, d, ok := strings.Cut(v, ",")
	if !ok {
		return InflightLimits{}, fmt.Errorf("%s %q: want <per tenant>,<per device>", HeaderInflightLimits, v)
	}
	var l InflightLimits
	var err error
	if l.Tenant, err = limitNumber(t); err != nil {
		return InflightLimits{}, fmt.Errorf("%s %q: per tenant: %w", HeaderInflightLimits, v, err)
	}
	if l.Device, err = limitNumber(d); err != nil {
		return InflightLimits{}, fmt.Errorf("%s %q: per device: %w", HeaderInflightLimits, v, err)
	}
	return l, nil
}

// limitNumber parses a plain decimal (no sign, no spaces) up to
// MaxInflightLimit.
func limitNumber(s string) (int, error) {
	if s == "" || len(s) > 7 {
		return 0, errors.New("not a number between 0 and 1000000")
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, errors.New("not a number between 0 and 1000000")
		}
		n = n*10 + int(c-'0')
	}
	if n > MaxInflightLimit {
		return 0, errors.New("not a number between 0 and 1000000")
	}
	return n, nil
}
