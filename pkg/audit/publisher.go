package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/xiaoclaw/xiaoclaw/pkg/wire"
)

// StreamConfig sizes the XC_AUDIT stream; whoever creates it first sets it.
type StreamConfig struct {
	// MaxBytes bounds the events not yet written to the database. When it is
	// reached, publishes fail (and gateways refuse calls) rather than lose
	// events. Default 1 GiB.
	MaxBytes int64
	// Replicas is the stream's replica count in a NATS cluster. Default 1.
	Replicas int
	// Duplicates is the window in which a re-published event id is
	// dropped by the stream. Default 2 min.
	Duplicates time.Duration
}

func (c *StreamConfig) setDefaults() {
	if c.MaxBytes == 0 {
		c.MaxBytes = 1 << 30
	}
	if c.Replicas == 0 {
		c.Replicas = 1
	}
	if c.Duplicates == 0 {
		c.Duplicates = 2 * time.Minute
	}
}

// EnsureStream creates the XC_AUDIT stream if it does not exist and
// returns it. An existing stream is used as it is.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, error) {
	cfg.setDefaults()
	s, err := js.Stream(ctx, wire.StreamAudit)
	if err == nil {
		return s, nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("audit: stream %s: %w", wire.StreamAudit, err)
	}
	s, err = js.CreateStream(ctx, jetstream.StreamConfig{
		Name:        wire.StreamAudit,
		Description: "xiaoclaw audit events not yet written to the audit store",
		Subjects:    []string{wire.SubjectAuditAll},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.WorkQueuePolicy,
		Discard:     jetstream.DiscardNew,
		MaxBytes:    cfg.MaxBytes,
		Replicas:    cfg.Replicas,
		Duplicates:  cfg.Duplicates,
	})
	if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return js.Stream(ctx, wire.StreamAudit) // another replica won the race
	}
	if err != nil {
		return nil, fmt.Errorf("audit: create stream %s: %w", wire.StreamAudit, err)
	}
	return s, nil
}

// PublisherConfig configures a Publisher.
type PublisherConfig struct {
	Stream    StreamConfig
	Redaction Redaction
	// AckTimeout bounds the wait for the stream's acknowledgement when the
	// caller's context allows longer. Default 2 s.
	AckTimeout time.Duration
	// MaxPending bounds unacknowledged publishes in flight. Default 4096.
	MaxPending int
	// LaterDelay is how long an event given to Later may wait for a
	// Publish of its tenant to ride along with before it is sent on its
	// own. Default 5 ms.
	LaterDelay time.Duration
}

// maxBatch caps the events of one stream message.
const maxBatch = 64

// ErrUnavailable is returned (wrapped) when the stream did not take an
// event: the caller must not proceed as if it were recorded.
var ErrUnavailable = errors.New("audit unavailable")

// Publisher puts events on the XC_AUDIT stream. Safe for concurrent use.
//
// A stream message holds one event, or a JSON array of events of one
// tenant: Later queues events that need no wait, and the next Publish of
// their tenant carries them in its message, so a node.invoke's outcome
// rides with the next call's attempt instead of costing a message of its
// own.
type Publisher struct {
	js     jetstream.JetStream
	redact *redactor
	cfg    PublisherConfig
	log    *slog.Logger

	mu      sync.Mutex
	later   map[string][]Event // tenant → encoded-ready events waiting for a message
	pending int                // events in later
	flushAt *time.Timer        // sends what waits in later; nil when nothing waits
}

// NewPublisher makes sure the stream exists and returns a Publisher on nc.
func NewPublisher(ctx context.Context, nc *nats.Conn, cfg PublisherConfig, log *slog.Logger) (*Publisher, error) {
	if nc == nil || log == nil {
		return nil, errors.New("audit: publisher needs a NATS connection and a logger")
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = 2 * time.Second
	}
	if cfg.MaxPending <= 0 {
		cfg.MaxPending = 4096
	}
	if cfg.LaterDelay <= 0 {
		cfg.LaterDelay = 5 * time.Millisecond
	}
	// The async timeout frees futures whose caller gave up waiting.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(cfg.MaxPending),
		jetstream.WithPublishAsyncTimeout(cfg.AckTimeout))
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	if _, err := EnsureStream(ctx, js, cfg.Stream); err != nil {
		return nil, err
	}
	return &Publisher{js: js, redact: cfg.Redaction.compile(), cfg: cfg, log: log, later: map[string][]Event{}}, nil
}

// Publish redacts e's arguments, fills in a missing id and time, and returns
// once the stream has stored e; any other outcome is an error wrapping
// ErrUnavailable. The wait ends at ctx's deadline or after AckTimeout,
// whichever is first. Publishing the same id twice stores it once. Events
// of e's tenant queued by Later go in the same message.
func (p *Publisher) Publish(ctx context.Context, e Event) error {
	if err := p.prepare(&e); err != nil {
		return err
	}
	batch := p.takeLater(e.Tenant)
	err := p.send(ctx, e.Tenant, e.ID, append([]Event{e}, batch...))
	if err != nil && len(batch) > 0 {
		p.requeue(batch)
	}
	return err
}

// Later queues e to be stored without waiting: with the next Publish of its
// tenant, or on its own after LaterDelay. An event the stream does not take
// is tried again with the next message, and logged and dropped when
// MaxPending events already wait.
func (p *Publisher) Later(e Event) {
	if err := p.prepare(&e); err != nil {
		p.log.Error("audit: event dropped", "kind", e.Kind, "tenant", e.Tenant, "err", err)
		return
	}
	p.requeue([]Event{e})
}

// prepare redacts, completes and checks e.
func (p *Publisher) prepare(e *Event) error {
	if e.ID == "" {
		e.ID = NewID()
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	e.Args = p.redact.apply(e.Tool, e.Args)
	e.normalize()
	if err := e.Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	return nil
}

// takeLater removes up to maxBatch-1 waiting events of a tenant.
func (p *Publisher) takeLater(tenant string) []Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	q := p.later[tenant]
	if len(q) == 0 {
		return nil
	}
	n := min(len(q), maxBatch-1)
	batch := q[:n:n]
	if n == len(q) {
		delete(p.later, tenant)
	} else {
		p.later[tenant] = q[n:]
	}
	p.pending -= n
	return batch
}

// requeue puts events back to wait (or queues them first) and arms the
// flush.
func (p *Publisher) requeue(events []Event) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, e := range events {
		if p.pending >= p.cfg.MaxPending {
			p.log.Error("audit: event dropped, too many waiting", "kind", e.Kind, "tenant", e.Tenant, "id", e.ID)
			continue
		}
		p.later[e.Tenant] = append(p.later[e.Tenant], e)
		p.pending++
	}
	if p.pending > 0 && p.flushAt == nil {
		p.flushAt = time.AfterFunc(p.cfg.LaterDelay, p.flush)
	}
}

// flush sends every waiting event, a message per tenant and maxBatch.
func (p *Publisher) flush() {
	p.mu.Lock()
	p.flushAt = nil
	tenants := make([]string, 0, len(p.later))
	for t := range p.later {
		tenants = append(tenants, t)
	}
	p.mu.Unlock()
	var failed []Event
	for _, t := range tenants {
		for {
			batch := p.takeLater(t)
			if len(batch) == 0 {
				break
			}
			if err := p.send(context.Background(), t, batch[0].ID, batch); err != nil {
				p.log.Warn("audit: events not stored yet; retrying", "tenant", t, "events", len(batch), "err", err)
				failed = append(failed, batch...)
				break
			}
		}
	}
	if len(failed) > 0 {
		p.requeue(failed)
	}
}

// send publishes events of one tenant as one message with the given
// message id and waits for the stream's acknowledgement.
func (p *Publisher) send(ctx context.Context, tenant, msgID string, events []Event) error {
	var data []byte
	var err error
	if len(events) == 1 {
		data, err = json.Marshal(&events[0])
	} else {
		data, err = json.Marshal(events)
	}
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	msg := &nats.Msg{Subject: wire.Audit(tenant), Data: data, Header: nats.Header{}}
	msg.Header.Set(wire.HeaderTenant, tenant)
	fut, err := p.js.PublishMsgAsync(msg, jetstream.WithMsgID(msgID))
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	timer := time.NewTimer(p.cfg.AckTimeout)
	defer timer.Stop()
	select {
	case <-fut.Ok():
		return nil
	case err := <-fut.Err():
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	case <-ctx.Done():
		return fmt.Errorf("%w: no acknowledgement: %v", ErrUnavailable, ctx.Err())
	case <-timer.C:
		return fmt.Errorf("%w: no acknowledgement within %v", ErrUnavailable, p.cfg.AckTimeout)
	}
}
