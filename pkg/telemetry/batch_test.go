package telemetry_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/xiaoclaw/xiaoclaw/pkg/telemetry"
)

// batchExporter records the batches it is given. While gate is open (not
// nil and not closed) exports wait on it; err is returned from every export.
type batchExporter struct {
	mu       sync.Mutex
	batches  [][]string // span names
	shutdown bool
	gate     chan struct{}
	entered  chan struct{} // optional, buffered: told when an export starts
	err      error
}

func (e *batchExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.mu.Lock()
	gate, entered := e.gate, e.entered
	e.mu.Unlock()
	if entered != nil {
		entered <- struct{}{}
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	names := make([]string, len(spans))
	for i, s := range spans {
		names[i] = s.Name()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.batches = append(e.batches, names)
	return e.err
}

func (e *batchExporter) Shutdown(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.shutdown = true
	return nil
}

func (e *batchExporter) exported() (batches [][]string, spans []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, b := range e.batches {
		batches = append(batches, slices.Clone(b))
		spans = append(spans, b...)
	}
	return batches, spans
}

// waitExported waits until n spans have been exported.
func (e *batchExporter) waitExported(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, spans := e.exported(); len(spans) >= n {
			return
		}
		if time.Now().After(deadline) {
			_, spans := e.exported()
			t.Fatalf("exported %d spans, want %d", len(spans), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// startBatch returns a provider exporting through a BatchProcessor, and
// a function ending count spans named prefix0, prefix1, ...
func startBatch(t *testing.T, exp *batchExporter, opts telemetry.BatchOptions, sampler sdktrace.Sampler) (*telemetry.BatchProcessor, *sdktrace.TracerProvider, func(prefix string, count int)) {
	t.Helper()
	bp := telemetry.NewBatchProcessor(exp, opts)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(bp), sdktrace.WithSampler(sampler))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tr := tp.Tracer("test")
	return bp, tp, func(prefix string, count int) {
		for i := range count {
			_, span := tr.Start(context.Background(), prefix+strconv.Itoa(i))
			span.End()
		}
	}
}

func TestBatchProcessorExportsAFullBatchAtOnce(t *testing.T) {
	exp := &batchExporter{}
	_, _, end := startBatch(t, exp, telemetry.BatchOptions{ScheduleDelay: time.Hour, MaxExportBatch: 4}, sdktrace.AlwaysSample())
	end("s", 4)
	exp.waitExported(t, 4) // long before the hour's schedule
	if batches, _ := exp.exported(); len(batches) != 1 || len(batches[0]) != 4 {
		t.Fatalf("batches %v, want one of 4 spans", batches)
	}
}

func TestBatchProcessorExportsAPartialBatchOnSchedule(t *testing.T) {
	exp := &batchExporter{}
	_, _, end := startBatch(t, exp, telemetry.BatchOptions{ScheduleDelay: 20 * time.Millisecond}, sdktrace.AlwaysSample())
	end("s", 1)
	exp.waitExported(t, 1)
}

func TestBatchProcessorFlushSplitsIntoBatchesAndSkipsUnsampled(t *testing.T) {
	exp := &batchExporter{}
	_, tp, end := startBatch(t, exp, telemetry.BatchOptions{ScheduleDelay: time.Hour, MaxExportBatch: 3},
		sdktrace.ParentBased(sdktrace.AlwaysSample()))
	end("s", 10)
	// an unsampled span (a remote parent that is not sampled) is not exported
	unsampled := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(telemetry.NewBatchProcessor(exp, telemetry.BatchOptions{})),
		sdktrace.WithSampler(sdktrace.NeverSample()))
	_, span := unsampled.Tracer("test").Start(context.Background(), "unsampled")
	span.End()
	if err := unsampled.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := tp.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	batches, spans := exp.exported()
	if len(spans) != 10 || slices.Contains(spans, "unsampled") {
		t.Fatalf("exported %v, want s0..s9", spans)
	}
	for _, b := range batches {
		if len(b) > 3 {
			t.Fatalf("batch of %d spans, want at most 3: %v", len(b), batches)
		}
	}
	slices.Sort(spans)
	if want := []string{"s0", "s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8", "s9"}; !slices.Equal(spans, want) {
		t.Fatalf("exported %v, want %v", spans, want)
	}
}

func TestBatchProcessorDropsWhenTheQueueIsFullAndSaysSo(t *testing.T) {
	exp := &batchExporter{gate: make(chan struct{}), entered: make(chan struct{}, 8)}
	bp, tp, end := startBatch(t, exp, telemetry.BatchOptions{ScheduleDelay: time.Hour, MaxQueueSize: 2, MaxExportBatch: 1}, sdktrace.AlwaysSample())
	end("first", 1) // a full batch: the export goroutine takes it and waits at the gate
	select {
	case <-exp.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the first span was not taken for export")
	}
	end("queued", 2)  // fill the queue
	end("dropped", 3) // find it full; ending a span never waits
	if got := bp.Dropped(); got != 3 {
		t.Fatalf("dropped %d spans, want 3", got)
	}
	close(exp.gate)
	err := tp.Shutdown(context.Background())
	if err == nil || !strings.Contains(err.Error(), "3 spans dropped") {
		t.Fatalf("shutdown error %v, want one saying 3 spans dropped", err)
	}
	_, spans := exp.exported()
	slices.Sort(spans)
	if want := []string{"first0", "queued0", "queued1"}; !slices.Equal(spans, want) {
		t.Fatalf("exported %v, want %v", spans, want)
	}
}

func TestBatchProcessorShutdownExportsWhatIsQueued(t *testing.T) {
	exp := &batchExporter{}
	bp, tp, end := startBatch(t, exp, telemetry.BatchOptions{ScheduleDelay: time.Hour}, sdktrace.AlwaysSample())
	end("s", 5)
	if err := tp.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, spans := exp.exported(); len(spans) != 5 {
		t.Fatalf("exported %v at shutdown, want 5 spans", spans)
	}
	exp.mu.Lock()
	shut := exp.shutdown
	exp.mu.Unlock()
	if !shut {
		t.Fatal("the exporter was not shut down")
	}
	// afterwards: flush and shutdown again succeed without exporting
	if err := bp.ForceFlush(context.Background()); err != nil {
		t.Fatalf("flush after shutdown: %v", err)
	}
	if err := bp.Shutdown(context.Background()); err != nil {
		t.Fatalf("second shutdown: %v", err)
	}
}

func TestBatchProcessorFlushReportsExportErrors(t *testing.T) {
	exp := &batchExporter{err: errors.New("collector unreachable")}
	_, tp, end := startBatch(t, exp, telemetry.BatchOptions{ScheduleDelay: time.Hour}, sdktrace.AlwaysSample())
	end("s", 1)
	if err := tp.ForceFlush(context.Background()); err == nil || !strings.Contains(err.Error(), "collector unreachable") {
		t.Fatalf("flush error %v, want the exporter's", err)
	}
}

func TestBatchProcessorFlushHonoursItsContext(t *testing.T) {
	exp := &batchExporter{gate: make(chan struct{})}
	defer close(exp.gate)
	_, tp, end := startBatch(t, exp, telemetry.BatchOptions{ScheduleDelay: time.Hour}, sdktrace.AlwaysSample())
	end("s", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := tp.ForceFlush(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("flush against a stuck exporter returned %v, want the deadline", err)
	}
}
