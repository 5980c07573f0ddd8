package gateway

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
)

// invokeMetrics are the gateway's node.invoke metrics (declared in
// pkg/telemetry), with the fixed-label children looked up once.
type invokeMetrics struct {
	invokes   *prometheus.CounterVec
	hopInvoke prometheus.Observer // the whole call, frame in to response out
	hopShim   prometheus.Observer // the NATS request to a shim or node host's gateway
	allowed   prometheus.Counter
	denied    prometheus.Counter
}

func newInvokeMetrics(reg prometheus.Registerer) (invokeMetrics, error) {
	var m invokeMetrics
	var err error
	if m.invokes, err = telemetry.NewInvokes(reg); err != nil {
		return m, err
	}
	hops, err := telemetry.NewHopDuration(reg)
	if err != nil {
		return m, err
	}
	m.hopInvoke = hops.WithLabelValues(telemetry.HopInvoke)
	m.hopShim = hops.WithLabelValues(telemetry.HopGatewayShim)
	decisions, err := telemetry.NewPolicyDecisions(reg)
	if err != nil {
		return m, err
	}
	m.allowed = decisions.WithLabelValues(telemetry.EffectAllow)
	m.denied = decisions.WithLabelValues(telemetry.EffectDeny)
	return m, nil
}
