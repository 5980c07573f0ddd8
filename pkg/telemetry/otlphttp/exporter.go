package otlphttp

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Retry and size limits of an Exporter.
const (
	// DefaultTimeout bounds one HTTP request when Options.Timeout is zero.
	DefaultTimeout = 10 * time.Second

	// Backoff between attempts after a retryable failure: the n-th wait is
	// drawn uniformly from [d/2, d] with d = retryInitial·2^(n-1), capped at
	// retryMax. A Retry-After header replaces the drawn wait. Retrying stops
	// when the export's context ends, when the next wait would pass its
	// deadline, or when the next attempt would start more than
	// retryMaxElapsed after the first.
	retryInitial    = 1 * time.Second
	retryMax        = 30 * time.Second
	retryMaxElapsed = 1 * time.Minute

	// maxResponseBody bounds what is read of a response body; more is not
	// read, and the connection is then not reused.
	maxResponseBody = 64 << 10

	// maxPooledBuffer is the largest request buffer kept for reuse.
	maxPooledBuffer = 8 << 20

	userAgent = "xiaoclaw-otlphttp-exporter/1 (OTLP/HTTP protobuf span exporter of xiaoclaw)"
)

// ErrShutdown is returned by ExportSpans once Shutdown has been called.
var ErrShutdown = errors.New("otlphttp: exporter is shut down")

// Options configure an Exporter.
type Options struct {
	// URL is the full endpoint, path included, e.g.
	// "http://collector:4318/v1/traces". Its scheme is http or https.
	URL string
	// Headers are sent with every request (e.g. an authorization header).
	// They cannot replace Content-Type or Content-Encoding; their values
	// never appear in errors.
	Headers map[string]string
	// Timeout bounds each HTTP request, retries being separate requests.
	// Zero means DefaultTimeout.
	Timeout time.Duration
	// Gzip compresses request bodies (at gzip.BestSpeed).
	Gzip bool
	// Client sends the requests. Nil means a client of the exporter's own,
	// with its own connection pool, whose idle connections Shutdown closes.
	Client *http.Client
}

// Exporter is an sdktrace.SpanExporter that sends spans to an OTLP/HTTP
// collector as protobuf. It is safe for concurrent use.
type Exporter struct {
	url     string
	safeURL string // the endpoint without user info or query, for errors
	header  http.Header
	timeout time.Duration
	gzip    bool
	client  *http.Client
	ownsTr  *http.Transport // non-nil when the exporter built the client

	mu       sync.RWMutex
	closed   bool
	inflight sync.WaitGroup
	stop     context.Context
	stopNow  context.CancelFunc

	// spare is the buffer of the last export, kept for the next: a batch
	// processor exports one batch at a time, so one buffer serves it with
	// no allocation. (A sync.Pool would lose it at every GC, and a busy
	// service collects several times a second.)
	spare atomic.Pointer[buffer]
}

var _ sdktrace.SpanExporter = (*Exporter)(nil)

// New validates opts and returns an Exporter.
func New(opts Options) (*Exporter, error) {
	u, err := url.Parse(opts.URL)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the URL, which may hold credentials
		}
		return nil, fmt.Errorf("otlphttp: invalid URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("otlphttp: URL scheme must be http or https, not %q", u.Scheme)
	}
	if u.Host == "" {
		return nil, errors.New("otlphttp: URL has no host")
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("otlphttp: negative timeout %v", opts.Timeout)
	}

	header := make(http.Header, len(opts.Headers)+3)
	header.Set("User-Agent", userAgent)
	for k, v := range opts.Headers {
		if !validHeaderName(k) {
			return nil, fmt.Errorf("otlphttp: invalid header name %q", k)
		}
		if !validHeaderValue(v) {
			return nil, fmt.Errorf("otlphttp: invalid value for header %q", k)
		}
		header.Set(k, v)
	}
	header.Set("Content-Type", "application/x-protobuf")
	header.Del("Content-Encoding")
	if opts.Gzip {
		header.Set("Content-Encoding", "gzip")
	}

	e := &Exporter{
		url:     u.String(),
		safeURL: (&url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}).String(),
		header:  header,
		timeout: opts.Timeout,
		gzip:    opts.Gzip,
		client:  opts.Client,
	}
	if e.timeout == 0 {
		e.timeout = DefaultTimeout
	}
	if e.client == nil {
		e.ownsTr = newTransport()
		e.client = &http.Client{Transport: e.ownsTr}
	}
	e.stop, e.stopNow = context.WithCancel(context.Background())
	return e, nil
}

// newTransport is the transport of an exporter's own client: one collector,
// a few connections kept open between exports.
func newTransport() *http.Transport {
	return &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		DialContext: (&net.Dialer{
			Timeout:   10 * time.Second,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		ForceAttemptHTTP2:      true,
		MaxIdleConns:           4,
		MaxIdleConnsPerHost:    4,
		IdleConnTimeout:        90 * time.Second,
		TLSHandshakeTimeout:    10 * time.Second,
		ExpectContinueTimeout:  1 * time.Second,
		MaxResponseHeaderBytes: 64 << 10,
	}
}

// ExportSpans encodes spans and POSTs them. Responses 429, 502, 503 and 504,
// network errors and requests that exceed Options.Timeout are retried (see
// retryInitial for the schedule) until ctx ends; other statuses and TLS
// certificate errors are not. With no (non-nil) spans it sends nothing. A
// collector that accepts the request but reports rejected spans yields a
// *PartialSuccessError, an unsuccessful status a *StatusError. Errors name
// the endpoint without its user info and query, and never a header value.
func (e *Exporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.mu.RLock()
	if e.closed {
		e.mu.RUnlock()
		return ErrShutdown
	}
	e.inflight.Add(1)
	e.mu.RUnlock()
	defer e.inflight.Done()

	sent := 0
	for _, s := range spans {
		if s != nil {
			sent++
		}
	}
	if sent == 0 {
		return nil
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(e.stop, func() { cancel(ErrShutdown) })()

	buf := e.spare.Swap(nil)
	if buf == nil {
		buf = new(buffer)
	}
	defer e.keep(buf)
	buf.raw = buf.enc.appendRequest(buf.raw[:0], spans)
	body := buf.raw
	if e.gzip {
		var err error
		if body, err = buf.compress(); err != nil {
			return fmt.Errorf("otlphttp: gzip: %w", err)
		}
	}
	return e.send(ctx, buf, body, sent)
}

// send POSTs body until it succeeds, fails for good or retrying has to stop.
func (e *Exporter) send(ctx context.Context, buf *buffer, body []byte, sent int) error {
	first := time.Now()
	var previous error
	for attempt := 1; ; attempt++ {
		r := e.post(ctx, buf, body, sent)
		if !r.retry {
			if r.err != nil && previous != nil && ctx.Err() != nil {
				// Interrupted: say why the earlier attempts failed too.
				return fmt.Errorf("%w (previous attempt: %w)", r.err, previous)
			}
			return r.err
		}
		previous = r.err
		wait := backoff(attempt)
		if r.hasAfter {
			wait = r.after
		}
		if err := context.Cause(ctx); err != nil {
			return fmt.Errorf("%w (retrying stopped: %w)", r.err, err)
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return fmt.Errorf("%w (not retried: the next attempt in %v would be after the deadline)", r.err, wait.Round(time.Millisecond))
		}
		if time.Since(first)+wait > retryMaxElapsed {
			return fmt.Errorf("%w (gave up after %d attempts)", r.err, attempt)
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return fmt.Errorf("%w (retrying stopped: %w)", r.err, context.Cause(ctx))
			case <-t.C:
			}
		}
	}
}

// backoff returns the wait before attempt+1, see retryInitial.
func backoff(attempt int) time.Duration {
	d := retryMax
	if attempt <= 10 {
		d = min(retryInitial<<(attempt-1), retryMax)
	}
	return d/2 + rand.N(d/2+1)
}

type result struct {
	err      error
	retry    bool
	after    time.Duration // from Retry-After, when hasAfter
	hasAfter bool
}

// post makes one attempt.
func (e *Exporter) post(ctx context.Context, buf *buffer, body []byte, sent int) result {
	actx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(actx, http.MethodPost, e.url, nil)
	if err != nil {
		return result{err: fmt.Errorf("otlphttp: cannot build a request for %s", e.safeURL)}
	}
	req.Header = e.header.Clone()
	req.ContentLength = int64(len(body))
	req.Body = buf.reader(body)
	req.GetBody = func() (io.ReadCloser, error) { return buf.reader(body), nil }

	resp, err := e.client.Do(req)
	if err != nil {
		if cause := context.Cause(ctx); cause != nil {
			return result{err: fmt.Errorf("otlphttp: POST %s: %w", e.safeURL, cause)}
		}
		if actx.Err() != nil {
			return result{err: fmt.Errorf("otlphttp: POST %s: no response within %v: %w", e.safeURL, e.timeout, context.DeadlineExceeded), retry: true}
		}
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the URL, query included
		}
		return result{err: fmt.Errorf("otlphttp: POST %s: %w", e.safeURL, err), retry: !permanent(err)}
	}
	defer resp.Body.Close()

	data, readErr := buf.readBody(resp.Body)
	switch code := resp.StatusCode; {
	case code >= 200 && code <= 299:
		// The spans were accepted. A body that cannot be read or parsed
		// does not change that; only a readable partial_success is
		// reported.
		if readErr != nil || len(data) == 0 || !isProtobuf(resp.Header.Get("Content-Type")) {
			return result{}
		}
		rejected, msg, err := parsePartialSuccess(data)
		if err != nil || (rejected == 0 && msg == "") {
			return result{}
		}
		return result{err: &PartialSuccessError{Rejected: rejected, Sent: sent, Message: excerpt([]byte(msg))}}
	default:
		r := result{err: &StatusError{URL: e.safeURL, StatusCode: code, Status: resp.Status, Body: excerpt(data)}}
		if retryable(code) {
			r.retry = true
			r.after, r.hasAfter = retryAfter(resp.Header, time.Now())
		}
		return r
	}
}

// permanent reports transport errors that retrying cannot fix.
func permanent(err error) bool {
	var (
		cv *tls.CertificateVerificationError
		ua x509.UnknownAuthorityError
		hn x509.HostnameError
		ci x509.CertificateInvalidError
	)
	return errors.As(err, &cv) || errors.As(err, &ua) || errors.As(err, &hn) || errors.As(err, &ci)
}

// Shutdown makes later exports fail with ErrShutdown, interrupts exports in
// progress and waits for them to return (or ctx to end), and closes the idle
// connections of the exporter's own client. It can be called more than once.
func (e *Exporter) Shutdown(ctx context.Context) error {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	e.stopNow()

	done := make(chan struct{})
	go func() {
		e.inflight.Wait()
		close(done)
	}()
	var err error
	select {
	case <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if e.ownsTr != nil {
		e.ownsTr.CloseIdleConnections()
	}
	return err
}

// buffer is the reusable memory of one export: the encoder's scratch space,
// the encoded request, its gzip form and the response body.
type buffer struct {
	enc  encoder
	raw  []byte
	zbuf bytes.Buffer
	zw   *gzip.Writer // writes into zbuf; kept with it
	resp bytes.Buffer
	// open counts request body readers the transport has not closed yet.
	// The transport may read a body after Do returned (net/http allows
	// closing it from another goroutine later), so a buffer with open
	// readers is not reused.
	open atomic.Int32
}

// keep makes b the spare buffer unless the transport may still read it or
// it grew past maxPooledBuffer.
func (e *Exporter) keep(b *buffer) {
	if b.open.Load() != 0 || cap(b.raw) > maxPooledBuffer || b.zbuf.Cap() > maxPooledBuffer {
		return
	}
	b.resp.Reset()
	e.spare.Store(b)
}

// compress gzips b.raw into b.zbuf and returns its bytes.
func (b *buffer) compress() ([]byte, error) {
	b.zbuf.Reset()
	if b.zw == nil {
		var err error
		if b.zw, err = gzip.NewWriterLevel(&b.zbuf, gzip.BestSpeed); err != nil {
			return nil, err
		}
	} else {
		b.zw.Reset(&b.zbuf)
	}
	_, err := b.zw.Write(b.raw)
	if cerr := b.zw.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	return b.zbuf.Bytes(), nil
}

// readBody reads at most maxResponseBody bytes of a response body into
// b.resp; the bytes are valid until the buffer is reused.
func (b *buffer) readBody(r io.Reader) ([]byte, error) {
	b.resp.Reset()
	_, err := b.resp.ReadFrom(io.LimitReader(r, maxResponseBody))
	return b.resp.Bytes(), err
}

// reader returns a request body reading p, counted in b.open until closed.
func (b *buffer) reader(p []byte) io.ReadCloser {
	b.open.Add(1)
	return &bodyReader{Reader: bytes.NewReader(p), buf: b}
}

type bodyReader struct {
	*bytes.Reader
	buf    *buffer
	closed atomic.Bool
}

func (r *bodyReader) Close() error {
	if r.closed.CompareAndSwap(false, true) {
		r.buf.open.Add(-1)
	}
	return nil
}

// validHeaderName reports whether s is an HTTP token (RFC 9110, 5.6.2).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c < 0x80 && c > ' ' && c != 0x7f && !isSeparator(c):
		default:
			return false
		}
	}
	return true
}

func isSeparator(c byte) bool {
	switch c {
	case '(', ')', '<', '>', '@', ',', ';', ':', '\\', '"', '/', '[', ']', '?', '=', '{', '}':
		return true
	}
	return false
}

// validHeaderValue rejects control characters other than tab, as net/http
// does when sending.
func validHeaderValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
