package devstack

import (
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/xiaoclaw/xiaoclaw/pkg/natsconn"
	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
)

// errorHandler reports the asynchronous errors (slow consumers) of the
// connection of the replica called name, as a service process does, into
// the stack's Registerer (or a private one).
func (s *Stack) errorHandler(name string) nats.Option {
	reg := s.cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	service := "xiaoclaw"
	for prefix, label := range map[string]string{"hub": telemetry.LabelDevicehub, "shim": telemetry.LabelShim, "gateway": telemetry.LabelGateway} {
		if strings.HasPrefix(name, prefix) {
			service = label
		}
	}
	h, err := natsconn.ErrorHandler(reg, service, s.cfg.Log.With("nats_connection", name))
	if err != nil {
		// The counter cannot be registered (a clashing metric): log only.
		h, _ = natsconn.ErrorHandler(prometheus.NewRegistry(), service, s.cfg.Log.With("nats_connection", name))
	}
	return nats.ErrorHandler(h)
}
