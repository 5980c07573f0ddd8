package otlphttp

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"

	"google.golang.org/protobuf/encoding/protowire"
)

// Field numbers of ExportTraceServiceResponse and ExportTracePartialSuccess.
const (
	respPartialSuccess  protowire.Number = 1
	psRejectedSpans     protowire.Number = 1
	psErrorMessage      protowire.Number = 2
	maxErrorExcerptSize                  = 256
)

var errMalformedResponse = errors.New("malformed ExportTraceServiceResponse")

// parsePartialSuccess reads the partial_success of an encoded
// ExportTraceServiceResponse. It follows protobuf's merge rules: every
// occurrence of the sub-message and of its fields counts, the last value of a
// field wins, and fields with an unexpected wire type are skipped as unknown
// fields. A negative rejected_spans, which no collector should send, reads as
// zero. It fails only on bytes that are not protobuf at all.
func parsePartialSuccess(body []byte) (rejected int64, message string, err error) {
	for len(body) > 0 {
		num, typ, n := protowire.ConsumeTag(body)
		if n < 0 {
			return 0, "", errMalformedResponse
		}
		body = body[n:]
		if num == respPartialSuccess && typ == protowire.BytesType {
			ps, n := protowire.ConsumeBytes(body)
			if n < 0 {
				return 0, "", errMalformedResponse
			}
			body = body[n:]
			if rejected, message, err = mergePartialSuccess(ps, rejected, message); err != nil {
				return 0, "", err
			}
			continue
		}
		n = protowire.ConsumeFieldValue(num, typ, body)
		if n < 0 {
			return 0, "", errMalformedResponse
		}
		body = body[n:]
	}
	return max(rejected, 0), message, nil
}

func mergePartialSuccess(b []byte, rejected int64, message string) (int64, string, error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, "", errMalformedResponse
		}
		b = b[n:]
		switch {
		case num == psRejectedSpans && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, "", errMalformedResponse
			}
			b = b[n:]
			rejected = int64(v)
		case num == psErrorMessage && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return 0, "", errMalformedResponse
			}
			b = b[n:]
			message = string(v)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return 0, "", errMalformedResponse
			}
			b = b[n:]
		}
	}
	return rejected, message, nil
}

// PartialSuccessError reports that the collector accepted the request but
// rejected some of its spans (or accepted them all with a warning).
type PartialSuccessError struct {
	// Rejected is the number of spans the collector rejected; never negative.
	Rejected int64
	// Sent is the number of spans in the request.
	Sent int
	// Message is the start of the collector's explanation, at most 256
	// bytes.
	Message string
}

func (e *PartialSuccessError) Error() string {
	msg := e.Message
	if msg == "" {
		msg = "(no message)"
	}
	return fmt.Sprintf("otlphttp: collector rejected %d of %d spans: %q", e.Rejected, e.Sent, msg)
}

// StatusError reports a response that is neither a success nor retryable, or
// a retryable one after retrying ended.
type StatusError struct {
	// URL is the endpoint, without user info and query.
	URL string
	// StatusCode and Status are the response's (Status is like "400 Bad Request").
	StatusCode int
	Status     string
	// Body is the start of the response body, at most 256 bytes.
	Body string
}

func (e *StatusError) Error() string {
	body := e.Body
	if body == "" {
		body = "(empty)"
	}
	return fmt.Sprintf("otlphttp: POST %s: %s: body: %q", e.URL, e.Status, body)
}

// retryable reports whether the OTLP/HTTP specification lets the client
// retry a request that got this status.
func retryable(code int) bool {
	switch code {
	case http.StatusTooManyRequests, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// retryAfter reads a Retry-After header: delay-seconds or an HTTP date. It
// returns false when the header is missing or unreadable.
func retryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(secs) * time.Second, true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(t.Sub(now), 0), true
	}
	return 0, false
}

// excerpt returns the start of b as printable text: at most
// maxErrorExcerptSize bytes, invalid UTF-8 (a rune cut at the end included)
// replaced, surrounding space trimmed.
func excerpt(b []byte) string {
	if len(b) > maxErrorExcerptSize {
		b = b[:maxErrorExcerptSize]
	}
	return strings.TrimFunc(strings.ToValidUTF8(string(b), "\uFFFD"), unicode.IsSpace)
}

// isProtobuf reports whether a Content-Type names protobuf.
func isProtobuf(contentType string) bool {
	mt, _, _ := strings.Cut(contentType, ";")
	mt = strings.TrimSpace(mt)
	return strings.EqualFold(mt, "application/x-protobuf") || strings.EqualFold(mt, "application/protobuf")
}
