package promreg

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func counter(name string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: name})
}

func TestRegister(t *testing.T) {
	t.Run("every collector is registered", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		if err := Register(reg, counter("a_total"), counter("b_total")); err != nil {
			t.Fatal(err)
		}
		if mfs, _ := reg.Gather(); len(mfs) != 2 {
			t.Errorf("registered %d families, want 2", len(mfs))
		}
	})
	t.Run("a clash registers none and says which", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		reg.MustRegister(counter("b_total"))
		err := Register(reg, counter("a_total"), counter("b_total"))
		var already prometheus.AlreadyRegisteredError
		if !errors.As(err, &already) {
			t.Fatalf("Register = %v, want an AlreadyRegisteredError", err)
		}
		if err := reg.Register(counter("a_total")); err != nil {
			t.Errorf("a_total stayed registered after the failure: %v", err)
		}
	})
	t.Run("a nil registry registers nothing", func(t *testing.T) {
		if err := Register(nil, counter("a_total")); err != nil {
			t.Errorf("Register(nil) = %v", err)
		}
	})
}
