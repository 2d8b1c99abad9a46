// Package promreg holds the module's one policy for registering Prometheus
// collectors: a constructor registers its collectors all or none and
// returns the error, never panics and never reuses another's collector, so
// that its caller decides and a second instance on one registry is a
// reported mistake rather than silently shared counters.
package promreg

import "github.com/prometheus/client_golang/prometheus"

// Register registers every collector of cs with reg, or none: on the first
// failure it unregisters those it had registered and returns that error,
// which a caller wraps with what it was registering. A nil reg registers
// nothing.
func Register(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	if reg == nil {
		return nil
	}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return err
		}
	}
	return nil
}

// Batch is a Registerer that remembers what it registered, for a
// constructor that registers several parts' collectors and may still fail
// after some of them: Undo then unregisters them all, and the constructor
// keeps the all-or-none promise. It is not safe for concurrent use.
type Batch struct {
	reg  prometheus.Registerer
	done []prometheus.Collector
}

// NewBatch returns a Batch registering on reg, or nil when reg is nil: a
// nil Batch must not be handed on as a Registerer (it would not be a nil
// interface), so a caller keeps reg's nil-ness itself, and Undo on it does
// nothing.
func NewBatch(reg prometheus.Registerer) *Batch {
	if reg == nil {
		return nil
	}
	return &Batch{reg: reg}
}

// Register implements prometheus.Registerer.
func (b *Batch) Register(c prometheus.Collector) error {
	if err := b.reg.Register(c); err != nil {
		return err
	}
	b.done = append(b.done, c)
	return nil
}

// MustRegister implements prometheus.Registerer.
func (b *Batch) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := b.Register(c); err != nil {
			panic(err)
		}
	}
}

// Unregister implements prometheus.Registerer.
func (b *Batch) Unregister(c prometheus.Collector) bool {
	for i, d := range b.done {
		if d == c {
			b.done = append(b.done[:i], b.done[i+1:]...)
			break
		}
	}
	return b.reg.Unregister(c)
}

// Undo unregisters everything registered through b, newest first.
func (b *Batch) Undo() {
	if b == nil {
		return
	}
	for i := len(b.done) - 1; i >= 0; i-- {
		b.reg.Unregister(b.done[i])
	}
	b.done = nil
}
