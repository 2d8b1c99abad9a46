package tickets

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/scafo/scafo-edge/internal/promreg"
)

// The values of the "result" label of scafo_edge_tls_tickets_presented_total.
const (
	// resultKnown: the ticket decrypted under a key this edge holds.
	resultKnown = "known"
	// resultUnknown: under no key this edge holds (expired, another
	// fleet's, an edge's that did not hand its keys over): a full
	// handshake follows.
	resultUnknown = "unknown"
)

// metrics counts the tickets clients present.
type metrics struct {
	known, unknown prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (metrics, error) {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "scafo_edge_tls_tickets_presented_total",
		Help: "TLS session tickets clients presented, by whether one of this edge's ticket keys decrypted them (known) or none did (unknown: a full handshake follows).",
	}, []string{"result"})
	m := metrics{known: c.WithLabelValues(resultKnown), unknown: c.WithLabelValues(resultUnknown)}
	if err := promreg.Register(reg, c); err != nil {
		return metrics{}, fmt.Errorf("register session ticket metrics: %w", err)
	}
	return m, nil
}
