package devstack

import (
	"context"

	"github.com/nats-io/nats.go"

	"github.com/xiaoclaw/xiaoclaw/pkg/audit"
)

// startAuditWorkers runs the audit writer (stream → store), with a
// Registerer the monitor of its backlog and lag, and the collector (device
// sessions and tenancy changes → stream), each on its own connection.
func (s *Stack) startAuditWorkers() error {
	_, err := add(s, "audit-writer", func(nc *nats.Conn) (struct{}, runner, error) {
		run, err := s.Tenancy.AuditWriter(nc, s.cfg.Registerer)
		if err != nil {
			return struct{}{}, nil, err
		}
		return struct{}{}, readyAtOnce(run), nil
	}, func(struct{}) {})
	if err != nil {
		return err
	}
	_, err = add(s, "audit-collector", func(nc *nats.Conn) (*audit.Collector, runner, error) {
		c, err := audit.NewCollector(nc, s.Tenancy.Publisher, s.cfg.Log)
		if err != nil {
			return nil, nil, err
		}
		return c, readyAtOnce(c.Run), nil
	}, func(*audit.Collector) {})
	return err
}

// ready adapts a component that is ready as soon as it runs.
type ready struct {
	run func(context.Context) error
	ch  chan struct{}
}

func readyAtOnce(run func(context.Context) error) ready {
	ch := make(chan struct{})
	close(ch)
	return ready{run: run, ch: ch}
}

func (r ready) Run(ctx context.Context) error { return r.run(ctx) }
func (r ready) Ready() <-chan struct{}        { return r.ch }
