package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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
}

// ErrUnavailable is returned (wrapped) when the stream did not take an
// event: the caller must not proceed as if it were recorded.
var ErrUnavailable = errors.New("audit unavailable")

// Publisher puts events on the XC_AUDIT stream. Safe for concurrent use.
type Publisher struct {
	js     jetstream.JetStream
	redact *redactor
	cfg    PublisherConfig
	log    *slog.Logger
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
	// The async timeout frees futures whose caller gave up waiting.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(cfg.MaxPending),
		jetstream.WithPublishAsyncTimeout(cfg.AckTimeout))
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	if _, err := EnsureStream(ctx, js, cfg.Stream); err != nil {
		return nil, err
	}
	return &Publisher{js: js, redact: cfg.Redaction.compile(), cfg: cfg, log: log}, nil
}

// Publish redacts e's arguments, fills in a missing id and time, and returns
// once the stream has stored e; any other outcome is an error wrapping
// ErrUnavailable. The wait ends at ctx's deadline or after AckTimeout,
// whichever is first. Publishing the same id twice stores it once.
func (p *Publisher) Publish(ctx context.Context, e Event) error {
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
	data, err := json.Marshal(&e)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	msg := &nats.Msg{Subject: wire.Audit(e.Tenant), Data: data, Header: nats.Header{}}
	msg.Header.Set(wire.HeaderTenant, e.Tenant)
	fut, err := p.js.PublishMsgAsync(msg, jetstream.WithMsgID(e.ID))
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
