package shim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/shim/internal/nodes"
)

// Pending limits of the two device subscriptions. Lifecycle events are few
// and must not be lost, so their buffer is large; notifications are many
// and worth less, so a backlog of them is dropped early, and on their own
// subscription that costs no lifecycle event. nats.go counts what a full
// buffer drops, and the connection's error handler reports it.
const (
	statePendingMsgs   = 1 << 20
	statePendingBytes  = 512 << 20
	notifyPendingMsgs  = 16 << 10
	notifyPendingBytes = 64 << 20
)

// onNotify receives a device notification from a devicehub.
func (s *Service) onNotify(msg *nats.Msg) {
	ev, err := decodeDeviceEvent(msg.Subject, msg.Data)
	if err != nil || ev.Kind != wire.DeviceNotification {
		s.log.Debug("device notification dropped", "subject", msg.Subject, "err", err)
		return
	}
	s.publishNotification(ev)
}

// onState receives a device lifecycle event from a devicehub. (Hubs of
// older releases send notifications here too.)
func (s *Service) onState(msg *nats.Msg) {
	ev, err := decodeDeviceEvent(msg.Subject, msg.Data)
	if err != nil {
		s.log.Warn("device event dropped", "subject", msg.Subject, "err", err)
		return
	}
	if ev.Kind == wire.DeviceNotification {
		s.publishNotification(ev)
		return
	}
	s.enqueue(nodes.Pending{Event: ev})
}

// decodeDeviceEvent parses and checks a DeviceEvent. The subject is the
// authority on tenant and device: a body naming another device is refused.
func decodeDeviceEvent(subject string, data []byte) (*wire.DeviceEvent, error) {
	tenant, device, ok := wire.DeviceFromSubject(subject)
	if !ok {
		return nil, errors.New("subject is not a device state subject")
	}
	if c, err := wire.CanonicalDevice(device); err != nil || c != device {
		return nil, fmt.Errorf("subject device %q is not canonical", device)
	}
	var ev wire.DeviceEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		return nil, fmt.Errorf("not a device event: %w", err)
	}
	if ev.Tenant == "" {
		ev.Tenant = tenant
	}
	if ev.Tenant != tenant {
		return nil, fmt.Errorf("event tenant %q differs from the subject's %q", ev.Tenant, tenant)
	}
	if ev.Device == "" {
		ev.Device = device
	}
	if ev.Device != device {
		return nil, fmt.Errorf("event device %q differs from the subject's %q", ev.Device, device)
	}
	switch ev.Kind {
	case wire.DeviceOnline, wire.DeviceConnecting, wire.DeviceTools, wire.DeviceOffline:
		if ev.SessionID == "" {
			return nil, fmt.Errorf("%s event without sessionId", ev.Kind)
		}
		if t := bytes.TrimSpace(ev.Tools); len(t) > 0 && t[0] != '[' && !bytes.Equal(t, []byte("null")) {
			return nil, errors.New("tools is not a JSON array")
		}
		if bytes.Equal(bytes.TrimSpace(ev.Tools), []byte("null")) {
			ev.Tools = nil
		}
	case wire.DeviceNotification:
		if len(ev.Notification) == 0 {
			return nil, errors.New("notification event without notification")
		}
	default:
		return nil, fmt.Errorf("unknown event kind %q", ev.Kind)
	}
	return &ev, nil
}

// notificationPayload is the mcp.notification node event payload.
type notificationPayload struct {
	Method string          `json:"method"`
	Params json.RawMessage `json:"params,omitempty"`
}

// publishNotification forwards a device's JSON-RPC notification to the
// tenant's operators as an mcp.notification node event.
func (s *Service) publishNotification(ev *wire.DeviceEvent) {
	var n notificationPayload
	if err := json.Unmarshal(ev.Notification, &n); err != nil || n.Method == "" {
		s.log.Warn("device notification dropped: not a JSON-RPC notification", "tenant", ev.Tenant, "device", ev.Device)
		return
	}
	payload, err := json.Marshal(n)
	if err != nil {
		return
	}
	ts := ev.AtMs
	if ts == 0 {
		ts = time.Now().UnixMilli()
	}
	s.reg.Publish(ev.Tenant, wire.NodeEventMsg{NodeID: wire.DeviceNodeID(ev.Device), Event: wire.EventMCPNotification, Payload: payload, TsMs: ts})
}
