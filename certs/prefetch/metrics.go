package prefetch

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/scafo/scafo-edge/internal/promreg"
)

// results are the outcomes of a name's turn, the label values of
// scafo_edge_tls_prefetch_turns_total.
var results = []string{"obtained", "held", "removed", "elsewhere", "propagating", "unreachable", "no_ipv6", "failed", "backoff", "budget"}

type metrics struct {
	turns       *prometheus.CounterVec
	budgetWaits prometheus.Counter
	// checks counts the reachability checks this edge ran: each stored a
	// token in the certificate storage (a write, and a delete after).
	checks prometheus.Counter
}

// newMetrics builds the queue's collectors and registers them on reg; with
// a nil reg they still count, unobserved.
func newMetrics(reg prometheus.Registerer, q *Queue) (*metrics, error) {
	mt := &metrics{
		turns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scafo_edge_tls_prefetch_turns_total",
			Help: "Certificate prefetch turns, by result (obtained, held, removed, elsewhere, propagating: an edge of this fleet at one of the name's addresses does not name it yet, checked again within about a poll interval, unreachable, no_ipv6: the name has an AAAA record this box cannot check without IPv6, failed, backoff: on-demand issuance holds the name back after a failed issuance, budget: orders recorded by other edges or before a restart fill the registered domain's week).",
		}, []string{"result"}),
		budgetWaits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scafo_edge_tls_prefetch_budget_waits_total",
			Help: "Times a name due for prefetch was held back by the order budget.",
		}),
		checks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scafo_edge_tls_prefetch_reach_checks_total",
			Help: "Reachability checks this edge ran, each a token written to the certificate store (the fleet store when there is one) and deleted after.",
		}),
	}
	for _, r := range results {
		mt.turns.WithLabelValues(r)
	}
	if reg == nil {
		return mt, nil
	}
	cs := []prometheus.Collector{
		mt.turns,
		mt.budgetWaits,
		mt.checks,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "scafo_edge_tls_prefetch_queue_names",
			Help: "Names waiting for a prefetched certificate, in any state.",
		}, func() float64 { return float64(q.count("")) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "scafo_edge_tls_prefetch_unreachable_names",
			Help: "Queued names whose last reachability check found no edge of this fleet.",
		}, func() float64 { return float64(q.count(Unreachable)) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "scafo_edge_tls_prefetch_budget_remaining",
			Help: "Orders the prefetch budget allows now (the hourly bucket, less the names at work).",
		}, func() float64 { return q.budget.remaining(q.clock.Now()) }),
	}
	if err := promreg.Register(reg, cs...); err != nil {
		return nil, fmt.Errorf("register prefetch metrics: %w", err)
	}
	return mt, nil
}

func (m *metrics) result(r string) { m.turns.WithLabelValues(r).Inc() }

// count returns how many queued names are in state s; all of them for "".
func (q *Queue) count(s State) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	if s == "" {
		return len(q.queue)
	}
	n := 0
	for _, e := range q.queue {
		if e.State == s {
			n++
		}
	}
	return n
}
