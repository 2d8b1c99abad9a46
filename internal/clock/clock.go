// Package clock is the time the edge reads and waits on. Code that waits
// (retry loops, back-offs, queues that sleep until their next turn) takes a
// Clock, so that its tests move time with a Fake instead of waiting for it.
package clock

import "time"

// Clock is what a component needs of time: the present, and a way to wait.
type Clock interface {
	Now() time.Time
	// After returns a channel that receives the time once d has passed.
	After(d time.Duration) <-chan time.Time
	// NewTimer is time.NewTimer.
	NewTimer(d time.Duration) Timer
}

// Timer is the part of *time.Timer the edge uses. As with time.Timer since
// Go 1.23, no stale value is received after Stop or Reset returns.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// Real is the wall clock.
var Real Clock = realClock{}

// OrReal returns c, or the wall clock if c is nil, for Options fields whose
// zero value means the wall clock.
func OrReal(c Clock) Clock {
	if c == nil {
		return Real
	}
	return c
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
func (realClock) NewTimer(d time.Duration) Timer         { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }
