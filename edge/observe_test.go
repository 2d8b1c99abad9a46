package edge

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// TestConstructorsReturnRegistrationErrors holds edge to the module's one
// registration policy: a second instance on one registry is an error its
// caller sees, not a panic and not shared counters.
func TestConstructorsReturnRegistrationErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		new  func(reg prometheus.Registerer) error
	}{
		{"NewMetrics", func(reg prometheus.Registerer) error { _, err := NewMetrics(reg); return err }},
		{"NewAccessLog", func(reg prometheus.Registerer) error { _, err := NewAccessLog(zerolog.Nop(), 1, reg); return err }},
		{"NewUpdater", func(reg prometheus.Registerer) error { _, err := NewUpdater(&Live{}, zerolog.Nop(), reg); return err }},
	} {
		t.Run(tc.name+" twice on one registry fails the second time", func(t *testing.T) {
			reg := prometheus.NewRegistry()
			if err := tc.new(reg); err != nil {
				t.Fatalf("first: %v", err)
			}
			var already prometheus.AlreadyRegisteredError
			if err := tc.new(reg); !errors.As(err, &already) {
				t.Errorf("second: %v, want an AlreadyRegisteredError", err)
			}
			if err := tc.new(nil); err != nil {
				t.Errorf("with a nil registry: %v", err)
			}
		})
	}
}
