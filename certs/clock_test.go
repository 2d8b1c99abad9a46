package certs

import (
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/clock"
)

// newFakeClock returns a clock that moves only when a test advances it.
func newFakeClock() *clock.Fake {
	return clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
}

// advanceWhileWaiting advances c by step each time something waits on it,
// until done yields (returned is true, err what it yielded) or c has moved by
// limit. It returns how far c moved. A minute of real time without either
// fails t: something blocks on a real wait.
func advanceWhileWaiting(t *testing.T, c *clock.Fake, step, limit time.Duration, done <-chan error) (moved time.Duration, returned bool, err error) {
	t.Helper()
	start := c.Now()
	stuck := time.After(time.Minute)
	for c.Now().Sub(start) < limit {
		select {
		case err := <-done:
			return c.Now().Sub(start), true, err
		case <-c.Waited():
			c.Advance(step)
		case <-stuck:
			t.Fatalf("nothing waited on the clock for a minute (it moved %v)", c.Now().Sub(start))
		}
	}
	return c.Now().Sub(start), false, nil
}
