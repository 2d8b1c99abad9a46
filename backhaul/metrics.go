package backhaul

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// metrics are the figures an operator needs to see failing upstreams.
// Labels are node names from the routing document, a bounded set
// the fleet controls. A nil *metrics records nothing.
type metrics struct {
	connectFailures *prometheus.CounterVec
	failovers       *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, p *Proxy, log zerolog.Logger) *metrics {
	if reg == nil {
		return nil
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
	m.connectFailures = register(reg, m.connectFailures, log)
	m.failovers = register(reg, m.failovers, log)
	ejected := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "scafo_edge_upstreams_ejected",
		Help: "Upstreams currently ejected after connect failures.",
	}, func() float64 { return float64(p.health.ejectedCount(p.now())) })
	if err := reg.Register(ejected); err != nil {
		log.Error().Err(err).Msg("register backhaul metrics")
	}
	return m
}

// register adds c to reg, or returns the collector already registered under
// its name, so two proxies on one registry share their counters.
func register(reg prometheus.Registerer, c *prometheus.CounterVec, log zerolog.Logger) *prometheus.CounterVec {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
			return existing
		}
	}
	log.Error().Err(err).Msg("register backhaul metrics")
	return c
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
