package handover

import "github.com/prometheus/client_golang/prometheus"

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
// registered with reg (nil: not registered).
func NewCounter(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scafo_edge_handovers_total",
		Help: "Listener handovers between an old and a new edge on one state directory, by this process's part: given, received, fell_back.",
	}, []string{"result"})
	for _, r := range []string{ResultGiven, ResultReceived, ResultFellBack} {
		c.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(c)
	}
	return c
}
