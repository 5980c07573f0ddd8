package wire

// SubjectDeviceAuthFailure carries a DeviceAuthFailure each time a devicehub
// refuses a device's WebSocket upgrade or MQTT CONNECT. The tenant is
// unknown (the credential was not accepted), so the subject has none. The
// audit collectors (queue group QueueAudit) record it; nothing else listens.
const SubjectDeviceAuthFailure = "xc._sys.device.authfail"

// DeviceAuthFailure is the payload of SubjectDeviceAuthFailure. It never
// holds the token, password or any other credential, only what the device
// claimed to be, where from and why it was refused.
type DeviceAuthFailure struct {
	Hub       string `json:"hub"`       // devicehub instance that refused
	Transport string `json:"transport"` // TransportWebSocket, TransportMQTT or "ota"
	// Device is the canonical device id, or the claimed id as sent
	// (cut to 64 bytes) when it was not a valid one.
	Device   string `json:"device,omitempty"`
	ClientID string `json:"clientId,omitempty"` // as sent, cut to 64 bytes
	RemoteIP string `json:"remoteIp,omitempty"`
	Reason   string `json:"reason"` // e.g. "unauthenticated", "invalid device id", "missing token"
	AtMs     int64  `json:"atMs"`
	// Count is how many refusals from RemoteIP this message stands for,
	// the latest described by the fields above (a hub folds a source's
	// repeated refusals into one message a minute); 0 means one.
	Count int `json:"count,omitempty"`
}
