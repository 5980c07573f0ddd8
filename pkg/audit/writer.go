package audit

import (
	"bytes"
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

// WriterConfig configures a Writer. Zero values take the defaults.
type WriterConfig struct {
	Stream StreamConfig
	// Durable names the pull consumer all writer replicas share.
	// Default wire.ConsumerAuditWriter.
	Durable string
	// BatchSize is the most events written in one transaction. Default 1000.
	BatchSize int
	// Workers is how many fetch-and-write loops run in this writer, so that
	// one fetches while another writes. Default 2.
	Workers int
	// MaxWait is how long a fetch waits to fill a batch; it bounds the
	// delay of an event under light load. Default 50 ms.
	MaxWait time.Duration
	// AckWait is how long the stream waits for a writer's acknowledgement
	// before it hands the events to another writer. While the store is
	// down a writer keeps extending it. Default 30 s.
	AckWait time.Duration
	// MaxRetryDelay caps the growing pause between write attempts while
	// the store fails. Default 5 s.
	MaxRetryDelay time.Duration
	// Retention, if set, is applied every PruneInterval (default 1 h).
	Retention     *Retention
	PruneInterval time.Duration
	// OnCommit, if set, is called after each committed batch with the
	// events and the commit time (for metrics and benchmarks).
	OnCommit func(events []Event, committed time.Time)
	// AttemptGrace is how long a node.invoke.attempt is held back (its
	// message unacknowledged) waiting for its outcome, which makes it
	// redundant: a call that ends within it leaves one row. An attempt
	// still alone after it is stored. Default 2 s, at most AckWait/4.
	AttemptGrace time.Duration
}

func (c *WriterConfig) setDefaults() {
	if c.Durable == "" {
		c.Durable = wire.ConsumerAuditWriter
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 1000
	}
	if c.Workers <= 0 {
		c.Workers = 2
	}
	if c.MaxWait <= 0 {
		c.MaxWait = 50 * time.Millisecond
	}
	if c.AckWait <= 0 {
		c.AckWait = 30 * time.Second
	}
	if c.MaxRetryDelay <= 0 {
		c.MaxRetryDelay = 5 * time.Second
	}
	if c.PruneInterval <= 0 {
		c.PruneInterval = time.Hour
	}
	if c.AttemptGrace <= 0 {
		c.AttemptGrace = 2 * time.Second
	}
	c.AttemptGrace = min(c.AttemptGrace, c.AckWait/4)
}

// Writer moves events from the XC_AUDIT stream into a Store. Run any number
// of replicas: they share one durable consumer. An event is acknowledged
// only after the transaction holding it committed, and the store ignores
// ids it has, so a store outage delays events and a crash (before or after
// the commit) neither loses nor duplicates any.
type Writer struct {
	nc    *nats.Conn
	store Store
	cfg   WriterConfig
	log   *slog.Logger
	ready chan struct{}

	mu      sync.Mutex
	settled map[string]time.Time // attempt ids whose outcome a loop has read → when
	pruned  time.Time            // when settled was last pruned
}

// heldMessage is a stream message whose events are decoded; once stored in
// part, events holds only its attempts waiting for their outcome.
type heldMessage struct {
	msg    jetstream.Msg
	events []Event
}

// NewWriter returns a writer; Run starts it.
func NewWriter(nc *nats.Conn, store Store, cfg WriterConfig, log *slog.Logger) (*Writer, error) {
	if nc == nil || store == nil || log == nil {
		return nil, errors.New("audit: writer needs a NATS connection, a store and a logger")
	}
	cfg.setDefaults()
	return &Writer{nc: nc, store: store, cfg: cfg, log: log, ready: make(chan struct{}), settled: map[string]time.Time{}}, nil
}

// Ready is closed once the writer consumes the stream.
func (w *Writer) Ready() <-chan struct{} { return w.ready }

// Run consumes until ctx is done, then returns nil. Events it holds but has
// not committed are handed back to the stream for another writer.
func (w *Writer) Run(ctx context.Context) error {
	js, err := jetstream.New(w.nc)
	if err != nil {
		return fmt.Errorf("audit writer: %w", err)
	}
	cons, err := w.consumer(ctx, js)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	close(w.ready)
	if err := w.store.Prepare(ctx, time.Now()); err != nil && ctx.Err() == nil {
		w.log.Warn("audit store: creating partitions ahead failed; writes create them as needed", "err", err)
	}
	var wg sync.WaitGroup
	for i := range w.cfg.Workers {
		wg.Go(func() { w.loop(ctx, cons, i == 0) })
	}
	wg.Wait()
	return nil
}

// loop fetches and commits batches until ctx is done; the maintainer also
// creates partitions and applies retention on schedule.
func (w *Writer) loop(ctx context.Context, cons jetstream.Consumer, maintainer bool) {
	lastMaintain := time.Now()
	var held []heldMessage
	defer func() {
		for _, h := range held {
			_ = h.msg.Nak() // shutting down: another writer takes them now
		}
	}()
	for ctx.Err() == nil {
		if maintainer && time.Since(lastMaintain) >= w.cfg.PruneInterval {
			lastMaintain = time.Now()
			w.maintain(ctx)
		}
		batch, err := cons.Fetch(w.cfg.BatchSize, jetstream.FetchMaxWait(w.cfg.MaxWait))
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.log.Warn("audit writer: fetch", "err", err)
			w.pause(ctx, time.Second)
			continue
		}
		msgs := make([]jetstream.Msg, 0, w.cfg.BatchSize)
		for m := range batch.Messages() {
			msgs = append(msgs, m)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && ctx.Err() == nil {
			w.log.Warn("audit writer: fetch", "err", err)
		}
		if len(msgs) > 0 || len(held) > 0 {
			held = w.commit(ctx, msgs, held)
		}
	}
}

// consumer creates or binds the durable consumer, retrying until ctx ends
// (NATS may not be up yet).
func (w *Writer) consumer(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, error) {
	delay := 100 * time.Millisecond
	for {
		cons, err := func() (jetstream.Consumer, error) {
			s, err := EnsureStream(ctx, js, w.cfg.Stream)
			if err != nil {
				return nil, err
			}
			return s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
				Durable:       w.cfg.Durable,
				Description:   "audit writers: XC_AUDIT into the audit store",
				AckPolicy:     jetstream.AckExplicitPolicy,
				AckWait:       w.cfg.AckWait,
				MaxDeliver:    -1,
				MaxAckPending: 20 * w.cfg.BatchSize * w.cfg.Workers,
				FilterSubject: wire.SubjectAuditAll,
			})
		}()
		if err == nil {
			return cons, nil
		}
		w.log.Warn("audit writer: cannot bind the stream consumer; retrying", "err", err)
		if !w.pause(ctx, delay) {
			return nil, ctx.Err()
		}
		delay = min(2*delay, w.cfg.MaxRetryDelay)
	}
}

// commit writes one fetched batch, retrying while the store fails, and
// acknowledges it after the commit.
func (w *Writer) commit(ctx context.Context, msgs []jetstream.Msg, held []heldMessage) []heldMessage {
	batch := held
	for _, m := range msgs {
		got, err := decodeMessage(m.Data())
		if err != nil {
			// Retrying cannot make it storable: drop it loudly.
			w.log.Error("audit writer: dropping an event that cannot be stored", "subject", m.Subject(), "err", err,
				"bytes", len(m.Data()))
			_ = m.Term()
			continue
		}
		batch = append(batch, heldMessage{msg: m, events: got})
	}
	events, keep, held := w.pair(batch, time.Now())
	if len(events) == 0 {
		for _, m := range keep {
			_ = m.Ack()
		}
		return held
	}
	delay := 100 * time.Millisecond
	lastProgress := time.Now()
	for attempt := 1; ; attempt++ {
		_, err := w.store.Write(ctx, events)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			// Shutting down: hand the batch to another writer now rather
			// than after AckWait.
			for _, m := range keep {
				_ = m.Nak()
			}
			return held
		}
		w.log.Warn("audit writer: store write failed; retrying", "events", len(events), "attempt", attempt, "err", err)
		if time.Since(lastProgress) > w.cfg.AckWait/3 {
			for _, m := range keep {
				_ = m.InProgress() // still ours: do not redeliver while we retry
			}
			for _, h := range held {
				_ = h.msg.InProgress()
			}
			lastProgress = time.Now()
		}
		w.pause(ctx, delay)
		delay = min(2*delay, w.cfg.MaxRetryDelay, w.cfg.AckWait/3)
	}
	committed := time.Now()
	for _, m := range keep {
		_ = m.Ack() // a lost ack means one redelivery, which the store ignores
	}
	if w.cfg.OnCommit != nil {
		w.cfg.OnCommit(events, committed)
	}
	return held
}

func (w *Writer) maintain(ctx context.Context) {
	now := time.Now()
	if err := w.store.Prepare(ctx, now); err != nil {
		w.log.Warn("audit store: creating partitions ahead failed", "err", err)
	}
	if w.cfg.Retention == nil {
		return
	}
	n, err := w.store.Prune(ctx, *w.cfg.Retention, now)
	if err != nil {
		w.log.Warn("audit store: retention failed", "err", err)
		return
	}
	w.log.Info("audit store: retention applied", "deleted", n)
}

// pause waits d or until ctx is done; false means ctx is done.
func (w *Writer) pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// pair decides what a batch stores. A node.invoke.attempt whose outcome has
// been read (by any loop of this writer) is left out: the outcome row holds
// all it says, so a call that ends within AttemptGrace leaves one row. One
// whose outcome has not come yet is held back, its message unacknowledged,
// until AttemptGrace after the call, then stored. It returns the events to
// store, the messages to acknowledge once they are, and the messages still
// held (with only their waiting attempts).
func (w *Writer) pair(batch []heldMessage, now time.Time) (events []Event, done []jetstream.Msg, held []heldMessage) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, h := range batch {
		for _, e := range h.events {
			if e.Kind == KindInvoke {
				w.settled[AttemptID(e.ID)] = now
			}
		}
	}
	if now.Sub(w.pruned) > w.cfg.AttemptGrace {
		w.pruned = now
		for id, at := range w.settled {
			if now.Sub(at) > 4*w.cfg.AttemptGrace {
				delete(w.settled, id)
			}
		}
	}
	for _, h := range batch {
		var waiting []Event
		for _, e := range h.events {
			switch {
			case e.Kind != KindInvokeAttempt:
				events = append(events, e)
			case !w.settled[e.ID].IsZero(): // its outcome holds all it says
			case now.Sub(e.Time) < w.cfg.AttemptGrace:
				waiting = append(waiting, e)
			default:
				events = append(events, e)
			}
		}
		if len(waiting) > 0 {
			held = append(held, heldMessage{msg: h.msg, events: waiting})
		} else {
			done = append(done, h.msg)
		}
	}
	return events, done, held
}

// decodeMessage reads a stream message: one event, or a JSON array of
// events (Publisher.Later's batches). Any event that cannot be stored
// fails the whole message.
func decodeMessage(data []byte) ([]Event, error) {
	var events []Event
	if t := bytes.TrimLeft(data, " \t\r\n"); len(t) > 0 && t[0] == '[' {
		if err := json.Unmarshal(data, &events); err != nil {
			return nil, err
		}
		if len(events) == 0 {
			return nil, fmt.Errorf("%w: empty batch", ErrInvalidEvent)
		}
	} else {
		var e Event
		if err := json.Unmarshal(data, &e); err != nil {
			return nil, err
		}
		events = []Event{e}
	}
	for i := range events {
		events[i].normalize()
		if err := events[i].Validate(); err != nil {
			return nil, err
		}
	}
	return events, nil
}
