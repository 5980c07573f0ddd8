package devicehub

import (
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/authguard"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// maxClaimedBytes caps the device and client ids a refused device claimed,
// as they travel in the audit trail.
const maxClaimedBytes = 64

// authFailures throttles refused devices and folds their audit records.
// Per source address (Config.AuthFailures): a source that spent its budget
// is refused at every door (WebSocket 429, MQTT CONNACK "server
// unavailable", OTA 429) before its credential is looked at, and its
// refusals make one record per minute with their count. Per device id
// (Config.DeviceAuthFailures): the failures claiming one device id are
// answered 429 instead of 401 once its budget is spent, but a correct
// credential for that device is still accepted, so nobody can keep a
// device offline by failing in its name.
type authFailures struct {
	bySource *authguard.Guard[wire.DeviceAuthFailure]
	byDevice *authguard.Guard[struct{}]
}

func newAuthFailures(h *hub) *authFailures {
	return &authFailures{
		bySource: authguard.New(h.cfg.AuthFailures, h.publishAuthFailure),
		byDevice: authguard.New[struct{}](h.cfg.DeviceAuthFailures, nil),
	}
}

// throttled returns how long the source of remoteIP must wait, recording
// the refused attempt when it must.
func (h *hub) throttled(transport, remoteAddr string) time.Duration {
	remoteIP := remoteAddr
	if host, _, err := net.SplitHostPort(remoteAddr); err == nil {
		remoteIP = host
	}
	source := authguard.Source(remoteIP)
	wait := h.fails.bySource.RetryAfter(source)
	if wait > 0 {
		h.fails.bySource.Throttled(source, h.authFailure(transport, "", "", remoteIP, "throttled"))
	}
	return wait
}

// authFailed records a refusal: it spends the budget of the source and of
// the claimed device id and reaches the audit collectors folded per source.
// It returns how long the device id had to wait: > 0 when the claimed
// device had spent its budget before this failure.
func (h *hub) authFailed(transport, device, clientID, remoteIP, reason string) time.Duration {
	h.fails.bySource.Failed(authguard.Source(remoteIP), h.authFailure(transport, device, clientID, remoteIP, reason))
	if canon, err := wire.CanonicalDevice(device); err != nil || canon != device {
		return 0 // no device id, or only a claimed one: the source's budget covers it
	}
	wait := h.fails.byDevice.RetryAfter(device)
	h.fails.byDevice.Failed(device, struct{}{})
	return wait
}

func (h *hub) authFailure(transport, device, clientID, remoteIP, reason string) wire.DeviceAuthFailure {
	return wire.DeviceAuthFailure{
		Hub: h.cfg.Instance, Transport: transport, Device: cutClaim(device), ClientID: cutClaim(clientID),
		RemoteIP: remoteIP, Reason: reason, AtMs: nowMs(),
	}
}

// publishAuthFailure tells the audit collectors that a device (count
// times, from one source) was refused. It never carries a credential.
// Core NATS publish: it is buffered by the client and never blocks the
// refusal.
func (h *hub) publishAuthFailure(f wire.DeviceAuthFailure, count int) {
	if count > 1 {
		f.Count = count
	}
	data, err := json.Marshal(f)
	if err != nil {
		return
	}
	if err := h.nc.PublishMsg(&nats.Msg{Subject: wire.SubjectDeviceAuthFailure, Data: data}); err != nil {
		h.log.Warn("devicehub: auth failure not published", "err", err)
	}
}

// tooManyFailures answers a throttled HTTP request: 429 with Retry-After.
func tooManyFailures(w http.ResponseWriter, wait time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(authguard.RetryAfterSeconds(wait)))
	writeJSONError(w, http.StatusTooManyRequests, "too many failed attempts; retry later")
}

func cutClaim(s string) string {
	if len(s) > maxClaimedBytes {
		return s[:maxClaimedBytes]
	}
	return s
}
