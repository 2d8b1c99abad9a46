// Package backoff is the edge's one rule for waiting after failures: a
// wait that starts at a base, doubles with each failure in a row up to a
// ceiling, and is spread at random so that edges which failed together do
// not try again together.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Spreads for Jitter. Retries after a failure are spread widely, because
// the failures of a fleet are correlated (one node restart fails every
// edge's write at once); steady polls only need to drift apart.
const (
	RetrySpread = 0.5
	PollSpread  = 0.1
)

// Doubling returns the wait after the nth failure in a row: base, doubled
// n-1 times, at most ceiling. n below 1 counts as 1.
func Doubling(base, ceiling time.Duration, n int) time.Duration {
	d := base
	for i := 1; i < n && d < ceiling; i++ {
		d *= 2
	}
	return min(d, ceiling)
}

// Jitter spreads d uniformly over [d-spread·d, d+spread·d].
func Jitter(d time.Duration, spread float64) time.Duration {
	j := time.Duration(float64(d) * spread)
	if j <= 0 {
		return d
	}
	return d - j + rand.N(2*j+1)
}

// Backoff is the wait state of one retry loop. Its zero value is not
// usable: set Base and Max.
type Backoff struct {
	Base, Max time.Duration
	// Spread is passed to Jitter; zero waits exactly.
	Spread float64

	failures int
}

// Failed counts a failure and returns how long to wait before trying again.
func (b *Backoff) Failed() time.Duration {
	b.failures++
	return Jitter(Doubling(b.Base, b.Max, b.failures), b.Spread)
}

// Succeeded starts over and returns how many failures in a row it ended,
// so that a loop can log its recovery once.
func (b *Backoff) Succeeded() int {
	n := b.failures
	b.failures = 0
	return n
}

// Failures returns the failures in a row so far.
func (b *Backoff) Failures() int { return b.failures }
