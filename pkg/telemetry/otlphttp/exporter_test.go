package otlphttp

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// collector is an httptest OTLP endpoint whose answers the test scripts.
type collector struct {
	*httptest.Server
	mu       sync.Mutex
	requests []*http.Request
	bodies   [][]byte
	// respond answers request number n (from 0); nil answers 200.
	respond func(n int, w http.ResponseWriter, r *http.Request)
	// arrived gets a value for every request, if not nil.
	arrived chan int
}

func newCollector(t *testing.T, respond func(n int, w http.ResponseWriter, r *http.Request)) *collector {
	t.Helper()
	c := &collector{respond: respond}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := readBody(r)
		if err != nil {
			t.Errorf("reading the request body: %v", err)
		}
		c.mu.Lock()
		n := len(c.requests)
		c.requests = append(c.requests, r)
		c.bodies = append(c.bodies, body)
		c.mu.Unlock()
		if c.arrived != nil {
			c.arrived <- n
		}
		if c.respond != nil {
			c.respond(n, w, r)
		}
	}))
	t.Cleanup(c.Close)
	return c
}

func (c *collector) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.requests)
}

func (c *collector) url() string { return c.URL + "/v1/traces" }

func newExporter(t *testing.T, opts Options) *Exporter {
	t.Helper()
	e, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Shutdown(context.Background()) })
	return e
}

func TestExportHeadersAndBody(t *testing.T) {
	spans := benchSpans(t, 20)
	for _, gz := range []bool{false, true} {
		name := "plain"
		if gz {
			name = "gzip"
		}
		t.Run(name, func(t *testing.T) {
			c := newCollector(t, nil)
			e := newExporter(t, Options{
				URL:     c.url(),
				Headers: map[string]string{"authorization": "Bearer s3cret", "X-Tenant": "t1", "Content-Type": "text/plain"},
				Gzip:    gz,
			})
			if err := e.ExportSpans(context.Background(), spans); err != nil {
				t.Fatal(err)
			}
			if c.count() != 1 {
				t.Fatalf("%d requests, want 1", c.count())
			}
			r := c.requests[0]
			if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
				t.Fatalf("%s %s", r.Method, r.URL.Path)
			}
			for k, want := range map[string]string{
				"Content-Type":  "application/x-protobuf",
				"Authorization": "Bearer s3cret",
				"X-Tenant":      "t1",
			} {
				if got := r.Header.Get(k); got != want {
					t.Errorf("%s: %q, want %q", k, got, want)
				}
			}
			if ua := r.Header.Get("User-Agent"); !strings.Contains(ua, "xiaoclaw") || !strings.Contains(ua, "otlp") {
				t.Errorf("User-Agent %q", ua)
			}
			if got, want := r.Header.Get("Content-Encoding") == "gzip", gz; got != want {
				t.Errorf("gzip encoding %v, want %v", got, want)
			}
			want := AppendExportRequest(nil, spans)
			if !bytes.Equal(c.bodies[0], want) {
				t.Fatal("the body is not the encoded request")
			}
			requireSameRequest(t, unmarshalRequest(t, officialBody(t, spans)), unmarshalRequest(t, c.bodies[0]))
		})
	}
}

func TestExportNothing(t *testing.T) {
	c := newCollector(t, nil)
	e := newExporter(t, Options{URL: c.url()})
	for _, spans := range [][]sdktrace.ReadOnlySpan{nil, {}, {nil, nil}} {
		if err := e.ExportSpans(context.Background(), spans); err != nil {
			t.Fatal(err)
		}
	}
	if c.count() != 0 {
		t.Fatalf("%d requests for no spans", c.count())
	}
}

func TestRetryableStatuses(t *testing.T) {
	spans := benchSpans(t, 3)
	for _, code := range []int{http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			c := newCollector(t, func(n int, w http.ResponseWriter, r *http.Request) {
				if n == 0 {
					w.Header().Set("Retry-After", "0")
					w.WriteHeader(code)
				}
			})
			e := newExporter(t, Options{URL: c.url()})
			if err := e.ExportSpans(context.Background(), spans); err != nil {
				t.Fatal(err)
			}
			if c.count() != 2 {
				t.Fatalf("%d requests, want 2", c.count())
			}
			if !bytes.Equal(c.bodies[0], c.bodies[1]) {
				t.Fatal("the retry sent another body")
			}
		})
	}
}

func TestPermanentStatus(t *testing.T) {
	c := newCollector(t, func(n int, w http.ResponseWriter, r *http.Request) {
		http.Error(w, "  bad things\x00 happened "+strings.Repeat("!", 1000), http.StatusBadRequest)
	})
	e := newExporter(t, Options{URL: c.url(), Headers: map[string]string{"Authorization": "Bearer s3cret"}})
	err := e.ExportSpans(context.Background(), benchSpans(t, 2))
	if err == nil {
		t.Fatal("no error")
	}
	if c.count() != 1 {
		t.Fatalf("%d requests, want 1", c.count())
	}
	var se *StatusError
	if !errors.As(err, &se) || se.StatusCode != http.StatusBadRequest {
		t.Fatalf("error %v, want a StatusError for 400", err)
	}
	msg := err.Error()
	for _, want := range []string{"400", "bad things", c.url()} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not name %q", msg, want)
		}
	}
	if strings.Contains(msg, "s3cret") {
		t.Errorf("error %q holds a header value", msg)
	}
	if len(se.Body) > maxErrorExcerptSize {
		t.Errorf("body excerpt of %d bytes", len(se.Body))
	}
}

func TestPartialSuccess(t *testing.T) {
	spans := benchSpans(t, 5)
	reply := func(ps *coltracepb.ExportTracePartialSuccess, contentType string) func(int, http.ResponseWriter, *http.Request) {
		return func(_ int, w http.ResponseWriter, _ *http.Request) {
			b, err := proto.Marshal(&coltracepb.ExportTraceServiceResponse{PartialSuccess: ps})
			if err != nil {
				t.Error(err)
			}
			w.Header().Set("Content-Type", contentType)
			_, _ = w.Write(b)
		}
	}
	t.Run("rejected", func(t *testing.T) {
		c := newCollector(t, reply(&coltracepb.ExportTracePartialSuccess{RejectedSpans: 2, ErrorMessage: "spans too old"}, "application/x-protobuf"))
		err := newExporter(t, Options{URL: c.url()}).ExportSpans(context.Background(), spans)
		var pe *PartialSuccessError
		if !errors.As(err, &pe) || pe.Rejected != 2 || pe.Sent != 5 || pe.Message != "spans too old" {
			t.Fatalf("error %v, want a PartialSuccessError for 2 of 5", err)
		}
		if msg := err.Error(); !strings.Contains(msg, "2 of 5") || !strings.Contains(msg, "spans too old") {
			t.Fatalf("error %q", msg)
		}
		if c.count() != 1 {
			t.Fatalf("%d requests, want 1", c.count())
		}
	})
	t.Run("warning", func(t *testing.T) {
		c := newCollector(t, reply(&coltracepb.ExportTracePartialSuccess{ErrorMessage: "deprecated attribute"}, "application/x-protobuf"))
		err := newExporter(t, Options{URL: c.url()}).ExportSpans(context.Background(), spans)
		var pe *PartialSuccessError
		if !errors.As(err, &pe) || pe.Rejected != 0 || pe.Message != "deprecated attribute" {
			t.Fatalf("error %v, want a PartialSuccessError with the warning", err)
		}
	})
	t.Run("empty", func(t *testing.T) {
		c := newCollector(t, reply(&coltracepb.ExportTracePartialSuccess{}, "application/x-protobuf"))
		if err := newExporter(t, Options{URL: c.url()}).ExportSpans(context.Background(), spans); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("not protobuf", func(t *testing.T) {
		c := newCollector(t, reply(&coltracepb.ExportTracePartialSuccess{RejectedSpans: 2}, "application/json"))
		if err := newExporter(t, Options{URL: c.url()}).ExportSpans(context.Background(), spans); err != nil {
			t.Fatal(err)
		}
	})
}

// TestContextEndsRetrying: a collector that keeps answering 503 is retried
// until the context ends, and no longer.
func TestContextEndsRetrying(t *testing.T) {
	spans := benchSpans(t, 2)
	t.Run("deadline", func(t *testing.T) {
		c := newCollector(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusServiceUnavailable)
		})
		e := newExporter(t, Options{URL: c.url()})
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		err := e.ExportSpans(ctx, spans)
		var se *StatusError
		if !errors.As(err, &se) || se.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("error %v, want the 503", err)
		}
		if dl, _ := ctx.Deadline(); time.Now().Before(dl) {
			t.Fatal("returned before the deadline")
		}
		n := c.count()
		if n < 2 {
			t.Fatalf("%d requests: not retried", n)
		}
		if c.count() != n {
			t.Fatal("requests after ExportSpans returned")
		}
	})
	t.Run("cancel while waiting", func(t *testing.T) {
		c := newCollector(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(http.StatusTooManyRequests)
		})
		c.arrived = make(chan int, 10)
		e := newExporter(t, Options{URL: c.url()})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- e.ExportSpans(ctx, spans) }()
		<-c.arrived
		cancel()
		err := <-done
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("error %v, want one wrapping context.Canceled", err)
		}
		if c.count() != 1 {
			t.Fatalf("%d requests, want 1", c.count())
		}
	})
	t.Run("wait past deadline", func(t *testing.T) {
		c := newCollector(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(http.StatusServiceUnavailable)
		})
		e := newExporter(t, Options{URL: c.url()})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := e.ExportSpans(ctx, spans)
		if err == nil || !strings.Contains(err.Error(), "deadline") {
			t.Fatalf("error %v, want one saying the retry would pass the deadline", err)
		}
		if ctx.Err() != nil {
			t.Fatal("waited for the deadline instead of giving up")
		}
		if c.count() != 1 {
			t.Fatalf("%d requests, want 1", c.count())
		}
	})
}

// TestRequestTimeout: Options.Timeout bounds one request; the next attempt
// gets a fresh one.
func TestRequestTimeout(t *testing.T) {
	c := newCollector(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n == 0 {
			<-r.Context().Done() // hang until the client gives up
		}
	})
	e := newExporter(t, Options{URL: c.url(), Timeout: 100 * time.Millisecond})
	if err := e.ExportSpans(context.Background(), benchSpans(t, 2)); err != nil {
		t.Fatal(err)
	}
	if c.count() != 2 {
		t.Fatalf("%d requests, want 2", c.count())
	}
}

func TestShutdown(t *testing.T) {
	spans := benchSpans(t, 2)
	t.Run("later exports fail", func(t *testing.T) {
		c := newCollector(t, nil)
		e := newExporter(t, Options{URL: c.url()})
		if err := e.ExportSpans(context.Background(), spans); err != nil {
			t.Fatal(err)
		}
		if err := e.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if err := e.ExportSpans(context.Background(), spans); !errors.Is(err, ErrShutdown) {
			t.Fatalf("error %v, want ErrShutdown", err)
		}
		if err := e.Shutdown(context.Background()); err != nil {
			t.Fatalf("second Shutdown: %v", err)
		}
		if c.count() != 1 {
			t.Fatalf("%d requests, want 1", c.count())
		}
	})
	t.Run("interrupts an export", func(t *testing.T) {
		c := newCollector(t, func(_ int, w http.ResponseWriter, r *http.Request) {
			<-r.Context().Done()
		})
		c.arrived = make(chan int, 10)
		e := newExporter(t, Options{URL: c.url()})
		done := make(chan error, 1)
		go func() { done <- e.ExportSpans(context.Background(), spans) }()
		<-c.arrived
		if err := e.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if !errors.Is(err, ErrShutdown) {
				t.Fatalf("error %v, want one wrapping ErrShutdown", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the export is still running after Shutdown")
		}
	})
}

func TestUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	e := newExporter(t, Options{URL: "http://user:pw@" + addr + "/v1/traces?token=t0ken"})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = e.ExportSpans(ctx, benchSpans(t, 1))
	if err == nil {
		t.Fatal("no error")
	}
	if msg := err.Error(); !strings.Contains(msg, addr) || strings.Contains(msg, "pw") || strings.Contains(msg, "t0ken") {
		t.Fatalf("error %q: want the address without credentials or query", msg)
	}
}

// TestConcurrentExports: exports from several goroutines share the buffer
// pool; each request must carry its own spans.
func TestConcurrentExports(t *testing.T) {
	c := newCollector(t, nil)
	e := newExporter(t, Options{URL: c.url(), Gzip: true})
	all := benchSpans(t, 64)
	var wg sync.WaitGroup
	var failed atomic.Bool
	for g := range 8 {
		wg.Go(func() {
			for i := range 10 {
				n := 1 + (g*10+i)%len(all)
				if err := e.ExportSpans(context.Background(), all[:n]); err != nil {
					t.Error(err)
					failed.Store(true)
					return
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.bodies) != 80 {
		t.Fatalf("%d requests, want 80", len(c.bodies))
	}
	for _, b := range c.bodies {
		req := unmarshalRequest(t, b)
		n := len(req.ResourceSpans[0].ScopeSpans[0].Spans)
		if !bytes.Equal(b, AppendExportRequest(nil, all[:n])) {
			t.Fatalf("a request of %d spans does not hold the first %d spans", n, n)
		}
	}
}

func TestNewValidates(t *testing.T) {
	for _, o := range []Options{
		{URL: ""},
		{URL: "collector:4318/v1/traces"},
		{URL: "ftp://collector/v1/traces"},
		{URL: "http:///v1/traces"},
		{URL: "http://user:s3cret@collector:bad/v1/traces"},
		{URL: "http://collector:4318/v1/traces", Timeout: -time.Second},
		{URL: "http://collector:4318/v1/traces", Headers: map[string]string{"Bad Name": "x"}},
		{URL: "http://collector:4318/v1/traces", Headers: map[string]string{"Authorization": "s3cret\r\nX: y"}},
	} {
		e, err := New(o)
		if err == nil {
			_ = e.Shutdown(context.Background())
			t.Errorf("New(%+v) succeeded", o)
			continue
		}
		if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("error %q holds a secret", err)
		}
	}
	e, err := New(Options{URL: "https://collector.example:4318/v1/traces"})
	if err != nil {
		t.Fatal(err)
	}
	if e.timeout != DefaultTimeout {
		t.Errorf("timeout %v, want %v", e.timeout, DefaultTimeout)
	}
	_ = e.Shutdown(context.Background())
}

func TestBackoff(t *testing.T) {
	for attempt := 1; attempt <= 70; attempt++ {
		d := retryMax
		if attempt <= 5 {
			d = retryInitial << (attempt - 1)
		}
		for range 100 {
			if got := backoff(attempt); got < d/2 || got > d {
				t.Fatalf("attempt %d: %v outside [%v, %v]", attempt, got, d/2, d)
			}
		}
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, c := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{" 7 ", 7 * time.Second, true},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
		{"99999999999", 0, false},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
	} {
		h := http.Header{}
		if c.v != "" {
			h.Set("Retry-After", c.v)
		}
		got, ok := retryAfter(h, now)
		if got != c.want || ok != c.ok {
			t.Errorf("Retry-After %q: %v %v, want %v %v", c.v, got, ok, c.want, c.ok)
		}
	}
}
