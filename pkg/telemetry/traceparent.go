package telemetry

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/trace"
)

// MaxTraceparentLen is the longest traceparent the OpenClaw protocol v4
// accepts on a request frame.
const MaxTraceparentLen = 128

// ErrInvalidTraceparent is returned (wrapped) for a traceparent that breaks
// the W3C Trace Context rules.
var ErrInvalidTraceparent = errors.New("invalid traceparent")

var (
	errTPLength  = fmt.Errorf("%w: wrong length", ErrInvalidTraceparent)
	errTPHex     = fmt.Errorf("%w: not lowercase hex where hex is required", ErrInvalidTraceparent)
	errTPDash    = fmt.Errorf("%w: fields must be separated by '-'", ErrInvalidTraceparent)
	errTPVersion = fmt.Errorf("%w: version ff is forbidden", ErrInvalidTraceparent)
	errTPZeroID  = fmt.Errorf("%w: trace id and parent id must not be all zeros", ErrInvalidTraceparent)
	errTPFlags   = fmt.Errorf("%w: version 00 defines only the trace flag bits 01 and 02", ErrInvalidTraceparent)
)

// ParseTraceparent parses a W3C traceparent header value,
// "00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>", into a remote span
// context. It is strict: lowercase hex only, no all-zero ids, no version ff,
// exactly 55 characters for version 00; a higher version may append fields
// after a '-', as the specification allows, up to MaxTraceparentLen.
// It does not allocate.
func ParseTraceparent(s string) (trace.SpanContext, error) {
	const n = 55
	if len(s) < n || len(s) > MaxTraceparentLen {
		return trace.SpanContext{}, errTPLength
	}
	if s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return trace.SpanContext{}, errTPDash
	}
	version, ok := hexByte(s[0], s[1])
	if !ok {
		return trace.SpanContext{}, errTPHex
	}
	if version == 0xff {
		return trace.SpanContext{}, errTPVersion
	}
	if version == 0 && len(s) != n {
		return trace.SpanContext{}, errTPLength
	}
	if version != 0 && len(s) > n && s[n] != '-' {
		return trace.SpanContext{}, errTPDash
	}
	var tid trace.TraceID
	var sid trace.SpanID
	if !decodeHex(tid[:], s[3:35]) || !decodeHex(sid[:], s[36:52]) {
		return trace.SpanContext{}, errTPHex
	}
	flags, ok := hexByte(s[53], s[54])
	if !ok {
		return trace.SpanContext{}, errTPHex
	}
	if !tid.IsValid() || !sid.IsValid() {
		return trace.SpanContext{}, errTPZeroID
	}
	if version == 0 && flags&^0x03 != 0 {
		// Version 00 defines the sampled (01) and random (02) bits only.
		return trace.SpanContext{}, errTPFlags
	}
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    tid,
		SpanID:     sid,
		TraceFlags: trace.TraceFlags(flags) & (trace.FlagsSampled | trace.FlagsRandom),
		Remote:     true,
	}), nil
}

// FormatTraceparent renders sc as a version 00 traceparent, or "" when sc
// is not valid.
func FormatTraceparent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	var b [55]byte
	const hexd = "0123456789abcdef"
	b[0], b[1], b[2] = '0', '0', '-'
	tid, sid := sc.TraceID(), sc.SpanID()
	for i, v := range tid {
		b[3+2*i], b[4+2*i] = hexd[v>>4], hexd[v&0x0f]
	}
	b[35] = '-'
	for i, v := range sid {
		b[36+2*i], b[37+2*i] = hexd[v>>4], hexd[v&0x0f]
	}
	b[52] = '-'
	f := byte(sc.TraceFlags()) & 0x03
	b[53], b[54] = hexd[f>>4], hexd[f&0x0f]
	return string(b[:])
}

// ContextWithTraceparent returns ctx with the remote span context of a
// traceparent as the parent of the next span, and whether it was valid.
// An empty or invalid traceparent leaves ctx as it is.
func ContextWithTraceparent(ctx context.Context, traceparent string) (context.Context, bool) {
	if traceparent == "" {
		return ctx, false
	}
	sc, err := ParseTraceparent(traceparent)
	if err != nil {
		return ctx, false
	}
	return trace.ContextWithRemoteSpanContext(ctx, sc), true
}

func hexNibble(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	}
	return 0, false
}

func hexByte(hi, lo byte) (byte, bool) {
	h, ok1 := hexNibble(hi)
	l, ok2 := hexNibble(lo)
	return h<<4 | l, ok1 && ok2
}

func decodeHex(dst []byte, s string) bool {
	for i := range dst {
		b, ok := hexByte(s[2*i], s[2*i+1])
		if !ok {
			return false
		}
		dst[i] = b
	}
	return true
}
