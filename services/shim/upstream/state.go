// Package upstream publishes a tenant's XiaoZhi devices as nodes on an
// existing OpenClaw gateway ("upstream mode"). For every (device, upstream)
// pair one shim worker holds a lease and one WebSocket connection to the
// upstream gateway as a node host (role node) with its own Ed25519 identity,
// kept in JetStream KV so it survives restarts and moves between workers.
//
// The upstream never reaches a device directly: each node.invoke.request it
// sends is forwarded to xiaoclaw's own gateway as a node.invoke by the
// principal "upstream:<name>", so the tenant's policy, audit trail,
// idempotency and limits apply exactly as for any operator; the answer goes
// back as node.invoke.result. The device's MCP tools are published as the
// node's plugin tools (node.pluginTools.update), so the upstream's agents
// get them as tools; device notifications, tool-catalog changes and
// presence become node.event frames upstream.
package upstream

import (
	"sync"
	"time"
)

// State of one (device, upstream) link.
type State string

const (
	// StateConnecting: dialing or in the handshake.
	StateConnecting State = "connecting"
	// StatePairing: the upstream wants the device paired (PAIRING_REQUIRED);
	// the link retries with backoff until someone approves it there.
	StatePairing State = "pairing"
	// StateOnline: hello-ok received; the node is visible upstream.
	StateOnline State = "online"
	// StateBackoff: the last attempt failed; waiting before the next one.
	StateBackoff State = "backoff"
	// StateDisabled: the upstream refused the credentials; the link waits
	// the long AuthRetry interval rather than spinning.
	StateDisabled State = "disabled"
)

// Status is the visible state of one link.
type Status struct {
	Upstream  string `json:"upstream"`
	Tenant    string `json:"tenant"`
	NodeID    string `json:"nodeId"`              // xiaoclaw node id, e.g. xz-aabbccddeeff
	DeviceID  string `json:"deviceId,omitempty"`  // the node's id upstream (sha256 of its key)
	State     State  `json:"state"`               // see the State constants
	LastError string `json:"lastError,omitempty"` // why the last attempt failed
	// RequestID is the upstream pairing request to approve, in StatePairing.
	RequestID string `json:"requestId,omitempty"`
	SinceMs   int64  `json:"sinceMs"` // when State was entered
	Holder    string `json:"holder,omitempty"`
	// Warning is a concern about the link's setup, e.g. an upstream whose
	// TLS certificate is not verified.
	Warning string `json:"warning,omitempty"`
	// OnlineAfterMs is how long the last connect took from the link's start
	// (or the previous drop) to hello-ok.
	OnlineAfterMs int64 `json:"onlineAfterMs,omitempty"`
	// Tools is how many of the device's tools the upstream took as agent
	// tools in its answer to the last node.pluginTools.update (none until
	// it approved the node); ToolsError is its refusal, if it refused.
	Tools      int    `json:"tools,omitempty"`
	ToolsError string `json:"toolsError,omitempty"`
	// LastEvent is the upstream's answer to the last node.event sent.
	LastEvent *EventAck `json:"lastEvent,omitempty"`
}

// EventAck is the upstream's answer to a node.event: OpenClaw handles a
// few events (node.presence.alive among them) and accepts others with
// handled false and reason "unsupported_event".
type EventAck struct {
	Event   string `json:"event"`
	Handled bool   `json:"handled"`
	Reason  string `json:"reason,omitempty"`
	Error   string `json:"error,omitempty"` // not delivered or refused
}

// statusBox is a link's Status behind a lock, with a change callback.
type statusBox struct {
	mu       sync.Mutex
	st       Status
	onChange func(Status)
}

func (b *statusBox) set(state State, lastErr, requestID string) {
	b.mu.Lock()
	changed := b.st.State != state || b.st.LastError != lastErr || b.st.RequestID != requestID
	if b.st.State != state {
		b.st.SinceMs = time.Now().UnixMilli()
	}
	b.st.State, b.st.LastError, b.st.RequestID = state, lastErr, requestID
	st := b.st
	b.mu.Unlock()
	if changed && b.onChange != nil {
		b.onChange(st)
	}
}

func (b *statusBox) update(f func(*Status)) {
	b.mu.Lock()
	f(&b.st)
	b.mu.Unlock()
}

func (b *statusBox) get() Status {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.st
}
