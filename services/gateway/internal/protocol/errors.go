package protocol

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"time"
)

// Error codes of the OpenClaw protocol (ErrorShape.code). FORBIDDEN exists
// only in v4; v3 reports authorization failures as INVALID_REQUEST.
const (
	CodeInvalidRequest = "INVALID_REQUEST"
	CodeForbidden      = "FORBIDDEN"
	CodeNotPaired      = "NOT_PAIRED"
	CodeUnavailable    = "UNAVAILABLE"
)

// Error is an OpenClaw ErrorShape. Details is pre-encoded JSON, so the shape
// of each kind of details is fixed by the constructor that builds it.
type Error struct {
	Code         string          `json:"code"`
	Message      string          `json:"message"`
	Details      json.RawMessage `json:"details,omitempty"`
	Retryable    bool            `json:"retryable,omitempty"`
	RetryAfterMs int64           `json:"retryAfterMs,omitempty"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// WithTraceID returns a copy of e whose details carry traceId (OpenClaw's
// ErrorShape is a closed object; its details are free). Details that
// already name a trace, or are not a JSON object, are kept as they are.
func (e *Error) WithTraceID(traceID string) *Error {
	d := bytes.TrimSpace(e.Details)
	switch {
	case len(d) == 0:
		d = []byte(`{}`)
	case d[0] != '{' || bytes.Contains(d, []byte(`"traceId"`)):
		return e
	}
	out := *e
	b := make([]byte, 0, len(d)+len(traceID)+16)
	b = append(b, `{"traceId":`...)
	b = AppendString(b, traceID)
	rest := bytes.TrimSpace(d[1:])
	if len(rest) > 0 && rest[0] != '}' {
		b = append(b, ',')
	}
	out.Details = append(b, rest...)
	return &out
}

// DetailCode returns details.code, or "".
func (e *Error) DetailCode() string {
	var d struct {
		Code string `json:"code"`
	}
	if len(e.Details) > 0 {
		_ = json.Unmarshal(e.Details, &d)
	}
	return d.Code
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		// Only fixed detail structs of strings, numbers and bools reach here.
		panic("protocol: encoding details: " + err.Error())
	}
	return b
}

func errorWith(code, msg string, details any) *Error {
	e := &Error{Code: code, Message: msg}
	if details != nil {
		e.Details = mustJSON(details)
	}
	return e
}

// InvalidRequest is a plain INVALID_REQUEST error.
func InvalidRequest(msg string) *Error { return &Error{Code: CodeInvalidRequest, Message: msg} }

// InvalidParams is OpenClaw's schema failure for a method's params.
func InvalidParams(method, why string) *Error {
	return InvalidRequest("invalid " + method + " params: " + why)
}

// InvalidFrame answers a frame after hello that is not a valid request.
func InvalidFrame(why string) *Error { return InvalidRequest("invalid request frame: " + why) }

// UnknownMethod answers a method the gateway does not implement.
func UnknownMethod(method string) *Error { return InvalidRequest("unknown method: " + method) }

// UnauthorizedRole answers a method the connection's role may not call.
func UnauthorizedRole(role string) *Error { return InvalidRequest("unauthorized role: " + role) }

// ConnectOnlyFirst answers a second connect.
func ConnectOnlyFirst() *Error { return InvalidRequest("connect is only valid as the first request") }

// MissingScope answers a call without the operator scope it needs: v4 uses
// FORBIDDEN with structured details, v3 the INVALID_REQUEST message only.
func MissingScope(protocol int, scope string) *Error {
	msg := "missing scope: " + scope
	if protocol < V4 {
		return InvalidRequest(msg)
	}
	return errorWith(CodeForbidden, msg, struct {
		Code           string   `json:"code"`
		MissingScope   string   `json:"missingScope"`
		RequiredScopes []string `json:"requiredScopes"`
	}{"MISSING_SCOPE", scope, []string{scope}})
}

// ProtocolMismatch answers a connect whose protocol range holds neither 4
// nor 3; the socket closes with 1002.
func ProtocolMismatch(minProtocol, maxProtocol int64) *Error {
	return errorWith(CodeInvalidRequest, "protocol mismatch", struct {
		Code                 string `json:"code"`
		ClientMinProtocol    int64  `json:"clientMinProtocol"`
		ClientMaxProtocol    int64  `json:"clientMaxProtocol"`
		ExpectedProtocol     int    `json:"expectedProtocol"`
		MinimumProbeProtocol int    `json:"minimumProbeProtocol"`
	}{"PROTOCOL_MISMATCH", minProtocol, maxProtocol, V4, V3})
}

// InvalidRole answers a connect with a role other than operator or node.
func InvalidRole() *Error { return InvalidRequest("invalid role") }

// Auth failure reasons (details.authReason) as OpenClaw reports them.
const (
	AuthTokenMissing       = "token_missing"
	AuthTokenMismatch      = "token_mismatch"
	AuthDeviceTokenInvalid = "device_token_mismatch"
	AuthRoleNotAllowed     = "role_not_allowed"
	AuthUnavailable        = "auth_unavailable"
	AuthRateLimited        = "rate_limited"
)

// RateLimited answers a connect from a source that failed authentication
// too often, as OpenClaw's AUTH_RATE_LIMITED: retryable after retryAfter,
// the socket closes with 1008.
func RateLimited(retryAfter time.Duration) *Error {
	e := errorWith(CodeInvalidRequest, "unauthorized: too many failed authentication attempts (retry later)", struct {
		Code                    string `json:"code"`
		AuthReason              string `json:"authReason"`
		CanRetryWithDeviceToken bool   `json:"canRetryWithDeviceToken"`
		RecommendedNextStep     string `json:"recommendedNextStep"`
	}{"AUTH_RATE_LIMITED", AuthRateLimited, false, "wait_then_retry"})
	e.Retryable = true
	e.RetryAfterMs = max(retryAfter.Milliseconds(), 1)
	return e
}

// AuthClient is what the auth-failure wording depends on.
type AuthClient struct {
	ID, Mode string
	Local    bool // the peer is on loopback
	HasToken bool // auth.token was sent
	HasDevTk bool // auth.deviceToken was sent
	Device   bool // a device identity was sent
}

// AuthFailed builds OpenClaw's unauthorized connect error: the message
// carries a hint for the kind of client, details carry the machine-readable
// code, reason and recovery advice. The socket closes with 1008.
func AuthFailed(reason string, c AuthClient) *Error {
	code, next := "AUTH_UNAUTHORIZED", "review_auth_configuration"
	switch reason {
	case AuthTokenMissing:
		code, next = "AUTH_TOKEN_MISSING", "update_auth_configuration"
	case AuthTokenMismatch:
		code, next = "AUTH_TOKEN_MISMATCH", "update_auth_credentials"
	case AuthDeviceTokenInvalid:
		code, next = "AUTH_DEVICE_TOKEN_MISMATCH", "update_auth_credentials"
	case AuthUnavailable:
		next = "wait_then_retry"
	}
	canRetry := reason == AuthTokenMismatch && c.Device && c.HasToken && !c.HasDevTk
	if canRetry {
		next = "retry_with_device_token"
	}
	return errorWith(CodeInvalidRequest, authMessage(reason, c), struct {
		Code                    string `json:"code"`
		AuthReason              string `json:"authReason"`
		CanRetryWithDeviceToken bool   `json:"canRetryWithDeviceToken"`
		RecommendedNextStep     string `json:"recommendedNextStep"`
	}{code, reason, canRetry, next})
}

func authMessage(reason string, c AuthClient) string {
	cli := c.ID == "cli" || c.Mode == "cli"
	ui := c.ID == "openclaw-control-ui" || c.ID == "webchat-ui" || c.ID == "webchat" || c.Mode == "webchat" || c.Mode == "ui"
	hint := "provide gateway auth token"
	switch {
	case cli && c.Local:
		hint = "use this gateway's gateway.auth.token or pair the device"
	case cli:
		hint = "set gateway.remote.token to match gateway.auth.token"
	case ui:
		hint = "open the dashboard URL and paste the token in Control UI settings"
	}
	switch reason {
	case AuthTokenMissing:
		if ui {
			hint = "paste in Control UI settings or openclaw doctor --generate-gateway-token; restart"
		}
		return "unauthorized: gateway token missing (" + hint + ")"
	case AuthTokenMismatch:
		return "unauthorized: gateway token mismatch (" + hint + ")"
	case AuthDeviceTokenInvalid:
		return "unauthorized: device token mismatch (rotate/reissue device token)"
	case AuthRoleNotAllowed:
		return "unauthorized: this token may not connect as a node (use an operator or admin token)"
	case AuthUnavailable:
		return "unauthorized: credential check unavailable (retry later)"
	}
	return "unauthorized"
}

// DeviceAuthFailed is a failed device proof: INVALID_REQUEST with
// details {code, reason}; the socket closes with 1008 and the message.
func DeviceAuthFailed(f DeviceFailure) *Error {
	return errorWith(CodeInvalidRequest, f.Message, struct {
		Code   string `json:"code"`
		Reason string `json:"reason"`
	}{f.Code, f.Reason})
}

// DeviceIdentityRequired answers a node connect without a device identity.
func DeviceIdentityRequired() *Error {
	return errorWith(CodeNotPaired, "device identity required", struct {
		Code string `json:"code"`
	}{"DEVICE_IDENTITY_REQUIRED"})
}

// UnknownNodeID answers node.describe and node.invoke for a node the
// caller cannot see: unknown, or of another tenant (the two are
// indistinguishable on purpose).
func UnknownNodeID() *Error { return InvalidRequest("unknown nodeId") }

// NodeIDMismatch answers a node that reports for another node id.
func NodeIDMismatch() *Error { return InvalidRequest("nodeId mismatch") }

// NodeNotConnected answers node.invoke for a node of the caller's tenant
// that is offline, as OpenClaw does for a node without a live session.
func NodeNotConnected() *Error {
	return errorWith(CodeUnavailable, "node not connected", struct {
		Code                  string    `json:"code"`
		NodeError             nodeError `json:"nodeError"`
		NodeCommandDispatched bool      `json:"nodeCommandDispatched"`
	}{"NOT_CONNECTED", nodeError{"NOT_CONNECTED", "node not connected"}, false})
}

type nodeError struct {
	Code    string `json:"code,omitempty"`
	Message string `json:"message,omitempty"`
}

// NodeFailed reports a node-level failure as OpenClaw does: UNAVAILABLE,
// message "<code>: <message>", details {nodeError, nodeCommandDispatched}.
func NodeFailed(code, message string, dispatched bool) *Error {
	if message == "" {
		message = "node invoke failed"
	}
	msg := message
	if code != "" {
		msg = code + ": " + message
	}
	return errorWith(CodeUnavailable, msg, struct {
		NodeError             nodeError `json:"nodeError"`
		NodeCommandDispatched bool      `json:"nodeCommandDispatched"`
	}{nodeError{code, message}, dispatched})
}

// NodeRefused reports a call refused before it reached the node because a
// limit was reached (node error BUSY or RATE_LIMITED): UNAVAILABLE as other
// node failures, but retryable, with retryAfterMs on the error and, with
// the limit's name and value, in details (limit and max are left out when
// unknown).
func NodeRefused(code, message, limit string, max int, retryAfterMs int64) *Error {
	e := errorWith(CodeUnavailable, code+": "+message, struct {
		Code                  string    `json:"code"`
		NodeError             nodeError `json:"nodeError"`
		NodeCommandDispatched bool      `json:"nodeCommandDispatched"`
		Limit                 string    `json:"limit,omitempty"`
		Max                   int       `json:"max,omitempty"`
		RetryAfterMs          int64     `json:"retryAfterMs,omitempty"`
	}{code, nodeError{code, message}, false, limit, max, retryAfterMs})
	e.Retryable, e.RetryAfterMs = true, retryAfterMs
	return e
}

// InvokeTimedOut is the result of a node.invoke whose deadline passed.
func InvokeTimedOut(dispatched bool) *Error {
	return NodeFailed("TIMEOUT", "node invoke timed out", dispatched)
}

// Reasons a command is refused by the declared-command rule.
const (
	ReasonNotDeclared   = "command not declared by node"
	ReasonNoCommands    = "node did not declare commands"
	ReasonPrivateDenied = "private node control"
)

// CommandNotAllowed is OpenClaw's refusal of a command the node did not
// declare: INVALID_REQUEST with a hint and details {reason, command}.
func CommandNotAllowed(reason, platform, command string) *Error {
	if platform == "" {
		platform = "unknown"
	}
	var msg string
	switch reason {
	case ReasonNotDeclared:
		msg = `node command not allowed: the node (platform: ` + platform + `) does not support "` + command + `"`
	case ReasonNoCommands:
		msg = "node command not allowed: the node did not declare any supported commands"
	default:
		msg = "node command not allowed: " + reason
	}
	return errorWith(CodeInvalidRequest, msg, struct {
		Reason  string `json:"reason"`
		Command string `json:"command"`
	}{reason, command})
}

// ExecApprovalsNotInvokable refuses system.execApprovals.* through node.invoke.
func ExecApprovalsNotInvokable(command string) *Error {
	return errorWith(CodeInvalidRequest, "node.invoke does not allow system.execApprovals.*; use exec.approvals.node.*", struct {
		Command string `json:"command"`
	}{command})
}

// PolicyDenied is a denial by the tenant's policy. It names the rule in the
// message and in details; v4 reports it as FORBIDDEN like other
// authorization failures, v3 as INVALID_REQUEST.
func PolicyDenied(protocol int, command, tool, ruleID, reason string) *Error {
	var b strings.Builder
	b.WriteString("node command not allowed: ")
	if tool != "" {
		b.WriteString(`tool "` + tool + `" (` + command + `)`)
	} else {
		b.WriteString(`"` + command + `"`)
	}
	b.WriteString(" denied by policy")
	if ruleID != "" {
		b.WriteString(" rule " + ruleID)
	}
	if reason != "" {
		b.WriteString(": " + reason)
	}
	code := CodeForbidden
	if protocol < V4 {
		code = CodeInvalidRequest
	}
	return errorWith(code, b.String(), struct {
		Code    string `json:"code"`
		RuleID  string `json:"ruleId,omitempty"`
		Reason  string `json:"reason,omitempty"`
		Command string `json:"command"`
		Tool    string `json:"tool,omitempty"`
	}{"POLICY_DENIED", ruleID, reason, command, tool})
}

// IdempotencyConflict refuses a reused idempotency key with other params.
func IdempotencyConflict() *Error {
	return errorWith(CodeInvalidRequest, "idempotencyKey was already used with different params", struct {
		Code string `json:"code"`
	}{"IDEMPOTENCY_KEY_REUSED"})
}

// Unavailable is a gateway-side failure (NATS down, shutting down).
func Unavailable(msg string, retryable bool) *Error {
	return &Error{Code: CodeUnavailable, Message: msg, Retryable: retryable}
}

// Codes of the size and connection limits (details.code). Oversized tool
// calls and results carry the same code on every hop (wire.FaultTooLarge).
const (
	DetailPayloadTooLarge    = "PAYLOAD_TOO_LARGE"
	DetailTooManyConnections = "TOO_MANY_CONNECTIONS"
)

// PayloadTooLarge refuses node.invoke params over the gateway's limit.
func PayloadTooLarge(size, limit int) *Error {
	return errorWith(CodeInvalidRequest, "node.invoke params of "+strconv.Itoa(size)+" bytes exceed the limit of "+strconv.Itoa(limit)+" bytes",
		struct {
			Code  string `json:"code"`
			Limit int    `json:"limit"`
		}{DetailPayloadTooLarge, limit})
}

// TooManyConnections refuses a connect over a connection cap; scope is
// "token" or "tenant".
func TooManyConnections(scope string, limit int) *Error {
	e := errorWith(CodeUnavailable, "too many connections for this "+scope+" (at most "+strconv.Itoa(limit)+")",
		struct {
			Code  string `json:"code"`
			Scope string `json:"scope"`
			Limit int    `json:"limit"`
		}{DetailTooManyConnections, scope, limit})
	e.Retryable = true
	return e
}
