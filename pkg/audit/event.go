// Package audit is xiaoclaw's audit trail: the Event every gateway records
// for each node.invoke, connect, authentication failure and tenancy change;
// the redaction of tool arguments; the Publisher that puts events on the
// XC_AUDIT JetStream stream and waits for the acknowledgement (so a call is
// never answered unaudited); the Writer that moves the stream into a Store
// in batches, idempotent by event id; and the two Stores, PostgreSQL
// (partitioned by day, COPY-loaded) and SQLite (the embedded default), with
// the same queries. docs/audit.md describes the schema and its views.
package audit

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// Event kinds.
const (
	KindInvoke            = "node.invoke"          // one node.invoke, whatever its outcome
	KindInvokeAttempt     = "node.invoke.attempt"  // a node.invoke allowed and about to reach its node
	KindOperatorConnect   = "operator.connect"     // an operator or node host completed connect
	KindOperatorAuthFail  = "operator.auth_failed" // a connect was refused for its credential
	KindDeviceConnect     = "device.connect"       // a device session came up on a devicehub
	KindDeviceDisconnect  = "device.disconnect"    // a device session ended
	KindDeviceAuthFail    = "device.auth_failed"   // a device was refused by a devicehub
	KindTenancyChange     = "tenancy.change"       // a tenant, credential, allowlist, rule or group changed
	maxTextField          = 512                    // bytes kept of any text field
	maxDetailField        = 2048                   // bytes kept of Detail
	redactedValue         = "[REDACTED]"
	defaultMaxArgsBytes   = 4096
	eventIDRandomHexChars = 16
)

// TenantUnknown is the pseudo-tenant of events whose tenant is not known:
// connects refused before a credential was accepted and device
// authentication failures. No real tenant can have this id (tenant ids start
// with a-z or 0-9), so only a global admin reads these events.
const TenantUnknown = "_unknown"

// validTenant accepts a tenant id or TenantUnknown.
func validTenant(t string) error {
	if t == TenantUnknown {
		return nil
	}
	return wire.ValidTenant(t)
}

// Decisions.
const (
	DecisionAllow = "allow"
	DecisionDeny  = "deny"
)

// Event is one audit record. Text fields are plain strings; Args holds the
// redacted, size-capped tool arguments as JSON.
type Event struct {
	ID             string          `json:"id"`
	Time           time.Time       `json:"time"`
	Kind           string          `json:"kind"`
	Tenant         string          `json:"tenant"`
	Principal      string          `json:"principal,omitempty"` // token id, e.g. tok_…
	PrincipalName  string          `json:"principalName,omitempty"`
	Role           string          `json:"role,omitempty"`
	Node           string          `json:"node,omitempty"`
	Device         string          `json:"device,omitempty"`
	Command        string          `json:"command,omitempty"`
	Tool           string          `json:"tool,omitempty"`
	Args           json.RawMessage `json:"args,omitempty"`
	Decision       string          `json:"decision,omitempty"` // DecisionAllow, DecisionDeny, or "" when not asked
	RuleID         string          `json:"ruleId,omitempty"`
	Outcome        string          `json:"outcome,omitempty"`
	ErrorCode      string          `json:"errorCode,omitempty"`
	LatencyUs      int64           `json:"latencyUs,omitempty"`
	TraceID        string          `json:"traceId,omitempty"`
	SpanID         string          `json:"spanId,omitempty"`
	IdempotencyKey string          `json:"idempotencyKey,omitempty"`
	Replayed       bool            `json:"replayed,omitempty"`
	RequestID      string          `json:"requestId,omitempty"`
	Instance       string          `json:"instance,omitempty"` // gateway or devicehub replica
	Detail         string          `json:"detail,omitempty"`   // reason, remote address, change id
}

// AttemptID is the id of a call's node.invoke.attempt event, given the id
// of its node.invoke (outcome) event.
func AttemptID(invokeID string) string { return invokeID + "-attempt" }

// NewID returns a new event id: 12 hex digits of Unix milliseconds and 16
// random hex digits, so ids sort roughly by time and never collide.
func NewID() string {
	var b [20]byte
	ms := uint64(time.Now().UnixMilli())
	for i := 5; i >= 0; i-- {
		b[i] = byte(ms)
		ms >>= 8
	}
	_, _ = rand.Read(b[6:14])
	return hex.EncodeToString(b[:14])
}

// ErrInvalidEvent is returned (wrapped) for an event that cannot be stored.
var ErrInvalidEvent = errors.New("audit: invalid event")

// Validate reports an event no store would take.
func (e *Event) Validate() error {
	switch {
	case e.ID == "" || len(e.ID) > 64:
		return fmt.Errorf("%w: id must be 1-64 characters", ErrInvalidEvent)
	case e.Time.IsZero():
		return fmt.Errorf("%w: time is missing", ErrInvalidEvent)
	case e.Kind == "":
		return fmt.Errorf("%w: kind is missing", ErrInvalidEvent)
	}
	if err := validTenant(e.Tenant); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidEvent, err)
	}
	if len(e.Args) > 0 && !json.Valid(e.Args) {
		return fmt.Errorf("%w: args are not JSON", ErrInvalidEvent)
	}
	return nil
}

// normalize makes an event storable everywhere: time in UTC at microsecond
// precision (what PostgreSQL keeps, so a re-delivered event is the same
// row), text without NUL bytes or invalid UTF-8 (PostgreSQL refuses both)
// and capped in length.
func (e *Event) normalize() {
	e.Time = e.Time.UTC().Truncate(time.Microsecond)
	for _, f := range []*string{&e.ID, &e.Kind, &e.Tenant, &e.Principal, &e.PrincipalName, &e.Role, &e.Node,
		&e.Device, &e.Command, &e.Tool, &e.Decision, &e.RuleID, &e.Outcome, &e.ErrorCode, &e.TraceID,
		&e.SpanID, &e.IdempotencyKey, &e.RequestID, &e.Instance} {
		*f = cleanText(*f, maxTextField)
	}
	e.Detail = cleanText(e.Detail, maxDetailField)
	if len(e.Args) > 0 && needsReencoding(e.Args) {
		// From a publisher that did not redact: re-encode (and mask).
		e.Args = Redaction{}.compile().apply(e.Tool, e.Args)
	}
}

// needsReencoding reports invalid UTF-8 and escapes PostgreSQL's jsonb refuses: \u0000 and
// UTF-16 surrogates (a lone one is an error there; decoding and
// re-encoding turns it into U+FFFD and a pair into the character).
func needsReencoding(b []byte) bool {
	if !utf8.Valid(b) {
		return true
	}
	for i := bytes.Index(b, []byte(`\u`)); i >= 0 && i+5 < len(b); {
		h := bytes.ToLower(b[i+2 : i+6])
		if string(h) == "0000" || h[0] == 'd' && h[1] >= '8' {
			return true
		}
		j := bytes.Index(b[i+2:], []byte(`\u`))
		if j < 0 {
			break
		}
		i += 2 + j
	}
	return false
}

// cleanText replaces NUL and invalid UTF-8 with U+FFFD and cuts s to at
// most max bytes on a rune boundary.
func cleanText(s string, max int) string {
	if strings.IndexByte(s, 0) >= 0 || !utf8.ValidString(s) {
		s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	}
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}
