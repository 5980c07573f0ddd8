package devicehub

import (
	"encoding/json"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// maxClaimedBytes caps the device and client ids a refused device claimed,
// as they travel in the audit trail.
const maxClaimedBytes = 64

// authFailed tells the audit collectors that a device was refused. It
// never carries a credential. Core NATS publish: it is buffered by the
// client and never blocks the refusal.
func (h *hub) authFailed(transport, device, clientID, remoteIP, reason string) {
	data, err := json.Marshal(wire.DeviceAuthFailure{
		Hub: h.cfg.Instance, Transport: transport, Device: cutClaim(device), ClientID: cutClaim(clientID),
		RemoteIP: remoteIP, Reason: reason, AtMs: nowMs(),
	})
	if err != nil {
		return
	}
	if err := h.nc.PublishMsg(&nats.Msg{Subject: wire.SubjectDeviceAuthFailure, Data: data}); err != nil {
		h.log.Warn("devicehub: auth failure not published", "err", err)
	}
}

func cutClaim(s string) string {
	if len(s) > maxClaimedBytes {
		return s[:maxClaimedBytes]
	}
	return s
}
