package clock

import (
	"slices"
	"sync"
	"time"
)

// Fake is a Clock that moves only when a test moves it, after Tailscale's
// tstest.Clock. Every wait registers with it and is signalled on Waited, so
// a test advances the clock exactly when the code under test waits on it,
// rather than guessing when with real sleeps.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer // armed, in no order
	waited chan struct{}
}

// NewFake returns a Fake reading start.
func NewFake(start time.Time) *Fake {
	return &Fake{now: start, waited: make(chan struct{}, 1)}
}

// Now returns the fake present.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// After returns a channel that receives the fake time once the clock has
// been advanced by d.
func (f *Fake) After(d time.Duration) <-chan time.Time {
	return f.NewTimer(d).C()
}

// NewTimer returns a timer that fires when the clock has been advanced by d.
func (f *Fake) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{f: f, c: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

// Advance moves the clock on by d and fires every timer now due, earliest
// first, each with its own deadline as the time it receives.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	var due []*fakeTimer
	kept := f.timers[:0]
	for _, t := range f.timers {
		if t.at.After(f.now) {
			kept = append(kept, t)
		} else {
			due = append(due, t)
		}
	}
	clear(f.timers[len(kept):])
	f.timers = kept
	slices.SortStableFunc(due, func(a, b *fakeTimer) int { return a.at.Compare(b.at) })
	for _, t := range due {
		t.armed = false
		select {
		case t.c <- t.at:
		default: // an unread value is already there; time.Timer drops too
		}
	}
}

// Waiting returns how many timers are armed.
func (f *Fake) Waiting() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// Next returns how far the earliest armed timer is from now, and false if
// none is armed.
func (f *Fake) Next() (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.timers) == 0 {
		return 0, false
	}
	at := f.timers[0].at
	for _, t := range f.timers[1:] {
		if t.at.Before(at) {
			at = t.at
		}
	}
	return at.Sub(f.now), true
}

// Waited receives a value after a timer has been armed (coalesced: one
// value stands for every arming since the last receive).
func (f *Fake) Waited() <-chan struct{} { return f.waited }

type fakeTimer struct {
	f     *Fake
	c     chan time.Time
	at    time.Time // guarded by f.mu
	armed bool      // guarded by f.mu
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	return t.stopLocked()
}

// stopLocked disarms t and drops a value it fired but nobody read. As
// with time.Timer since Go 1.23, such a timer counts as not yet expired:
// Stop and Reset report true for it.
func (t *fakeTimer) stopLocked() bool {
	drained := false
	select {
	case <-t.c:
		drained = true
	default:
	}
	if !t.armed {
		return drained
	}
	t.armed = false
	for i, o := range t.f.timers {
		if o == t {
			t.f.timers = append(t.f.timers[:i], t.f.timers[i+1:]...)
			break
		}
	}
	return true
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	f := t.f
	f.mu.Lock()
	wasArmed := t.stopLocked()
	if d <= 0 {
		t.c <- f.now
	} else {
		t.at, t.armed = f.now.Add(d), true
		f.timers = append(f.timers, t)
	}
	f.mu.Unlock()
	select {
	case f.waited <- struct{}{}:
	default:
	}
	return wasArmed
}
