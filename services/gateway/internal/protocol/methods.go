package protocol

import (
	"encoding/json"

	"github.com/xiaoclaw/xiaoclaw/pkg/jsstr"
)

// Method names the gateway serves.
const (
	MethodConnect                   = "connect"
	MethodHealth                    = "health"
	MethodNodeList                  = "node.list"
	MethodNodeDescribe              = "node.describe"
	MethodNodePairList              = "node.pair.list"
	MethodNodeInvoke                = "node.invoke"
	MethodNodeInvokeResult          = "node.invoke.result"
	MethodNodeEvent                 = "node.event"
	MethodSkillsBins                = "skills.bins"
	MethodNodeSkillsUpdate          = "node.skills.update"
	MethodNodePluginToolsUpdate     = "node.pluginTools.update"
	MethodNodeRunnerInventoryUpdate = "node.runnerInventory.update"
)

// Event names the gateway sends.
const (
	EventConnectChallenge  = "connect.challenge"
	EventTick              = "tick"
	EventShutdown          = "shutdown"
	EventNodeEvent         = "node.event"
	EventNodeInvokeRequest = "node.invoke.request"
)

// Operator scopes the gateway checks.
const (
	ScopeAdmin = "operator.admin"
	ScopeRead  = "operator.read"
	ScopeWrite = "operator.write"
	// ScopePairing is what the stock CLI asks for node.pair.*.
	ScopePairing = "operator.pairing"
)

const (
	// DefaultNodeInvokeTimeoutMs applies when node.invoke has no timeoutMs.
	DefaultNodeInvokeTimeoutMs = 30_000
	// MaxIdempotencyKeyLength bounds node.invoke's idempotencyKey.
	MaxIdempotencyKeyLength = 256
)

// IsExecApprovalsCommand reports the commands node.invoke never forwards.
func IsExecApprovalsCommand(command string) bool {
	return command == "system.execApprovals.get" || command == "system.execApprovals.set"
}

// NodeDescribeParams are node.describe's params.
type NodeDescribeParams struct {
	NodeID *string `json:"nodeId"`
}

// ParseNodeDescribe validates node.describe params.
func ParseNodeDescribe(raw json.RawMessage) (string, *Error) {
	var p NodeDescribeParams
	if err := DecodeParams(MethodNodeDescribe, raw, &p); err != nil {
		return "", err
	}
	if p.NodeID == nil {
		return "", InvalidParams(MethodNodeDescribe, required("nodeId"))
	}
	if msg := nonEmpty("/nodeId", p.NodeID); msg != "" {
		return "", InvalidParams(MethodNodeDescribe, msg)
	}
	return *p.NodeID, nil
}

// NodeInvokeParams are node.invoke's params. Params stays raw end to end.
type NodeInvokeParams struct {
	NodeID         *string         `json:"nodeId"`
	Command        *string         `json:"command"`
	Params         json.RawMessage `json:"params"`
	TimeoutMs      *int64          `json:"timeoutMs"`
	IdempotencyKey *string         `json:"idempotencyKey"`
	SessionKey     *string         `json:"sessionKey"`
}

// NodeInvoke is a validated node.invoke request.
type NodeInvoke struct {
	NodeID         string
	Command        string
	Params         json.RawMessage // nil when absent or null
	TimeoutMs      int64           // 0 when absent: the gateway's default applies (an explicit 0 is refused)
	IdempotencyKey string
}

// ParseNodeInvoke validates node.invoke params as OpenClaw's schema does.
func ParseNodeInvoke(raw json.RawMessage) (NodeInvoke, *Error) {
	var p NodeInvokeParams
	if err := DecodeParams(MethodNodeInvoke, raw, &p); err != nil {
		return NodeInvoke{}, err
	}
	fail := func(msg string) (NodeInvoke, *Error) { return NodeInvoke{}, InvalidParams(MethodNodeInvoke, msg) }
	switch {
	case p.NodeID == nil:
		return fail(required("nodeId"))
	case p.Command == nil:
		return fail(required("command"))
	case p.IdempotencyKey == nil:
		return fail(required("idempotencyKey"))
	}
	for _, f := range []struct {
		path string
		v    *string
	}{{"/nodeId", p.NodeID}, {"/command", p.Command}, {"/idempotencyKey", p.IdempotencyKey}, {"/sessionKey", p.SessionKey}} {
		if msg := nonEmpty(f.path, f.v); msg != "" {
			return fail(msg)
		}
	}
	if len(*p.IdempotencyKey) > MaxIdempotencyKeyLength {
		return fail("at /idempotencyKey: must NOT have more than 256 characters")
	}
	switch {
	case p.TimeoutMs == nil:
	case *p.TimeoutMs < 0:
		return fail("at /timeoutMs: must be >= 0")
	case *p.TimeoutMs == 0:
		// OpenClaw sends the request and lets the 0 ms timer fire first: the
		// node may act while the caller is told TIMEOUT. Refuse instead.
		return fail("at /timeoutMs: must be >= 1 (0 would expire before the node could answer; omit timeoutMs for the gateway's default)")
	}
	inv := NodeInvoke{
		NodeID:         jsstr.Trim(*p.NodeID),
		Command:        jsstr.Trim(*p.Command),
		IdempotencyKey: *p.IdempotencyKey,
	}
	if inv.NodeID == "" || inv.Command == "" {
		return NodeInvoke{}, InvalidRequest("nodeId and command required")
	}
	if p.TimeoutMs != nil {
		inv.TimeoutMs = *p.TimeoutMs
	}
	if len(p.Params) > 0 && !isNull(p.Params) {
		inv.Params = p.Params
	}
	return inv, nil
}

// NodeInvokeResultParams are node.invoke.result's params.
type NodeInvokeResultParams struct {
	ID          *string         `json:"id"`
	NodeID      *string         `json:"nodeId"`
	OK          *bool           `json:"ok"`
	Payload     json.RawMessage `json:"payload"`
	PayloadJSON json.RawMessage `json:"payloadJSON"`
	Error       json.RawMessage `json:"error"`
}

// NodeResultError is a node's error object.
type NodeResultError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// NodeInvokeResult is a validated node.invoke.result.
type NodeInvokeResult struct {
	ID      string
	NodeID  string
	OK      bool
	Payload json.RawMessage // the result as JSON; nil when the node sent none
	Error   *NodeResultError
}

// ParseNodeInvokeResult validates a node's result. As OpenClaw does, a null
// payloadJSON or error is dropped, a non-string payloadJSON is taken as the
// payload, and a payloadJSON string that is not JSON becomes
// {"payloadJSON": <the string>}.
func ParseNodeInvokeResult(raw json.RawMessage) (NodeInvokeResult, *Error) {
	const m = MethodNodeInvokeResult
	var p NodeInvokeResultParams
	if err := DecodeParams(m, raw, &p); err != nil {
		return NodeInvokeResult{}, err
	}
	switch {
	case p.ID == nil:
		return NodeInvokeResult{}, InvalidParams(m, required("id"))
	case p.NodeID == nil:
		return NodeInvokeResult{}, InvalidParams(m, required("nodeId"))
	case p.OK == nil:
		return NodeInvokeResult{}, InvalidParams(m, required("ok"))
	}
	if msg := nonEmpty("/id", p.ID) + nonEmpty("/nodeId", p.NodeID); msg != "" {
		return NodeInvokeResult{}, InvalidParams(m, msg)
	}
	r := NodeInvokeResult{ID: *p.ID, NodeID: *p.NodeID, OK: *p.OK}
	if len(p.Payload) > 0 && !isNull(p.Payload) {
		r.Payload = p.Payload
	}
	if len(p.PayloadJSON) > 0 && !isNull(p.PayloadJSON) {
		if p.PayloadJSON[0] == '"' {
			var s string
			if err := json.Unmarshal(p.PayloadJSON, &s); err != nil {
				return NodeInvokeResult{}, InvalidParams(m, "at /payloadJSON: must be string")
			}
			r.Payload = ParsePayloadJSON(s)
		} else if r.Payload == nil {
			r.Payload = p.PayloadJSON
		}
	}
	if len(p.Error) > 0 && !isNull(p.Error) {
		var e NodeResultError
		if err := json.Unmarshal(p.Error, &e); err != nil {
			return NodeInvokeResult{}, InvalidParams(m, "at /error: must be object")
		}
		r.Error = &e
	}
	return r, nil
}

// ParsePayloadJSON turns a payloadJSON string into JSON bytes; text that is
// not JSON becomes {"payloadJSON": text}; blank text gives nil.
func ParsePayloadJSON(s string) json.RawMessage {
	t := jsstr.Trim(s)
	if t == "" {
		return nil
	}
	if json.Valid([]byte(t)) {
		return json.RawMessage(t)
	}
	return append(AppendString([]byte(`{"payloadJSON":`), s), '}')
}

// NodeEventParams are node.event's params.
type NodeEventParams struct {
	Event       *string         `json:"event"`
	Payload     json.RawMessage `json:"payload"`
	PayloadJSON *string         `json:"payloadJSON"`
}

// ParseNodeEvent validates node.event params and returns the event name and
// its payload as JSON (payloadJSON wins over payload, as in OpenClaw).
func ParseNodeEvent(raw json.RawMessage) (string, json.RawMessage, *Error) {
	var p NodeEventParams
	if err := DecodeParams(MethodNodeEvent, raw, &p); err != nil {
		return "", nil, err
	}
	if p.Event == nil {
		return "", nil, InvalidParams(MethodNodeEvent, required("event"))
	}
	if msg := nonEmpty("/event", p.Event); msg != "" {
		return "", nil, InvalidParams(MethodNodeEvent, msg)
	}
	var payload json.RawMessage
	if p.PayloadJSON != nil {
		payload = ParsePayloadJSON(*p.PayloadJSON)
	} else if len(p.Payload) > 0 && !isNull(p.Payload) {
		payload = p.Payload
	}
	return *p.Event, payload, nil
}
