package edge

import (
	"fmt"
	"sync"

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

	// mu serialises compiles: the node's source and the operator file's
	// each apply from a goroutine of their own.
	mu       sync.Mutex
	lastNode *node.Update         // nil before the node's first document
	operator *node.OperatorUpdate // nil: no operator file
	verify   *verifier            // basic auth's, kept across tables
	opm      *operatorMetrics     // nil until SetOperator with a registry

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

// Apply compiles u's document (with the operator file's routes, if any),
// swaps it in and returns the new table. Every drop is logged with its host
// and reason; a document with many drops logs each, because each is a
// routing decision an operator may be waiting on. Safe to call alongside
// ApplyOperator.
func (up *Updater) Apply(u node.Update) *Table {
	up.mu.Lock()
	defer up.mu.Unlock()
	up.lastNode = &u
	return up.swap()
}

// SetOperator makes the operator routes file part of every table compiled
// from now on, and registers scafo_edge_operator_route_conflicts on reg
// (nil: no metric). It publishes nothing: call it before the first Apply,
// and ApplyOperator for the file's later changes. Without it, tables are
// the node's document alone.
func (up *Updater) SetOperator(u node.OperatorUpdate, reg prometheus.Registerer) error {
	m := &operatorMetrics{conflicts: prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "scafo_edge_operator_route_conflicts",
		Help: "Hosts both the node's document and the operator routes file name, served by the operator's route.",
	})}
	if err := promreg.Register(reg, m.conflicts); err != nil {
		return fmt.Errorf("register operator route metrics: %w", err)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	up.operator, up.opm, up.verify = &u, m, newVerifier()
	return nil
}

// ApplyOperator recompiles the live table with a changed operator file and
// returns it; nil while the node has sent no document yet (its first one
// brings the operator's routes with it: before it, every request is
// answered 503, docs/design.md rule 1). Safe to call alongside Apply.
func (up *Updater) ApplyOperator(u node.OperatorUpdate) *Table {
	up.mu.Lock()
	defer up.mu.Unlock()
	if up.verify == nil {
		up.verify = newVerifier()
	}
	up.operator = &u
	if up.lastNode == nil {
		return nil
	}
	return up.swap()
}

// swap compiles the last node document with the operator file and
// publishes the table. up.mu is held.
func (up *Updater) swap() *Table {
	u := *up.lastNode
	start := up.clock.Now()
	var t *Table
	var drops []Drop
	var conflicts []Conflict
	if up.operator == nil {
		t, drops = Compile(u.Doc)
	} else {
		t, drops, conflicts = compile(u.Doc, up.operator.Doc, up.verify)
		t.operatorFP = up.operator.Fingerprint
	}
	t.fingerprint, t.fetchedAt = u.Fingerprint, u.FetchedAt
	up.compileDur.Observe(up.clock.Now().Sub(start).Seconds())
	for _, d := range drops {
		up.log.Warn().Str("host", d.Host).Str("entry", d.Entry).Str("reason", d.Reason).
			Msg("routing document entry dropped; the rest of the document is served")
	}
	// Logged once per change of either document: the node keeps asking for
	// these hosts, and the operator may not know it.
	for _, c := range conflicts {
		up.log.Warn().Str("host", c.Host).Str("node_application", c.NodeApplication).
			Str("operator_application", c.OperatorApplication).
			Msg("host named by both the node's document and the operator routes file; the operator's route serves it")
	}
	if up.opm != nil {
		up.opm.conflicts.Set(float64(len(conflicts)))
	}
	up.live.Store(t)
	up.changes.Inc()
	up.routes.Set(float64(len(t.routes)))
	up.prefixes.Set(float64(t.prefixes))
	up.dropped.Set(float64(len(drops)))
	up.dropsTotal.Add(float64(len(drops)))
	ev := up.log.Info().Str("fingerprint", u.Fingerprint).Int("routes", len(t.routes)).
		Int("path_prefixes", t.prefixes).Int("api_hosts", len(t.apiHosts)).Int("dropped", len(drops)).
		Bool("stale", u.Stale)
	if up.operator != nil {
		ev = ev.Str("operator_fingerprint", t.operatorFP).Int("operator_conflicts", len(conflicts))
	}
	ev.Msg("routing table swapped")
	return t
}

// operatorMetrics are the collectors of the operator file's merge.
type operatorMetrics struct {
	conflicts prometheus.Gauge
}
