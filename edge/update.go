package edge

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/promreg"
	"github.com/scafo/scafo-edge/node"
)

// Updater compiles each new document into a Table and swaps it into Live,
// logging and counting what the compile dropped. It is the only writer of
// Live once the program runs.
type Updater struct {
	live  *Live
	log   zerolog.Logger
	clock clock.Clock

	changes    prometheus.Counter
	compileDur prometheus.Histogram
	routes     prometheus.Gauge
	prefixes   prometheus.Gauge
	dropped    prometheus.Gauge
	dropsTotal prometheus.Counter
}

// NewUpdater returns an Updater writing to live, its collectors registered
// on reg (nil: no metrics), or the registration's error.
func NewUpdater(live *Live, log zerolog.Logger, reg prometheus.Registerer) (*Updater, error) {
	u := &Updater{
		live:  live,
		log:   log,
		clock: clock.Real,
		changes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scafo_edge_document_changes_total",
			Help: "Routing documents compiled and swapped in.",
		}),
		compileDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "scafo_edge_table_compile_seconds",
			Help:    "Time to compile a routing document into a table.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}),
		routes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scafo_edge_routes",
			Help: "Routes in the live table.",
		}),
		prefixes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scafo_edge_path_prefixes",
			Help: "Path prefixes in the live table.",
		}),
		dropped: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scafo_edge_dropped_entries",
			Help: "Entries of the live document left out by the compile (bad prefixes, unknown targets, over the cap, duplicates).",
		}),
		dropsTotal: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scafo_edge_dropped_entries_total",
			Help: "Entries left out by compiles, summed over every document.",
		}),
	}
	if err := promreg.Register(reg, u.changes, u.compileDur, u.routes, u.prefixes, u.dropped, u.dropsTotal); err != nil {
		return nil, fmt.Errorf("register routing table metrics: %w", err)
	}
	return u, nil
}

// Apply compiles u's document, swaps it in and returns the new table. Every
// drop is logged with its host and reason; a document with many drops logs
// each, because each is a routing decision an operator may be waiting on.
func (up *Updater) Apply(u node.Update) *Table {
	start := up.clock.Now()
	t, drops := Compile(u.Doc)
	t.fingerprint, t.fetchedAt = u.Fingerprint, u.FetchedAt
	up.compileDur.Observe(up.clock.Now().Sub(start).Seconds())
	for _, d := range drops {
		up.log.Warn().Str("host", d.Host).Str("entry", d.Entry).Str("reason", d.Reason).
			Msg("routing document entry dropped; the rest of the document is served")
	}
	up.live.Store(t)
	up.changes.Inc()
	up.routes.Set(float64(len(t.routes)))
	up.prefixes.Set(float64(t.prefixes))
	up.dropped.Set(float64(len(drops)))
	up.dropsTotal.Add(float64(len(drops)))
	up.log.Info().Str("fingerprint", u.Fingerprint).Int("routes", len(t.routes)).
		Int("path_prefixes", t.prefixes).Int("api_hosts", len(t.apiHosts)).Int("dropped", len(drops)).
		Bool("stale", u.Stale).Msg("routing table swapped")
	return t
}
