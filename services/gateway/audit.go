package gateway

import (
	"context"
	"encoding/json"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/access"
)

// Outcomes of a node.invoke, as the Auditor sees them.
const (
	OutcomeOK       = "ok"       // the node answered with a result
	OutcomeError    = "error"    // the node or the path to it failed
	OutcomeTimeout  = "timeout"  // the deadline passed
	OutcomeDenied   = "denied"   // the policy refused the call
	OutcomeRejected = "rejected" // refused before any policy question: bad params, unknown or offline node, undeclared command
)

// InvokeAudit describes one node.invoke: its attempt (Attempt set, no
// Outcome yet) or its outcome.
type InvokeAudit struct {
	// CallID is the same in a call's attempt and outcome records and
	// differs between calls (16 hex digits).
	CallID string
	// Attempt marks the record of an allowed call about to be sent to its
	// node; Outcome, ErrorCode and Replayed are then unset.
	Attempt bool
	// Sent marks the outcome of a call that was sent to its node (its
	// attempt is on record): the gateway does not wait on this record.
	Sent      bool
	Time      time.Time // when the request arrived
	Instance  string    // gateway replica
	RequestID string    // the operator's request id
	Principal access.Principal
	NodeID    string
	NodeKind  string // wire.NodeKindXiaoZhi or wire.NodeKindOpenClaw, "" if unknown
	Command   string
	Tool      string // MCP tool name of mcp.tools.call, else ""
	// Args are the tool arguments of mcp.tools.call, else the command's
	// params, as the operator sent them (the Auditor redacts them).
	Args json.RawMessage
	// Decision is the Authorizer's answer; zero when the call was refused
	// before the Authorizer was asked.
	Decision       access.Decision
	Outcome        string
	ErrorCode      string // details.code or the node's error code, else the ErrorShape code
	IdempotencyKey string
	Replayed       bool // answered from an earlier call with the same idempotency key
	Latency        time.Duration
	// TraceID and SpanID name the call's node.invoke span (lowercase hex),
	// so an audit row leads to its trace; "" when the call was not traced
	// and its frame carried no traceparent.
	TraceID string
	SpanID  string
	// Via is ViaMCP for a call that came over the MCP endpoint, "" for the
	// WebSocket's node.invoke; Client is then the MCP client's
	// "name/version" from initialize.
	Via    string
	Client string
}

// ViaMCP marks an InvokeAudit of a call made through the MCP endpoint.
const ViaMCP = "mcp"

// Auditor records node.invoke calls. A call the gateway sends to its node
// is recorded twice: its attempt, after the policy allowed it and before it
// is sent (an error refuses the call with UNAVAILABLE "audit unavailable:
// …", so the node never acts unrecorded), and its outcome (Sent set), after
// the operator has the answer (an error is logged and the answer stands:
// the attempt is on record; the Auditor may store this one asynchronously).
// A call that never reaches the node (refused, denied, replayed) is
// recorded once, with its outcome, before the answer, which an error
// replaces with UNAVAILABLE (fail closed). AuditInvoke runs on the call's
// goroutine, never on a connection's read loop.
type Auditor interface {
	AuditInvoke(ctx context.Context, a InvokeAudit) error
}

// NopAuditor discards audit records.
type NopAuditor struct{}

// AuditInvoke does nothing.
func (NopAuditor) AuditInvoke(context.Context, InvokeAudit) error { return nil }

// ConnectAudit describes the end of one connect handshake: hello-ok sent,
// or the connect refused.
type ConnectAudit struct {
	Time     time.Time // when the connect request arrived
	Instance string    // gateway replica
	ConnID   string    // hello-ok's server.connId
	RemoteIP string
	// Role is the protocol role asked for: "operator" or "node"; "" when
	// the params could not be read.
	Role       string
	ClientID   string // client.id as sent
	ClientMode string // client.mode as sent
	NodeID     string // a node host's device id, once checked
	// Principal is the token's principal; zero when the token was not
	// accepted (or not yet checked).
	Principal access.Principal
	Accepted  bool
	// ErrorCode is the refusal's details.code (AUTH_TOKEN_MISMATCH,
	// PROTOCOL_MISMATCH, DEVICE_AUTH_SIGNATURE_INVALID, …), else its
	// ErrorShape code; "" when accepted.
	ErrorCode string
	Reason    string // the refusal's message
	// Count is how many refusals from RemoteIP this record stands for: a
	// source's repeated refusals before a token was accepted are folded
	// into one record per interval (Config.AuthFailures). 0 or 1: one.
	Count int
}

// ConnectAuditor is told about every connect handshake's end, accepted or
// refused. It runs on the handshake path and must not block: record
// asynchronously and best-effort (a connect is not an operator request
// that must fail closed; node.invoke is audited losslessly by Auditor).
type ConnectAuditor interface {
	AuditConnect(a ConnectAudit)
}
