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
