package handover

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/scafo/scafo-edge/internal/promreg"
)

// Results of a handover, the values of the "result" label of
// scafo_edge_handovers_total.
const (
	// ResultGiven: this edge handed its sockets to a successor.
	ResultGiven = "given"
	// ResultReceived: this edge started on sockets handed over to it.
	ResultReceived = "received"
	// ResultFellBack: an edge was there but the handover failed; this edge
	// bound its own listeners.
	ResultFellBack = "fell_back"
)

// NewCounter returns scafo_edge_handovers_total, with every result at zero,
// registered with reg (nil: not registered), or the registration's error.
func NewCounter(reg prometheus.Registerer) (*prometheus.CounterVec, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scafo_edge_handovers_total",
		Help: "Listener handovers between an old and a new edge on one state directory, by this process's part: given, received, fell_back.",
	}, []string{"result"})
	for _, r := range []string{ResultGiven, ResultReceived, ResultFellBack} {
		c.WithLabelValues(r)
	}
	if err := promreg.Register(reg, c); err != nil {
		return nil, fmt.Errorf("register handover metrics: %w", err)
	}
	return c, nil
}
