package certs

import "time"

// clock is where the storages read the time and wait for it: lock expiry,
// the pause after a node failure, the waits between retries and between
// tries of a held lock. Production uses realClock; tests set a fake one
// (FleetOptions.clock, BoltStorage.clock) and move it on instead of
// waiting real time.
type clock interface {
	Now() time.Time
	// After returns a channel that receives the time once d has passed.
	After(d time.Duration) <-chan time.Time
}

// realClock is the wall clock.
type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
