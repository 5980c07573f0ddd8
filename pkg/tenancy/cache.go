package tenancy

import (
	"context"
	"errors"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
)

// cache keeps store lookups in memory, including "not found" answers, so
// that repeated connection attempts cost no database round trip. Change
// notifications drop entries; maxAge bounds how long an entry lives if a
// notification is lost anyway. Concurrent misses for one key share a single
// load (a reconnect storm of one tenant's devices makes one query).
type cache[V any] struct {
	maxAge     time.Duration
	maxEntries int
	now        func() time.Time

	mu  sync.Mutex
	gen uint64 // bumped by every drop; a load that raced a drop is not stored
	m   map[string]cacheEntry[V]
	sf  singleflight.Group
}

type cacheEntry[V any] struct {
	v     V
	found bool
	at    time.Time
}

// loadTimeout bounds a shared load: it runs detached from the caller that
// started it, so that one caller giving up does not fail the others.
const loadTimeout = 10 * time.Second

func newCache[V any](maxAge time.Duration, maxEntries int, now func() time.Time) *cache[V] {
	return &cache[V]{maxAge: maxAge, maxEntries: maxEntries, now: now, m: map[string]cacheEntry[V]{}}
}

// get returns the cached value for key or loads it. found is false when the
// loader answered ErrNotFound; err is any other load error (not cached).
func (c *cache[V]) get(ctx context.Context, key string, load func(context.Context, string) (V, error)) (v V, found bool, err error) {
	c.mu.Lock()
	e, ok := c.m[key]
	gen := c.gen
	c.mu.Unlock()
	if ok && c.now().Sub(e.at) < c.maxAge {
		return e.v, e.found, nil
	}
	ch := c.sf.DoChan(key, func() (any, error) {
		// A load that finished between our miss and this call has filled
		// the entry already.
		c.mu.Lock()
		cached, ok := c.m[key]
		c.mu.Unlock()
		if ok && c.now().Sub(cached.at) < c.maxAge {
			return cached, nil
		}
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), loadTimeout)
		defer cancel()
		v, err := load(lctx, key)
		found := err == nil
		if err != nil && !errors.Is(err, ErrNotFound) {
			return nil, err
		}
		e := cacheEntry[V]{v: v, found: found, at: c.now()}
		c.mu.Lock()
		if c.gen == gen {
			if len(c.m) >= c.maxEntries {
				// Crude but bounded: unknown ids sprayed by a client cannot
				// grow the map without limit.
				clear(c.m)
			}
			c.m[key] = e
		}
		c.mu.Unlock()
		return e, nil
	})
	select {
	case <-ctx.Done():
		return v, false, ctx.Err()
	case r := <-ch:
		if r.Err != nil {
			return v, false, r.Err
		}
		e := r.Val.(cacheEntry[V])
		return e.v, e.found, nil
	}
}

// drop removes key; the next get loads it again.
func (c *cache[V]) drop(key string) {
	c.mu.Lock()
	c.gen++
	delete(c.m, key)
	c.mu.Unlock()
	c.sf.Forget(key)
}

// dropWhere removes every entry for which match is true.
func (c *cache[V]) dropWhere(match func(key string, v V, found bool) bool) {
	c.mu.Lock()
	c.gen++
	var keys []string
	for k, e := range c.m {
		if match(k, e.v, e.found) {
			delete(c.m, k)
			keys = append(keys, k)
		}
	}
	c.mu.Unlock()
	for _, k := range keys {
		c.sf.Forget(k)
	}
}
