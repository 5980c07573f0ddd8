package authguard

import (
	"net/http"
	"sync"
	"testing"
	"time"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type reports struct {
	mu  sync.Mutex
	got []string
	cnt []int
}

func (r *reports) add(d string, n int) {
	r.mu.Lock()
	r.got, r.cnt = append(r.got, d), append(r.cnt, n)
	r.mu.Unlock()
}

func newGuard(t *testing.T, cfg Config) (*Guard[string], *clock, *reports) {
	t.Helper()
	c := &clock{t: time.Unix(1_700_000_000, 0)}
	cfg.Now = c.now
	r := &reports{}
	return New(cfg, r.add), c, r
}

func TestBurstThenThrottledUntilRefill(t *testing.T) {
	g, c, _ := newGuard(t, Config{Burst: 3, Every: 10 * time.Second})
	for i := range 3 {
		if d := g.RetryAfter("1.2.3.4"); d != 0 {
			t.Fatalf("failure %d: throttled for %v within the burst", i, d)
		}
		g.Failed("1.2.3.4", "bad token")
	}
	d := g.RetryAfter("1.2.3.4")
	if d <= 9*time.Second || d > 10*time.Second {
		t.Fatalf("after the burst: retry after %v, want about 10s", d)
	}
	if g.RetryAfter("5.6.7.8") != 0 {
		t.Fatal("another source is throttled")
	}
	// Refused attempts spend nothing: the budget refills while refused.
	for range 100 {
		g.Throttled("1.2.3.4", "throttled")
	}
	c.add(10 * time.Second)
	if d := g.RetryAfter("1.2.3.4"); d != 0 {
		t.Fatalf("after one refill period: still throttled for %v", d)
	}
	g.Failed("1.2.3.4", "bad token")
	if g.RetryAfter("1.2.3.4") == 0 {
		t.Fatal("a failure after the refill was not counted")
	}
}

func TestFailuresFoldIntoOneReportPerInterval(t *testing.T) {
	g, c, r := newGuard(t, Config{Burst: 5, SummaryInterval: time.Minute})
	for i := range 500 {
		g.Failed("1.2.3.4", "attempt "+string(rune('a'+i%26)))
	}
	g.Failed("9.9.9.9", "other")
	if len(r.got) != 2 || r.cnt[0] != 1 || r.cnt[1] != 1 {
		t.Fatalf("before the interval: reports %v %v, want the first failure of each source", r.got, r.cnt)
	}
	g.Sweep(false)
	if len(r.got) != 2 {
		t.Fatalf("summary before the interval passed: %v", r.got)
	}
	c.add(time.Minute)
	g.Sweep(false)
	if len(r.got) != 3 || r.cnt[2] != 499 || r.got[2] != "attempt "+string(rune('a'+499%26)) {
		t.Fatalf("summary: %v %v, want one report of 499 with the latest detail", r.got, r.cnt)
	}
	g.Sweep(false)
	g.Sweep(true)
	if len(r.got) != 3 {
		t.Fatalf("reported twice: %v", r.got)
	}
	// Pending failures are reported at the final sweep.
	g.Failed("1.2.3.4", "x")
	g.Failed("1.2.3.4", "y")
	g.Sweep(true)
	if len(r.got) != 4 || r.cnt[3] != 2 {
		t.Fatalf("final sweep: %v %v", r.got, r.cnt)
	}
}

func TestMemoryIsBounded(t *testing.T) {
	g, c, r := newGuard(t, Config{MaxKeys: 100})
	for i := range 1000 {
		g.Failed(string(rune(i+1000)), "x")
		g.Failed(string(rune(i+1000)), "y") // pending
	}
	if n := len(g.keys); n > 100 {
		t.Fatalf("%d keys remembered, want at most 100", n)
	}
	// Every failure is reported: evicted keys report what was pending.
	total := 0
	g.Sweep(true)
	for _, n := range r.cnt {
		total += n
	}
	if total != 2000 {
		t.Fatalf("%d failures reported, want 2000", total)
	}
	c.add(time.Hour)
	g.Sweep(false)
	if n := len(g.keys); n != 0 {
		t.Fatalf("%d idle keys kept after an hour", n)
	}
}

func TestSource(t *testing.T) {
	for in, want := range map[string]string{
		"1.2.3.4:5678":               "1.2.3.4",
		"1.2.3.4":                    "1.2.3.4",
		"[::ffff:1.2.3.4]:80":        "1.2.3.4",
		"[2001:db8:1:2:3:4:5:6]:443": "2001:db8:1:2::/64",
		"[2001:db8:1:2:ff::1]:443":   "2001:db8:1:2::/64",
		"not an address":             "not an address",
	} {
		if got := Source(in); got != want {
			t.Errorf("Source(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNilGuardAllowsEverything(t *testing.T) {
	var g *Guard[string]
	g.Failed("k", "x")
	if g.RetryAfter("k") != 0 {
		t.Fatal("nil guard throttles")
	}
	g.Sweep(true)
}

func TestClientAddrTrustsOnlyConfiguredProxies(t *testing.T) {
	trusted, err := ParsePrefixes("10.0.0.0/8, 192.0.2.1")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		peer, xff, want string
	}{
		{"203.0.113.5:4000", "", "203.0.113.5"},
		{"203.0.113.5:4000", "198.51.100.1", "203.0.113.5"},                  // untrusted peer: header ignored
		{"10.1.2.3:4000", "198.51.100.1", "198.51.100.1"},                    // through the ingress
		{"10.1.2.3:4000", "1.1.1.1, 198.51.100.1, 10.9.9.9", "198.51.100.1"}, // forged left part skipped
		{"192.0.2.1:80", "", "192.0.2.1"},
		{"10.1.2.3:4000", "junk, 198.51.100.1", "198.51.100.1"},
		{"10.1.2.3:4000", "198.51.100.1, junk", "10.1.2.3"},
	} {
		r, _ := http.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = c.peer
		if c.xff != "" {
			r.Header.Set("X-Forwarded-For", c.xff)
		}
		if got := ClientAddr(r, trusted); got != c.want {
			t.Errorf("peer %s XFF %q: %s, want %s", c.peer, c.xff, got, c.want)
		}
	}
	if _, err := ParsePrefixes("10.0.0.0/8,nonsense"); err == nil {
		t.Error("nonsense accepted")
	}
}
