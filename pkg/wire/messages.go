package wire

import "encoding/json"

// Device event kinds, published on DeviceState (notifications on
// DeviceNotify).
const (
	// DeviceOnline: a session is up; carries the hello facts and, when the
	// device speaks MCP, its server info and full tool catalog.
	DeviceOnline = "online"
	// DeviceConnecting: an MCP session is up and its discovery (initialize,
	// tools/list) is under way; carries the hello facts but no server info
	// or catalog. The session's online event follows once the catalog is
	// listed; its offline event may come instead.
	DeviceConnecting = "connecting"
	// DeviceTools: the tool catalog was listed again (replaces the old one).
	DeviceTools = "tools"
	// DeviceOffline: the session identified by SessionID ended.
	DeviceOffline = "offline"
	// DeviceNotification: the device sent a JSON-RPC notification.
	DeviceNotification = "notification"
)

// Transports a device session can use.
const (
	TransportWebSocket = "websocket"
	TransportMQTT      = "mqtt"
)

// DeviceEvent is the payload of a DeviceState message.
type DeviceEvent struct {
	Kind      string `json:"kind"`
	Tenant    string `json:"tenant"`
	Device    string `json:"device"`              // canonical device id
	DeviceRaw string `json:"deviceRaw,omitempty"` // as the device sent it, e.g. aa:bb:cc:dd:ee:ff
	// SessionID names one session of the device. The ids of a device's
	// sessions sort, as strings, in the order the sessions started, so a
	// consumer keeps the state of the greatest id it has seen and ignores
	// events of smaller ones.
	SessionID string `json:"sessionId"`
	Hub       string `json:"hub"` // devicehub instance holding the session
	Transport string `json:"transport,omitempty"`
	AtMs      int64  `json:"atMs"` // when the event happened (session start for online)

	// Online.
	ClientID   string          `json:"clientId,omitempty"`
	RemoteIP   string          `json:"remoteIp,omitempty"`
	UserAgent  string          `json:"userAgent,omitempty"`
	Hello      json.RawMessage `json:"hello,omitempty"`      // the device's hello frame, verbatim
	MCP        bool            `json:"mcp,omitempty"`        // the device announced features.mcp
	ServerInfo json.RawMessage `json:"serverInfo,omitempty"` // MCP initialize result .serverInfo

	// Online and tools: the full catalog after paging, a JSON array of MCP tools.
	Tools json.RawMessage `json:"tools,omitempty"`

	// Offline.
	Reason string `json:"reason,omitempty"`

	// Notification: the JSON-RPC notification object, verbatim.
	Notification json.RawMessage `json:"notification,omitempty"`
}

// InvokeRequest is the payload of a NodeInvoke or OpenClawNodeInvoke request.
// The deadline travels in HeaderTimeout.
type InvokeRequest struct {
	NodeID         string          `json:"nodeId"`
	Command        string          `json:"command"`
	Params         json.RawMessage `json:"params,omitempty"`
	IdempotencyKey string          `json:"idempotencyKey,omitempty"`
}

// InvokeReply answers an InvokeRequest: a payload on success, else a Fault.
type InvokeReply struct {
	OK      bool            `json:"ok"`
	Payload json.RawMessage `json:"payload,omitempty"`
	Error   *Fault          `json:"error,omitempty"`
}

// Fault codes shared by the services. They are the node-level error codes an
// operator sees in details.nodeError.code (OpenClaw's node host uses
// INVALID_REQUEST, UNAVAILABLE and TIMEOUT; xiaoclaw adds the rest).
const (
	FaultNotConnected   = "NOT_CONNECTED"     // no session for the device/node
	FaultTimeout        = "TIMEOUT"           // the deadline passed before a reply
	FaultInvalidRequest = "INVALID_REQUEST"   // bad command, unknown tool, invalid arguments
	FaultDeviceError    = "DEVICE_ERROR"      // the device answered with a JSON-RPC error
	FaultBusy           = "BUSY"              // too many calls in flight for the device or the replica
	FaultRateLimited    = "RATE_LIMITED"      // the tenant has its whole share of calls in flight
	FaultTooLarge       = "PAYLOAD_TOO_LARGE" // request or result over the size limit
	FaultUnavailable    = "UNAVAILABLE"       // the service could not run the call
	FaultDisconnected   = "DISCONNECTED"      // the session ended while the call was pending
)

// Fault is an error that crosses a service boundary.
type Fault struct {
	Code    string          `json:"code"`
	Message string          `json:"message"`
	Details json.RawMessage `json:"details,omitempty"`
}

func (f *Fault) Error() string { return f.Code + ": " + f.Message }

// Limits a refused call can name in LimitDetails.Limit.
const (
	LimitTenant  = "tenant"  // the tenant's share of a shim replica
	LimitDevice  = "device"  // the tenant's share per device
	LimitReplica = "replica" // everything a shim replica runs at once
)

// LimitDetails are the Details of a BUSY or RATE_LIMITED fault raised by a
// limit: which limit, its value, and when to try again.
type LimitDetails struct {
	Limit        string `json:"limit"`
	Max          int    `json:"max"`
	RetryAfterMs int64  `json:"retryAfterMs"`
}

// NodeEventMsg is the payload of a NodeEvent message; gateways fan it out to
// the tenant's operators as an OpenClaw "node.event" event frame.
type NodeEventMsg struct {
	NodeID  string          `json:"nodeId"`
	Event   string          `json:"event"`
	Payload json.RawMessage `json:"payload,omitempty"`
	TsMs    int64           `json:"ts"`
}

// Node event names published by xiaoclaw itself.
const (
	EventNodeConnected    = "node.connected"
	EventNodeDisconnected = "node.disconnected"
	EventToolsChanged     = "mcp.tools.changed"
	// EventNodeToolsChanged carries the same change as EventToolsChanged
	// plus the catalog's new version (NodeRecord.ToolsVersion).
	EventNodeToolsChanged = "node.tools.changed"
	EventMCPNotification  = "mcp.notification"
	// EventNodeUpstream says a node's link to an upstream OpenClaw gateway
	// changed state; its payload is an UpstreamLink.
	EventNodeUpstream = "node.upstream"
)

// Node kinds in the registry.
const (
	NodeKindXiaoZhi  = "xiaozhi"  // a device behind a devicehub, served by the shim
	NodeKindOpenClaw = "openclaw" // a stock OpenClaw node host connected to a gateway
)

// NodeRecord is the value of a node registry entry (KV bucket BucketNodes).
type NodeRecord struct {
	NodeID          string          `json:"nodeId"`
	Tenant          string          `json:"tenant"`
	Kind            string          `json:"kind"`
	Device          string          `json:"device,omitempty"` // canonical device id (xiaozhi)
	DeviceRaw       string          `json:"deviceRaw,omitempty"`
	DisplayName     string          `json:"displayName,omitempty"`
	Platform        string          `json:"platform,omitempty"`
	DeviceFamily    string          `json:"deviceFamily,omitempty"`
	ModelIdentifier string          `json:"modelIdentifier,omitempty"`
	Version         string          `json:"version,omitempty"`
	ClientID        string          `json:"clientId,omitempty"`
	ClientMode      string          `json:"clientMode,omitempty"`
	RemoteIP        string          `json:"remoteIp,omitempty"`
	Transport       string          `json:"transport,omitempty"`
	Caps            []string        `json:"caps"`
	Commands        []string        `json:"commands"`
	Permissions     map[string]bool `json:"permissions,omitempty"`
	PathEnv         string          `json:"pathEnv,omitempty"`
	Tools           json.RawMessage `json:"tools,omitempty"` // MCP tool catalog
	Connected       bool            `json:"connected"`
	ConnectedAtMs   int64           `json:"connectedAtMs,omitempty"`
	LastSeenMs      int64           `json:"lastSeenMs,omitempty"`
	Owner           string          `json:"owner,omitempty"` // hub or gateway instance holding the session
	SessionID       string          `json:"sessionId,omitempty"`

	// ToolsVersion counts the catalog changes of the node: it increases by
	// one whenever Tools changes, across sessions, and never goes back.
	ToolsVersion uint64 `json:"toolsVersion,omitempty"`
	// ToolsStale is set while the connected session has not listed its
	// tools yet: Tools is then the catalog of an earlier session.
	ToolsStale bool `json:"toolsStale,omitempty"`
	// PendingTools names the tools the node gained after its first catalog
	// that no admin has approved yet (sorted). A tenant that requires tool
	// approval hides and refuses them until an admin approves.
	PendingTools []string `json:"pendingTools,omitempty"`
}
