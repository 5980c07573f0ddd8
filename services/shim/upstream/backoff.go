package upstream

import (
	"math/rand/v2"
	"time"
)

// backoff computes reconnect delays: min doubling per failed attempt up to
// max, each spread by ±20 % so that many links dropped together (a gateway
// restart) do not come back in lockstep, and clipped to [min, max].
type backoff struct {
	min, max time.Duration
	rand     func() float64 // [0,1); rand.Float64 unless a test fixes it
}

func (b backoff) delay(attempt int) time.Duration {
	d := b.min
	for i := 0; i < attempt && d < b.max; i++ {
		d *= 2
	}
	d = min(d, b.max)
	r := b.rand
	if r == nil {
		r = rand.Float64
	}
	d = time.Duration(float64(d) * (0.8 + 0.4*r()))
	return max(b.min, min(d, b.max))
}
