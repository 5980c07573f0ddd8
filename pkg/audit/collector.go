package audit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// Collector turns the bus's device lifecycle messages (online, offline),
// device authentication failures and tenancy change notifications into
// audit events. Replicas share the queue
// group wire.QueueAudit, so each message is recorded once. These messages
// are core NATS: what is published while no collector runs is not
// recorded (unlike node.invoke, which the gateway records itself).
type Collector struct {
	nc    *nats.Conn
	pub   *Publisher
	log   *slog.Logger
	ready chan struct{}
}

// NewCollector returns a collector publishing with pub.
func NewCollector(nc *nats.Conn, pub *Publisher, log *slog.Logger) (*Collector, error) {
	if nc == nil || pub == nil || log == nil {
		return nil, errors.New("audit: collector needs a NATS connection, a publisher and a logger")
	}
	return &Collector{nc: nc, pub: pub, log: log, ready: make(chan struct{})}, nil
}

// Ready is closed once the collector is subscribed.
func (c *Collector) Ready() <-chan struct{} { return c.ready }

// Run collects until ctx is done.
func (c *Collector) Run(ctx context.Context) error {
	ch := make(chan *nats.Msg, 4096)
	var subs []*nats.Subscription
	for _, subj := range []string{wire.SubjectDeviceStateAll, wire.SubjectTenancyChanged, wire.SubjectDeviceAuthFailure} {
		s, err := c.nc.ChanQueueSubscribe(subj, wire.QueueAudit, ch)
		if err != nil {
			return err
		}
		subs = append(subs, s)
	}
	defer func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}()
	if err := c.nc.Flush(); err != nil {
		return err
	}
	close(c.ready)
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-ch:
			e, ok := c.event(m)
			if !ok {
				continue
			}
			if err := c.pub.Publish(ctx, e); err != nil && ctx.Err() == nil {
				c.log.Error("audit collector: event not recorded", "kind", e.Kind, "tenant", e.Tenant, "err", err)
			}
		}
	}
}

// event converts a message; false for messages that are not audited
// (tool catalog updates, notifications, malformed input).
func (c *Collector) event(m *nats.Msg) (Event, bool) {
	if m.Subject == wire.SubjectDeviceAuthFailure {
		return deviceAuthFailureEvent(m.Data)
	}
	if m.Subject == wire.SubjectTenancyChanged {
		var ch wire.TenancyChange
		if json.Unmarshal(m.Data, &ch) != nil || wire.ValidTenant(ch.Tenant) != nil {
			return Event{}, false
		}
		return Event{Kind: KindTenancyChange, Tenant: ch.Tenant, Command: ch.Kind, Detail: ch.ID}, true
	}
	var ev wire.DeviceEvent
	tenant, device, ok := wire.DeviceFromSubject(m.Subject)
	if !ok || json.Unmarshal(m.Data, &ev) != nil {
		return Event{}, false
	}
	e := Event{Tenant: tenant, Device: device, Node: wire.DeviceNodeID(device), Instance: ev.Hub}
	switch ev.Kind {
	case wire.DeviceOnline, wire.DeviceConnecting:
		// A session is connecting first and online once listed: one
		// connect, stored once (same id), even if it never gets online.
		e.Kind, e.Detail = KindDeviceConnect, ev.Transport+" "+ev.RemoteIP
	case wire.DeviceOffline:
		e.Kind, e.Detail = KindDeviceDisconnect, ev.Reason
	default:
		return Event{}, false
	}
	if ev.AtMs > 0 {
		e.Time = time.UnixMilli(ev.AtMs)
	}
	// The same session event (re-announced on a hub resync) keeps its id,
	// so it is stored once.
	sum := sha256.Sum256([]byte(e.Kind + "\x00" + tenant + "\x00" + device + "\x00" + ev.SessionID))
	e.ID = "d" + hex.EncodeToString(sum[:14])
	return e, true
}

// deviceAuthFailureEvent records a devicehub's refusal under TenantUnknown:
// the device's claim of a tenant was not accepted. Each message is one
// refusal, so each gets a fresh id.
func deviceAuthFailureEvent(data []byte) (Event, bool) {
	var f wire.DeviceAuthFailure
	if json.Unmarshal(data, &f) != nil {
		return Event{}, false
	}
	e := Event{
		Kind: KindDeviceAuthFail, Tenant: TenantUnknown, Device: f.Device, Outcome: "rejected",
		ErrorCode: "unauthorized", Instance: f.Hub,
		Detail: "transport=" + f.Transport + " remote=" + f.RemoteIP + " client=" + strconv.Quote(f.ClientID) +
			" reason=" + strconv.Quote(f.Reason),
	}
	if f.Count > 1 {
		e.Detail += " count=" + strconv.Itoa(f.Count)
	}
	if f.AtMs > 0 {
		e.Time = time.UnixMilli(f.AtMs)
	}
	return e, true
}
