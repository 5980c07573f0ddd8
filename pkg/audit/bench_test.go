package audit_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/xiaoclaw/xiaoclaw/pkg/audit"
)

func benchEvent(i int) audit.Event {
	return audit.Event{Kind: audit.KindInvoke, Tenant: "acme", Principal: "tok_op", PrincipalName: "ci", Role: "operator",
		Node: "xz-a1b2c3d4e5f6", Command: "mcp.tools.call", Tool: "self.audio_speaker.set_volume",
		Args: json.RawMessage(`{"volume":30}`), Decision: audit.DecisionAllow, Outcome: "ok", LatencyUs: int64(900 + i%200),
		TraceID: "4bf92f3577b34da6a3ce929d0e0e4736", SpanID: "00f067aa0ba902b7", IdempotencyKey: fmt.Sprint(i), Instance: "gw-1"}
}

// BenchmarkPublish is the audit step on the node.invoke path: redact,
// encode, publish to the file-backed stream and wait for its ack, one call
// at a time (µs/op is what one invoke pays).
func BenchmarkPublish(b *testing.B) {
	ctx := context.Background()
	connect := embeddedNATS(b)
	p, err := audit.NewPublisher(ctx, connect(), audit.PublisherConfig{}, quietLog())
	if err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		start := time.Now()
		if err := p.Publish(ctx, benchEvent(i)); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkRedact is the redaction of a small argument object with a secret,
// including compiling the rules (Redaction.Redact does each call; a
// Publisher compiles them once).
func BenchmarkRedact(b *testing.B) {
	r := audit.Redaction{}
	args := json.RawMessage(`{"ssid":"home","password":"hunter2","retries":3}`)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		r.Redact("wifi.join", args)
	}
}

// BenchmarkWriterPostgres: gateways publish at a steady 12,000 events/s
// for b.N events; the writer must keep up (rows/s) with a low
// enqueue-to-commit delay (p99-ms). Run with -benchtime=30000x or more.
func BenchmarkWriterPostgres(b *testing.B) {
	ctx := context.Background()
	connect := embeddedNATS(b)
	store := openPostgres(b, postgresURL())
	var pubs []*audit.Publisher
	for range 4 {
		p, err := audit.NewPublisher(ctx, connect(), audit.PublisherConfig{}, quietLog())
		if err != nil {
			b.Fatal(err)
		}
		pubs = append(pubs, p)
	}
	var mu sync.Mutex
	var delays []time.Duration
	var rows atomic.Int64
	all := make(chan struct{})
	w, _ := audit.NewWriter(connect(), store, audit.WriterConfig{OnCommit: func(ev []audit.Event, at time.Time) {
		mu.Lock()
		for _, e := range ev {
			delays = append(delays, at.Sub(e.Time))
		}
		mu.Unlock()
		if rows.Add(int64(len(ev))) == int64(b.N) {
			close(all)
		}
	}}, quietLog())
	runWriter(b, w)
	if err := store.Prepare(ctx, time.Now()); err != nil {
		b.Fatal(err)
	}
	const rate = 12000 // events/s offered
	b.ResetTimer()
	start := time.Now()
	var g errgroup.Group
	next := atomic.Int64{}
	for k := range 32 {
		g.Go(func() error {
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					return nil
				}
				// Pace: event i is due at start + i/rate.
				if d := time.Until(start.Add(time.Duration(i) * time.Second / rate)); d > 0 {
					time.Sleep(d)
				}
				e := benchEvent(int(i))
				e.ID = fmt.Sprintf("b%09d", i)
				e.Time = time.Now()
				if err := pubs[k%len(pubs)].Publish(ctx, e); err != nil {
					return err
				}
			}
		})
	}
	if err := g.Wait(); err != nil {
		b.Fatal(err)
	}
	select {
	case <-all:
	case <-time.After(2 * time.Minute):
		b.Fatalf("only %d of %d rows committed", rows.Load(), b.N)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(delays)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "rows/s")
	b.ReportMetric(float64(delays[len(delays)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(delays[len(delays)*99/100].Microseconds())/1000, "p99-ms")
}

// BenchmarkPostgresWriteBatch is the store alone: one 1000-event batch per
// op through COPY and INSERT … ON CONFLICT (rows/s is its ceiling).
func BenchmarkPostgresWriteBatch(b *testing.B) {
	ctx := context.Background()
	store := openPostgres(b, postgresURL())
	if err := store.Prepare(ctx, time.Now()); err != nil {
		b.Fatal(err)
	}
	batch := make([]audit.Event, 1000)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range batch {
			batch[j] = benchEvent(j)
			batch[j].ID = fmt.Sprintf("w%06d-%04d", i, j)
			batch[j].Time = time.Now()
		}
		if _, err := store.Write(ctx, batch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(batch))/b.Elapsed().Seconds(), "rows/s")
}
