// Package authguard throttles failed authentication per key (a source
// address, a device id, a tenant) and folds repeated failures into one
// audit record per key and interval. Every door that checks a credential
// (the gateway's operator connect, the admin and audit APIs, the
// devicehub's WebSocket, MQTT and OTA endpoints) asks RetryAfter before it
// checks and calls Failed when the check fails.
//
// The budget of each key is a token bucket from golang.org/x/time/rate:
// Burst failures in a row, then one more every Every. Only failures spend
// it, so a client that authenticates is never slowed down.
package authguard

import (
	"context"
	"flag"
	"math"
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Defaults of Config.
const (
	DefaultBurst           = 10
	DefaultEvery           = 6 * time.Second // 10 failures a minute once the burst is spent
	DefaultSummaryInterval = time.Minute
	DefaultMaxKeys         = 65536
)

// Config of a Guard. Zero fields take the defaults.
type Config struct {
	// Burst is how many failures a key may have in a row before it is
	// throttled; default 10. Negative turns the throttle off (failures
	// are still folded into summaries).
	Burst int
	// Every is how often a throttled key earns one more attempt;
	// default 6 s.
	Every time.Duration
	// SummaryInterval: a key's first failure is reported at once; the
	// failures after it are counted and reported as one record, with
	// their count, once the interval since the last report has passed;
	// default 1 minute.
	SummaryInterval time.Duration
	// MaxKeys bounds the keys remembered; default 65536. When it is
	// reached, keys whose budget is full are forgotten first, then any
	// (their pending failures are reported first).
	MaxKeys int
	// Now is the clock; default time.Now.
	Now func() time.Time
}

func (c *Config) setDefaults() {
	if c.Burst == 0 {
		c.Burst = DefaultBurst
	}
	if c.Every <= 0 {
		c.Every = DefaultEvery
	}
	if c.SummaryInterval <= 0 {
		c.SummaryInterval = DefaultSummaryInterval
	}
	if c.MaxKeys <= 0 {
		c.MaxKeys = DefaultMaxKeys
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Guard throttles the failures of keys and reports them, each report
// carrying the detail of the latest failure it covers (T: what the caller
// audits) and how many failures it stands for. It is safe for concurrent
// use.
type Guard[T any] struct {
	cfg    Config
	report func(detail T, count int)
	mu     sync.Mutex
	keys   map[string]*entry[T]
	swept  time.Time // last Sweep; a failure sweeps when it is a quarter interval old
}

type entry[T any] struct {
	lim        *rate.Limiter
	reportedAt time.Time // last report; zero before the first
	pending    int       // failures since reportedAt, not yet reported
	last       T         // the latest of them
}

// New returns a guard; report, if not nil, receives the folded failures
// (it must not block: publish asynchronously).
func New[T any](cfg Config, report func(detail T, count int)) *Guard[T] {
	cfg.setDefaults()
	return &Guard[T]{cfg: cfg, report: report, keys: map[string]*entry[T]{}}
}

// RetryAfter returns how long key must wait before its next attempt is
// checked; 0 when it may try now.
func (g *Guard[T]) RetryAfter(key string) time.Duration {
	if g == nil || g.cfg.Burst < 0 {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	e := g.keys[key]
	if e == nil {
		return 0
	}
	tokens := e.lim.TokensAt(g.cfg.Now())
	if tokens >= 1 {
		return 0
	}
	wait := time.Duration(math.Ceil((1 - tokens) * float64(g.cfg.Every)))
	return max(wait, time.Millisecond)
}

// Failed records a failed attempt of key: it spends one of the key's
// budget and is reported, at once when it is the key's first failure since
// the last report an interval ago, else in the next summary.
func (g *Guard[T]) Failed(key string, detail T) { g.record(key, detail, true) }

// Throttled records an attempt refused because key was throttled: it is
// reported like a failure but spends nothing, so the key's budget refills
// while it is refused.
func (g *Guard[T]) Throttled(key string, detail T) { g.record(key, detail, false) }

func (g *Guard[T]) record(key string, detail T, spend bool) {
	if g == nil {
		return
	}
	now := g.cfg.Now()
	g.mu.Lock()
	e := g.keys[key]
	var evicted []report[T]
	if e == nil {
		evicted = g.makeRoom(now)
		e = &entry[T]{lim: rate.NewLimiter(rate.Every(g.cfg.Every), max(g.cfg.Burst, 1))}
		g.keys[key] = e
	}
	if spend {
		e.lim.AllowN(now, 1)
	}
	var now1 []report[T]
	if e.pending == 0 && (e.reportedAt.IsZero() || now.Sub(e.reportedAt) >= g.cfg.SummaryInterval) {
		e.reportedAt = now
		now1 = append(evicted, report[T]{detail, 1})
	} else {
		e.pending++
		e.last = detail
		now1 = evicted
	}
	due := now.Sub(g.swept) >= g.cfg.SummaryInterval/4
	g.mu.Unlock()
	g.emit(now1)
	if due {
		// Doors that run no Run loop still get their summaries, at the
		// latest with the next failure of any key.
		g.Sweep(false)
	}
}

type report[T any] struct {
	detail T
	count  int
}

func (g *Guard[T]) emit(rs []report[T]) {
	if g.report == nil {
		return
	}
	for _, r := range rs {
		g.report(r.detail, r.count)
	}
}

// makeRoom forgets keys when MaxKeys are remembered: idle ones first, then
// any; it returns the pending failures of the forgotten keys. g.mu is held.
func (g *Guard[T]) makeRoom(now time.Time) []report[T] {
	if len(g.keys) < g.cfg.MaxKeys {
		return nil
	}
	var out []report[T]
	for k, e := range g.keys {
		if g.idle(e, now) {
			delete(g.keys, k)
		}
	}
	for k, e := range g.keys {
		if len(g.keys) < g.cfg.MaxKeys {
			break
		}
		if e.pending > 0 {
			out = append(out, report[T]{e.last, e.pending})
		}
		delete(g.keys, k)
	}
	return out
}

// idle: nothing pending and the budget full again; forgetting the key
// changes nothing.
func (g *Guard[T]) idle(e *entry[T], now time.Time) bool {
	return e.pending == 0 && e.lim.TokensAt(now) >= float64(e.lim.Burst())
}

// Sweep reports the pending failures of every key whose interval has
// passed (of every key when final) and forgets idle keys.
func (g *Guard[T]) Sweep(final bool) {
	if g == nil {
		return
	}
	now := g.cfg.Now()
	var out []report[T]
	g.mu.Lock()
	g.swept = now
	for k, e := range g.keys {
		if e.pending > 0 && (final || now.Sub(e.reportedAt) >= g.cfg.SummaryInterval) {
			out = append(out, report[T]{e.last, e.pending})
			var zero T
			e.pending, e.last, e.reportedAt = 0, zero, now
		}
		if g.idle(e, now) && now.Sub(e.reportedAt) >= g.cfg.SummaryInterval {
			delete(g.keys, k)
		}
	}
	g.mu.Unlock()
	g.emit(out)
}

// Run sweeps four times per SummaryInterval until ctx is done, then
// reports what is still pending.
func (g *Guard[T]) Run(ctx context.Context) {
	if g == nil {
		return
	}
	t := time.NewTicker(max(g.cfg.SummaryInterval/4, time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			g.Sweep(true)
			return
		case <-t.C:
			g.Sweep(false)
		}
	}
}

// Source is the throttling key of a remote address ("host:port" or a bare
// host): the IP, or its /64 for IPv6, where one client holds a whole
// prefix.
func Source(remoteAddr string) string {
	host := remoteAddr
	if h, _, err := net.SplitHostPort(remoteAddr); err == nil {
		host = h
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.String()
	}
	return ip.String()
}

// RetryAfterSeconds is d in whole seconds, rounded up, for an HTTP
// Retry-After header.
func RetryAfterSeconds(d time.Duration) int {
	return int(math.Ceil(d.Seconds()))
}

// RegisterFlags adds --<prefix>-burst and --<prefix>-refill to fs for c's
// Burst and Every, with def's values (zero fields: the package defaults)
// as defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix, what string, def Config) {
	def.setDefaults()
	fs.IntVar(&c.Burst, prefix+"-burst", def.Burst, "failed "+what+" a source may have in a row before it is throttled (negative: no throttling)")
	fs.DurationVar(&c.Every, prefix+"-refill", def.Every, "a throttled source earns one more "+what+" attempt this often")
}
