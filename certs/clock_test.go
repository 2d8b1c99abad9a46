package certs

import (
	"sync"
	"testing"
	"time"
)

// fakeClock is a clock that moves only when a test advances it. Every
// After registers a waiter and signals waited, so a test can advance the
// clock exactly when something waits on it rather than guessing when.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []fakeWaiter
	waited  chan struct{} // a value after each After; buffered 1
}

type fakeWaiter struct {
	at time.Time
	c  chan time.Time
}

var _ clock = (*fakeClock)(nil)

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), waited: make(chan struct{}, 1)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	c.mu.Lock()
	if d <= 0 {
		ch <- c.now
	} else {
		c.waiters = append(c.waiters, fakeWaiter{at: c.now.Add(d), c: ch})
	}
	c.mu.Unlock()
	select {
	case c.waited <- struct{}{}:
	default:
	}
	return ch
}

// Advance moves the clock on by d and fires every waiter now due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if w.at.After(c.now) {
			kept = append(kept, w)
			continue
		}
		w.c <- c.now
	}
	clear(c.waiters[len(kept):])
	c.waiters = kept
}

// advanceWhileWaiting advances c by step each time something waits on it,
// until done yields (returned is true, err what it yielded) or c has moved by
// limit. It returns how far c moved. A minute of real time without either
// fails t: something blocks on a real wait.
func advanceWhileWaiting(t *testing.T, c *fakeClock, step, limit time.Duration, done <-chan error) (moved time.Duration, returned bool, err error) {
	t.Helper()
	start := c.Now()
	stuck := time.After(time.Minute)
	for c.Now().Sub(start) < limit {
		select {
		case err := <-done:
			return c.Now().Sub(start), true, err
		case <-c.waited:
			c.Advance(step)
		case <-stuck:
			t.Fatalf("nothing waited on the clock for a minute (it moved %v)", c.Now().Sub(start))
		}
	}
	return c.Now().Sub(start), false, nil
}

func TestFakeClock(t *testing.T) {
	c := newFakeClock()
	early, late := c.After(time.Second), c.After(time.Minute)
	c.Advance(2 * time.Second)
	select {
	case <-early:
	default:
		t.Fatal("a waiter due before the advance did not fire")
	}
	select {
	case <-late:
		t.Fatal("a waiter due after the advance fired")
	default:
	}
}
