package clock

import (
	"testing"
	"time"
)

var start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func fired(c <-chan time.Time) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func TestFakeFiresTimersWhenAdvancedPastThem(t *testing.T) {
	f := NewFake(start)
	short, long := f.NewTimer(time.Second), f.After(time.Minute)
	if n := f.Waiting(); n != 2 {
		t.Fatalf("Waiting = %d, want 2", n)
	}
	if d, ok := f.Next(); !ok || d != time.Second {
		t.Fatalf("Next = %v, %v; want 1s, true", d, ok)
	}
	f.Advance(999 * time.Millisecond)
	if fired(short.C()) || fired(long) {
		t.Fatal("a timer fired before its time")
	}
	f.Advance(time.Millisecond)
	select {
	case at := <-short.C():
		if !at.Equal(start.Add(time.Second)) {
			t.Errorf("fired with %v, want its deadline %v", at, start.Add(time.Second))
		}
	default:
		t.Fatal("the 1s timer did not fire at 1s")
	}
	if fired(long) {
		t.Fatal("the 1m timer fired at 1s")
	}
	f.Advance(time.Hour)
	select {
	case at := <-long:
		if !at.Equal(start.Add(time.Minute)) {
			t.Errorf("fired with %v, want its deadline %v, not the time advanced to", at, start.Add(time.Minute))
		}
	default:
		t.Fatal("the 1m timer did not fire after an hour")
	}
	if n := f.Waiting(); n != 0 {
		t.Errorf("Waiting = %d after every timer fired, want 0", n)
	}
	if got := f.Now(); !got.Equal(start.Add(time.Second + time.Hour)) {
		t.Errorf("Now = %v", got)
	}
}

func TestFakeTimerStopAndResetLeaveNoStaleValue(t *testing.T) {
	f := NewFake(start)
	tm := f.NewTimer(time.Second)
	if !tm.Stop() {
		t.Error("Stop of an armed timer returned false")
	}
	f.Advance(time.Hour)
	if fired(tm.C()) {
		t.Fatal("a stopped timer fired")
	}
	if tm.Stop() {
		t.Error("Stop of a stopped timer returned true")
	}

	// Fired but not read, then reset: the old value must not be received,
	// and Reset reports the timer active, as time.Timer does since Go 1.23.
	tm.Reset(time.Second)
	f.Advance(time.Second)
	if !tm.Reset(time.Minute) {
		t.Error("Reset of a fired, unread timer returned false")
	}
	if fired(tm.C()) {
		t.Fatal("a value from before Reset was received")
	}
	f.Advance(time.Minute)
	if !fired(tm.C()) {
		t.Fatal("the reset timer did not fire")
	}

	tm.Reset(0)
	if !fired(tm.C()) {
		t.Fatal("Reset(0) did not fire at once")
	}
}

func TestFakeSignalsEachWait(t *testing.T) {
	f := NewFake(start)
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-f.After(time.Hour)
	}()
	select {
	case <-f.Waited():
	case <-time.After(10 * time.Second):
		t.Fatal("no wait was signalled")
	}
	f.Advance(time.Hour)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter was not woken by Advance")
	}
}

func TestRealClockWaits(t *testing.T) {
	c := OrReal(nil)
	before := c.Now()
	<-c.After(time.Millisecond)
	tm := c.NewTimer(time.Millisecond)
	<-tm.C()
	if c.Now().Sub(before) < 2*time.Millisecond {
		t.Error("the real clock's waits returned early")
	}
}

// TestFakeMatchesTimeTimerOnAFiredUnreadTimer: since Go 1.23 a timer's
// channel is unbuffered, so a timer whose value nobody received has not
// expired, and Stop reports true (time.Timer.Stop's documentation). The
// idiom `if !t.Stop() { <-t.C() }` must then not block on either clock.
func TestFakeMatchesTimeTimerOnAFiredUnreadTimer(t *testing.T) {
	f := NewFake(start)
	fake := f.NewTimer(time.Millisecond)
	f.Advance(time.Millisecond)
	if !fake.Stop() {
		t.Error("Stop of a fired, unread timer = false, want true as time.Timer")
	}
	if fired(fake.C()) {
		t.Error("a value was received after Stop")
	}
}
