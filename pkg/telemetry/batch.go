package telemetry

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// BatchOptions tune a batch span processor; zero fields take the OTEL_BSP_*
// defaults of the specification.
type BatchOptions struct {
	ScheduleDelay  time.Duration // export at least this often: 5 s
	ExportTimeout  time.Duration // bound on one export: 30 s
	MaxQueueSize   int           // finished spans held before new ones are dropped: 2048
	MaxExportBatch int           // spans per export, at most MaxQueueSize: 512
}

func (o BatchOptions) withDefaults() BatchOptions {
	if o.ScheduleDelay <= 0 {
		o.ScheduleDelay = 5 * time.Second
	}
	if o.ExportTimeout <= 0 {
		o.ExportTimeout = 30 * time.Second
	}
	if o.MaxQueueSize <= 0 {
		o.MaxQueueSize = 2048
	}
	if o.MaxExportBatch <= 0 {
		o.MaxExportBatch = 512
	}
	o.MaxExportBatch = min(o.MaxExportBatch, o.MaxQueueSize)
	return o
}

// BatchProcessor queues finished sampled spans and hands them to an exporter
// in batches, from one goroutine: when a batch is full, every schedule delay,
// on ForceFlush and on Shutdown. A span that finds the queue full is dropped
// and counted, so a slow or unreachable backend never blocks a call.
//
// It does the job of the SDK's batch span processor, which sends every span
// over a channel to its export goroutine and so wakes that goroutine for
// nearly every span: with four spans per node.invoke, the scheduler work was
// a visible share of what tracing cost. Here ending a span appends it to a
// slice under a mutex, and the export goroutine wakes once per batch.
type BatchProcessor struct {
	exporter sdktrace.SpanExporter
	opts     BatchOptions

	mu      sync.Mutex
	queue   []sdktrace.ReadOnlySpan
	stopped bool

	full    chan struct{}   // a batch is ready (capacity 1: one wake-up pending at most)
	flushes chan chan error // ForceFlush requests
	stop    chan struct{}   // closed by Shutdown
	done    chan struct{}   // closed when the export goroutine has finished

	dropped  atomic.Uint64
	shutdown sync.Once
	stopErr  error
}

// NewBatchProcessor starts a processor exporting to exporter. Shut it down
// (or the tracer provider it is registered with) to export what is queued
// and release the exporter.
func NewBatchProcessor(exporter sdktrace.SpanExporter, opts BatchOptions) *BatchProcessor {
	opts = opts.withDefaults()
	p := &BatchProcessor{
		exporter: exporter,
		opts:     opts,
		queue:    make([]sdktrace.ReadOnlySpan, 0, opts.MaxQueueSize),
		full:     make(chan struct{}, 1),
		flushes:  make(chan chan error),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
	}
	go p.run()
	return p
}

// OnStart does nothing: only finished spans are exported.
func (*BatchProcessor) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd queues a finished span if it is sampled.
func (p *BatchProcessor) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	p.mu.Lock()
	if p.stopped || len(p.queue) >= p.opts.MaxQueueSize {
		p.mu.Unlock()
		p.dropped.Add(1)
		return
	}
	p.queue = append(p.queue, s)
	n := len(p.queue)
	p.mu.Unlock()
	if n == p.opts.MaxExportBatch {
		select {
		case p.full <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

// Dropped is the number of spans dropped because the queue was full or the
// processor shut down.
func (p *BatchProcessor) Dropped() uint64 { return p.dropped.Load() }

// ForceFlush exports every span queued so far and returns the first export
// error, or ctx's error if it ends first.
func (p *BatchProcessor) ForceFlush(ctx context.Context) error {
	reply := make(chan error, 1)
	select {
	case p.flushes <- reply:
	case <-p.done:
		return nil // shut down: everything queued has been exported
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Shutdown stops queueing, exports what is queued and shuts the exporter
// down. It waits for the export goroutine unless ctx ends first; calls after
// the first return the first one's result.
func (p *BatchProcessor) Shutdown(ctx context.Context) error {
	p.shutdown.Do(func() {
		p.mu.Lock()
		p.stopped = true
		p.mu.Unlock()
		close(p.stop)
		select {
		case <-p.done:
		case <-ctx.Done():
			p.stopErr = ctx.Err()
			return
		}
		var errs []error
		if n := p.Dropped(); n > 0 {
			errs = append(errs, fmt.Errorf("telemetry: %d spans dropped: the export queue (%d spans) was full", n, p.opts.MaxQueueSize))
		}
		p.stopErr = errors.Join(append(errs, p.exporter.Shutdown(ctx))...)
	})
	return p.stopErr
}

// run is the export goroutine.
func (p *BatchProcessor) run() {
	defer close(p.done)
	timer := time.NewTimer(p.opts.ScheduleDelay)
	defer timer.Stop()
	batch := make([]sdktrace.ReadOnlySpan, 0, p.opts.MaxExportBatch)
	for {
		var reply chan error
		select {
		case <-p.full:
		case <-timer.C:
		case reply = <-p.flushes:
		case <-p.stop:
			if err := p.exportQueued(&batch); err != nil {
				otel.Handle(err)
			}
			return
		}
		err := p.exportQueued(&batch)
		if reply != nil {
			reply <- err
		} else if err != nil {
			otel.Handle(err)
		}
		timer.Reset(p.opts.ScheduleDelay)
	}
}

// exportQueued exports the spans queued when it is called, in batches taken
// off the front of the queue one at a time, so the queue refills while a
// batch is out: at most MaxQueueSize spans wait and one batch is exported,
// as with the SDK's processor. batch is the reused memory of a batch.
// It returns the first export error.
func (p *BatchProcessor) exportQueued(batch *[]sdktrace.ReadOnlySpan) error {
	p.mu.Lock()
	left := len(p.queue) // not what arrives meanwhile: a flush must end
	p.mu.Unlock()
	var first error
	for left > 0 {
		n := min(left, p.opts.MaxExportBatch)
		p.mu.Lock()
		b := append((*batch)[:0], p.queue[:n]...)
		kept := copy(p.queue, p.queue[n:])
		clear(p.queue[kept:])
		p.queue = p.queue[:kept]
		p.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), p.opts.ExportTimeout)
		if err := p.exporter.ExportSpans(ctx, b); err != nil && first == nil {
			first = err
		}
		cancel()
		clear(b)
		*batch = b[:0]
		left -= n
	}
	return first
}
