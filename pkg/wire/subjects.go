package wire

// Subject grammar (see api/nats.md). <tenant> and <device>/<node> tokens are
// validated ids, never raw input.
//
//	xc.<tenant>.dev.<device>.rpc       req/reply  shim -> devicehub holding the session
//	xc.<tenant>.dev.<device>.state     pub        devicehub -> shim (queue "shim"): lifecycle
//	xc.<tenant>.dev.<device>.notify    pub        devicehub -> shim (queue "shim"): notifications
//	xc.<tenant>.node.invoke            req/reply  gateway -> shim (queue "shim")
//	xc.<tenant>.node.event             pub        shim, gateway -> every gateway
//	xc.<tenant>.ocnode.<node>.invoke   req/reply  gateway -> gateway holding an OpenClaw node host
//	xc._sys.hub.resync                 pub        shim -> every devicehub: re-announce sessions
//	xc._sys.hub.heartbeat              pub        every devicehub -> every shim: liveness
const (
	// SubjectDeviceStateAll matches every device state subject.
	SubjectDeviceStateAll = "xc.*.dev.*.state"
	// SubjectDeviceNotifyAll matches every device notification subject.
	SubjectDeviceNotifyAll = "xc.*.dev.*.notify"
	// SubjectNodeInvokeAll matches every tenant's node.invoke subject.
	SubjectNodeInvokeAll = "xc.*.node.invoke"
	// SubjectNodeEventAll matches every tenant's node.event subject.
	SubjectNodeEventAll = "xc.*.node.event"
	// SubjectHubResync asks every devicehub to publish an online event for
	// each session it holds (sent by a shim at start).
	SubjectHubResync = "xc._sys.hub.resync"

	// QueueShim is the queue group shared by all shim replicas.
	QueueShim = "shim"

	// BucketNodes is the JetStream KV bucket of the node registry; keys are
	// NodeKey(tenant, node).
	BucketNodes = "xc_nodes"
	// BucketIdempotency is the JetStream KV bucket that deduplicates
	// node.invoke by idempotency key across gateway replicas.
	BucketIdempotency = "xc_idem"
	// BucketActivation is the JetStream KV bucket of device activations
	// (devicehub OTA): keys "device.<device>" (an Activation record) and
	// "code.<6 digits>" (the device a pending code belongs to).
	BucketActivation = "xc_activation"
)

// DeviceRPC is the request/reply subject served by the devicehub replica
// that holds the device's session.
func DeviceRPC(tenant, device string) string { return "xc." + tenant + ".dev." + device + ".rpc" }

// DeviceState is the subject of a device's lifecycle events (online,
// tools, offline).
func DeviceState(tenant, device string) string { return "xc." + tenant + ".dev." + device + ".state" }

// DeviceNotify is the subject of a device's JSON-RPC notifications
// (DeviceNotification events). They travel apart from the lifecycle events
// so that a flood of them, or a consumer too slow for them, never costs a
// lifecycle event.
func DeviceNotify(tenant, device string) string {
	return "xc." + tenant + ".dev." + device + ".notify"
}

// NodeInvoke is the request/reply subject of node.invoke for a tenant.
func NodeInvoke(tenant string) string { return "xc." + tenant + ".node.invoke" }

// NodeEvent is the subject on which a tenant's node events are published.
func NodeEvent(tenant string) string { return "xc." + tenant + ".node.event" }

// OpenClawNodeInvoke is served by the gateway replica holding the WebSocket
// of a stock OpenClaw node host.
func OpenClawNodeInvoke(tenant, node string) string {
	return "xc." + tenant + ".ocnode." + node + ".invoke"
}

// NodeKey is the node registry key of a node.
func NodeKey(tenant, node string) string { return tenant + "." + node }

// TenantFromSubject returns the tenant token of an xc.<tenant>.… subject.
func TenantFromSubject(subject string) (string, bool) {
	const p = "xc."
	if len(subject) <= len(p) || subject[:len(p)] != p {
		return "", false
	}
	rest := subject[len(p):]
	for i := 0; i < len(rest); i++ {
		if rest[i] == '.' {
			t := rest[:i]
			return t, ValidTenant(t) == nil
		}
	}
	return "", false
}

// DeviceFromSubject returns tenant and device of an xc.<t>.dev.<d>.<kind> subject.
func DeviceFromSubject(subject string) (tenant, device string, ok bool) {
	tenant, ok = TenantFromSubject(subject)
	if !ok {
		return "", "", false
	}
	rest := subject[len("xc.")+len(tenant):]
	const d = ".dev."
	if len(rest) <= len(d) || rest[:len(d)] != d {
		return "", "", false
	}
	rest = rest[len(d):]
	for i := 0; i < len(rest); i++ {
		if rest[i] == '.' {
			return tenant, rest[:i], rest[:i] != ""
		}
	}
	return "", "", false
}
