package gateway

import (
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
	"github.com/xiaoclaw/xiaoclaw/services/gateway/internal/protocol"
)

// onNodeEvent fans a node event from NATS out to the operators of its
// tenant on this replica, each with its own seq. The payload is encoded
// once; only the seq differs per connection.
func (s *Service) onNodeEvent(m *nats.Msg) {
	tenant, ok := wire.TenantFromSubject(m.Subject)
	if !ok {
		return
	}
	var ev wire.NodeEventMsg
	if err := json.Unmarshal(m.Data, &ev); err != nil || ev.NodeID == "" || ev.Event == "" {
		s.log.Debug("ignoring malformed node event", "subject", m.Subject, "err", err)
		return
	}
	if ev.TsMs == 0 {
		ev.TsMs = time.Now().UnixMilli()
	}
	prefix := protocol.AppendEventPrefix(nil, protocol.EventNodeEvent, nodeEventPayload(&ev))
	s.mu.RLock()
	defer s.mu.RUnlock()
	for c := range s.operators[tenant] {
		if !c.scopes.allows(protocol.ScopeRead) {
			continue
		}
		frame := make([]byte, len(prefix), len(prefix)+24)
		copy(frame, prefix)
		c.send(protocol.AppendEventSeq(frame, c.seq.Add(1)))
	}
}

// publishNodeEvent publishes an event of a node on its tenant's subject.
func (s *Service) publishNodeEvent(tenant, nodeID, event string, payload json.RawMessage) {
	data, err := json.Marshal(wire.NodeEventMsg{NodeID: nodeID, Event: event, Payload: payload, TsMs: time.Now().UnixMilli()})
	if err != nil {
		s.log.Warn("encode node event", "err", err)
		return
	}
	m := &nats.Msg{Subject: wire.NodeEvent(tenant), Data: data, Header: nats.Header{}}
	m.Header.Set(wire.HeaderTenant, tenant)
	if err := s.nc.PublishMsg(m); err != nil {
		s.log.Warn("publish node event", "tenant", tenant, "node", nodeID, "err", err)
	}
}
