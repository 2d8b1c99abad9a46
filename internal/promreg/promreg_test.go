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

func TestBatchUndo(t *testing.T) {
	reg := prometheus.NewRegistry()
	b := NewBatch(reg)
	if err := Register(b, counter("a_total"), counter("b_total")); err != nil {
		t.Fatal(err)
	}
	b.MustRegister(counter("c_total"))
	kept := counter("d_total")
	reg.MustRegister(kept) // not through the batch: Undo leaves it
	b.Undo()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "d_total" {
		var names []string
		for _, mf := range mfs {
			names = append(names, mf.GetName())
		}
		t.Errorf("after Undo: %v registered, want only d_total", names)
	}
	if err := Register(b, counter("a_total")); err != nil {
		t.Errorf("a_total could not be registered again after Undo: %v", err)
	}
	var none *Batch
	none.Undo() // a nil Batch, from a nil registry, undoes nothing
	if NewBatch(nil) != nil {
		t.Error("NewBatch(nil) is not nil")
	}
}
