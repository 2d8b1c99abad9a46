package backhaul

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/scafo/scafo-edge/internal/promreg"
)

// metrics are the figures an operator needs to see failing upstreams.
// Labels are node names from the routing document, a bounded set
// the fleet controls. A nil *metrics records nothing.
type metrics struct {
	connectFailures *prometheus.CounterVec
	failovers       *prometheus.CounterVec
}

// newMetrics registers p's collectors on reg; nil reg: no metrics. A second
// Proxy on one registry is an error, not a share of the first's counters.
func newMetrics(reg prometheus.Registerer, p *Proxy) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		connectFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scafo_edge_upstream_connect_failures_total",
			Help: "Connections to an upstream that could not be established, by node.",
		}, []string{"node"}),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scafo_edge_upstream_failovers_total",
			Help: "Requests moved on to the next upstream after a connect failure, by the node failed over from.",
		}, []string{"node"}),
	}
	ejected := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "scafo_edge_upstreams_ejected",
		Help: "Upstreams currently ejected after connect failures.",
	}, func() float64 { return float64(p.health.ejectedCount(p.clock.Now())) })
	if err := promreg.Register(reg, m.connectFailures, m.failovers, ejected); err != nil {
		return nil, fmt.Errorf("register upstream metrics: %w", err)
	}
	return m, nil
}

func (m *metrics) connectFailure(node string) {
	if m != nil {
		m.connectFailures.WithLabelValues(node).Inc()
	}
}

func (m *metrics) failover(node string) {
	if m != nil {
		m.failovers.WithLabelValues(node).Inc()
	}
}
