package devicehub

import (
	"encoding/json"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// MetricNotificationsDropped counts device notifications the hub dropped
// because their device sent more than Config.NotifyRate allows.
const MetricNotificationsDropped = "xiaoclaw_devicehub_notifications_dropped_total"

// notifyWarnEvery spaces the warnings about one session's dropped
// notifications.
const notifyWarnEvery = time.Minute

// notifyLimit is the notification budget of one session. It is made on the
// first notification, so idle sessions cost nothing.
type notifyLimit struct {
	mu       sync.Mutex
	lim      *rate.Limiter
	dropped  int64     // since the last warning
	warnedAt time.Time // zero: no warning yet
}

func newNotificationsDropped(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: MetricNotificationsDropped,
		Help: "Device notifications dropped by the devicehub because the device exceeded its rate, by tenant.",
	}, []string{telemetry.LabelTenant})
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
				return existing, nil
			}
		}
		return nil, err
	}
	return c, nil
}

// allowNotification reports whether the session may publish one more
// notification now; a refusal is counted and, at most once per
// notifyWarnEvery, logged with the number dropped since.
func (s *session) allowNotification() bool {
	cfg := s.hub.cfg
	if cfg.NotifyRate < 0 {
		return true
	}
	s.notifyOnce.Do(func() {
		s.notify = &notifyLimit{lim: rate.NewLimiter(rate.Limit(cfg.NotifyRate), cfg.NotifyBurst)}
	})
	n := s.notify
	now := time.Now()
	n.mu.Lock()
	if n.lim.AllowN(now, 1) {
		n.mu.Unlock()
		return true
	}
	n.dropped++
	var dropped int64
	if n.warnedAt.IsZero() || now.Sub(n.warnedAt) >= notifyWarnEvery {
		dropped, n.dropped, n.warnedAt = n.dropped, 0, now
	}
	n.mu.Unlock()
	s.hub.notifyDropped.WithLabelValues(s.key.tenant).Inc()
	if dropped > 0 {
		s.hub.log.Warn("devicehub: device exceeds its notification rate; dropping notifications",
			append(s.logAttrs(), "dropped", dropped, "rate_per_s", cfg.NotifyRate, "burst", cfg.NotifyBurst)...)
	}
	return false
}

// publishNotification puts a device's JSON-RPC notification on its notify
// subject, within the session's rate.
func (s *session) publishNotification(payload json.RawMessage) {
	if !s.allowNotification() {
		return
	}
	ev := s.event(wire.DeviceNotification)
	ev.Notification = payload
	if err := s.hub.publishEvent(wire.DeviceNotify(s.key.tenant, s.key.device), s.key, ev); err != nil {
		s.hub.log.Debug("devicehub: notification not published", append(s.logAttrs(), "err", err)...)
	}
}
