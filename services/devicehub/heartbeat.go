package devicehub

import (
	"context"
	"encoding/json"
	"time"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// heartbeat publishes a wire.HubHeartbeat at once and then every
// HeartbeatInterval until ctx ends, so shims can tell a hub that died
// without publishing offline events (see wire.SubjectHubHeartbeat).
func (h *hub) heartbeat(ctx context.Context, startedMs int64) {
	t := time.NewTicker(h.cfg.HeartbeatInterval)
	defer t.Stop()
	for {
		data, _ := json.Marshal(wire.HubHeartbeat{
			Hub: h.cfg.Instance, StartedMs: startedMs,
			IntervalMs: h.cfg.HeartbeatInterval.Milliseconds(), Sessions: h.count(),
		})
		if err := h.nc.Publish(wire.SubjectHubHeartbeat, data); err != nil {
			h.log.Debug("devicehub: heartbeat not published", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
