package upstream

import (
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// This file tells operators how the links fare: the links gauge and the
// transitions counter (docs/observability.md), and a node.upstream node
// event to the tenant's operators when a link's state changes.

// metrics of the upstream service.
type metrics struct {
	links   *prometheus.GaugeVec
	changes *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (metrics, error) {
	links, err := telemetry.NewUpstreamLinks(reg)
	if err != nil {
		return metrics{}, err
	}
	changes, err := telemetry.NewUpstreamChanges(reg)
	if err != nil {
		return metrics{}, err
	}
	return metrics{links: links, changes: changes}, nil
}

// linkReport is what was last reported of a held link.
type linkReport struct {
	counted State             // the state the links gauge counts the link in; "" once released
	told    wire.UpstreamLink // the state of the last node.upstream event
}

// wireLink is the public part of a Status.
func (st Status) wireLink() wire.UpstreamLink {
	return wire.UpstreamLink{Upstream: st.Upstream, Tenant: st.Tenant, NodeID: st.NodeID, State: string(st.State),
		LastError: st.LastError, RequestID: st.RequestID, SinceMs: st.SinceMs}
}

// reportTaken counts a link just taken, in StateConnecting, and tells the
// operators.
func (s *Service) reportTaken(h *heldLink, st Status) {
	h.repMu.Lock()
	defer h.repMu.Unlock()
	h.rep.counted = st.State
	s.metrics.links.WithLabelValues(st.Tenant, st.Upstream, string(st.State)).Inc()
	s.metrics.changes.WithLabelValues(st.Tenant, st.Upstream, string(st.State)).Inc()
	h.rep.told = st.wireLink()
	s.publishLink(h.rep.told)
}

// reportStatus follows a change of a link's status (state, error or
// pairing request). The operators hear of a change of state, error or
// request, but not of each retry: a link that failed and tries again
// (connecting) is still reported as failed until the attempt ends, so a
// refused link costs one event, not one per attempt.
func (s *Service) reportStatus(h *heldLink, st Status) {
	h.repMu.Lock()
	defer h.repMu.Unlock()
	if h.rep.counted == "" { // released
		return
	}
	if st.State != h.rep.counted {
		s.metrics.links.WithLabelValues(st.Tenant, st.Upstream, string(h.rep.counted)).Dec()
		s.metrics.links.WithLabelValues(st.Tenant, st.Upstream, string(st.State)).Inc()
		s.metrics.changes.WithLabelValues(st.Tenant, st.Upstream, string(st.State)).Inc()
		h.rep.counted = st.State
	}
	told := h.rep.told
	if st.State == StateConnecting && told.State != string(StateOnline) && told.State != string(StateConnecting) {
		return // a retry
	}
	next := st.wireLink()
	if next.State == told.State && next.LastError == told.LastError && next.RequestID == told.RequestID {
		return
	}
	h.rep.told = next
	s.publishLink(next)
}

// reportReleased takes a link out of the gauge.
func (s *Service) reportReleased(h *heldLink) {
	h.repMu.Lock()
	defer h.repMu.Unlock()
	if h.rep.counted == "" {
		return
	}
	st := h.rep.told
	s.metrics.links.WithLabelValues(st.Tenant, st.Upstream, string(h.rep.counted)).Dec()
	h.rep.counted = ""
}

// publishLink sends a node.upstream event on the tenant's node event
// subject, which the gateways fan out to its operators.
func (s *Service) publishLink(l wire.UpstreamLink) {
	payload, err := json.Marshal(l)
	if err != nil {
		return
	}
	data, err := json.Marshal(wire.NodeEventMsg{NodeID: l.NodeID, Event: wire.EventNodeUpstream, Payload: payload,
		TsMs: time.Now().UnixMilli()})
	if err != nil {
		return
	}
	msg := &nats.Msg{Subject: wire.NodeEvent(l.Tenant), Header: nats.Header{wire.HeaderTenant: []string{l.Tenant}}, Data: data}
	if err := s.nc.PublishMsg(msg); err != nil {
		s.log.Warn("publish upstream link event", "tenant", l.Tenant, "node", l.NodeID, "upstream", l.Upstream, "err", err)
	}
}
