package backhaul

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestSecondProxyOnOneRegistryIsAnError(t *testing.T) {
	reg := prometheus.NewRegistry()
	newProxy(t, Options{Registerer: reg})
	p, err := New(Options{Registerer: reg})
	var already prometheus.AlreadyRegisteredError
	if !errors.As(err, &already) || p != nil {
		t.Fatalf("second New on one registry = %v, %v; want nil and an AlreadyRegisteredError", p, err)
	}
}
