package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/internal/backoff"
	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/promreg"
)

// Source is where the current routing document comes from: the node
// (Poller) or a file (FileSource).
type Source interface {
	// Run keeps the document current until ctx ends, calling apply from the
	// goroutine that called Run, in order, with every changed and valid
	// document, and never with anything else. Seed, if non-nil, is the
	// document already being served (loaded from the state file, say): it is
	// not handed to apply, and an identical body is not handed on again.
	// Run must not be called twice at the same time.
	Run(ctx context.Context, seed *Update, apply func(Update))
	// Status reports how the source is faring; safe from any goroutine.
	Status() PollStatus
}

var (
	_ Source = (*Poller)(nil)
	_ Source = (*FileSource)(nil)
)

// Update is one valid routing document, as handed to apply.
type Update struct {
	Doc         *Document
	Body        []byte // the exact bytes Doc was parsed from
	Fingerprint string // Fingerprint(Body)
	FetchedAt   time.Time
	// Stale reports that the document was not fetched by this process but
	// loaded from the state file: the node has not confirmed it yet.
	Stale bool
}

// PollStatus is a snapshot of a source's state, for /readyz detail and the
// status page. Zero times mean "never".
type PollStatus struct {
	Source              string    // "node <url>" or "file <path>"
	LastAttempt         time.Time // start of the last poll
	LastSuccess         time.Time // start of the last poll that confirmed or changed the document
	LastChange          time.Time // when the current document was first fetched
	LastError           string    // cause of the last failed poll; empty once one succeeds
	ConsecutiveFailures int
	Fingerprint         string // of the document being served; empty: none yet
	// Stale reports that the document being served came from the state file
	// and has not been confirmed by the source since start-up.
	Stale bool
	// Operator is the operator routes file's state; nil without one.
	Operator *OperatorStatus
}

// Poll results, the values of the "result" label of
// scafo_edge_routing_polls_total: a bounded set.
const (
	resultChanged     = "changed"      // a new valid document was applied
	resultUnchanged   = "unchanged"    // 200 with the body already served
	resultNotModified = "not_modified" // 304
	resultDraining    = "draining"     // 503: the node has had no reconcile pass yet
	resultUnauthorize = "unauthorized" // 401/403: the ingress token was rejected
	resultHTTPError   = "http_error"   // any other status
	resultTimeout     = "timeout"
	resultUnreachable = "unreachable" // refused, reset, DNS, TLS
	resultInvalid     = "invalid"     // the body is not a valid document
	resultTooLarge    = "too_large"
	resultReadError   = "read_error" // file source: missing or unreadable
)

var allResults = []string{
	resultChanged, resultUnchanged, resultNotModified, resultDraining,
	resultUnauthorize, resultHTTPError, resultTimeout, resultUnreachable,
	resultInvalid, resultTooLarge, resultReadError,
}

// pollError is a failed poll: its result class and its cause.
type pollError struct {
	result string
	err    error
}

func (e *pollError) Error() string { return e.err.Error() }
func (e *pollError) Unwrap() error { return e.err }

// fetched is what one poll got back.
type fetched struct {
	body        []byte
	etag        string // validator to send next time; empty: quote the fingerprint
	notModified bool
}

// loop is the poll cycle both sources share: fetch, compare fingerprints,
// parse, apply, keep the last good document on any failure, and log a
// failure once and its recovery once.
type loop struct {
	source   string
	interval time.Duration
	timeout  time.Duration // per fetch; zero: none
	maxSize  int64
	fetch    func(ctx context.Context, etag string) (fetched, error)
	log      zerolog.Logger
	m        *metrics // nil: no metrics
	clock    clock.Clock

	// Owned by the goroutine in run.
	cur          *Update
	etag         string
	failKey      string    // what was last logged as failing
	failingSince time.Time // zero while healthy
	refusedFP    string    // fingerprint of the last body refused as invalid
	refusedErr   error     // why it was refused

	mu       sync.Mutex
	st       PollStatus
	lastGood time.Time // last confirmation of the served document
}

func (l *loop) Status() PollStatus {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.st
}

func (l *loop) run(ctx context.Context, seed *Update, apply func(Update)) {
	if seed != nil {
		s := *seed
		l.cur = &s
		l.etag = quoteETag(s.Fingerprint)
		l.mu.Lock()
		l.st.Fingerprint = s.Fingerprint
		l.st.LastChange = s.FetchedAt
		l.st.Stale = s.Stale
		l.lastGood = s.FetchedAt
		l.mu.Unlock()
		l.m.setFingerprint(s.Fingerprint)
	}
	for ctx.Err() == nil {
		l.once(ctx, apply)
		// Spread so that a fleet restarted together does not poll its
		// nodes in lockstep.
		t := l.clock.NewTimer(backoff.Jitter(l.interval, backoff.PollSpread))
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C():
		}
	}
}

func (l *loop) once(ctx context.Context, apply func(Update)) {
	start := l.clock.Now()
	l.mu.Lock()
	l.st.LastAttempt = start
	l.mu.Unlock()

	fctx, cancel := ctx, context.CancelFunc(func() {})
	if l.timeout > 0 {
		fctx, cancel = context.WithTimeout(ctx, l.timeout)
	}
	f, err := l.fetch(fctx, l.etag)
	cancel()
	if ctx.Err() != nil {
		return // shutting down: not a failure of the source
	}
	if err != nil {
		l.failed(start, err, "")
		return
	}
	if f.notModified {
		if l.cur == nil {
			l.failed(start, &pollError{resultHTTPError, errors.New("304 Not Modified while no document is held")}, "")
			return
		}
		l.succeeded(start, resultNotModified)
		return
	}
	fp := Fingerprint(f.body)
	if l.cur != nil && fp == l.cur.Fingerprint {
		if f.etag != "" {
			l.etag = f.etag
		}
		l.succeeded(start, resultUnchanged)
		return
	}
	if fp == l.refusedFP {
		// The same broken body as last time: not worth decoding again
		// (it may be tens of megabytes every few seconds).
		l.failed(start, l.refusedErr, fp)
		return
	}
	doc, err := parse(f.body, l.maxSize)
	if err != nil {
		l.refusedFP, l.refusedErr = fp, &pollError{resultInvalid, err}
		// Keyed by fingerprint: a node that publishes another broken document
		// gets logged again, the same broken one every poll does not.
		l.failed(start, l.refusedErr, fp)
		return
	}
	l.refusedFP, l.refusedErr = "", nil
	u := Update{Doc: doc, Body: f.body, Fingerprint: fp, FetchedAt: start}
	l.cur = &u
	l.etag = f.etag
	if l.etag == "" {
		l.etag = quoteETag(fp)
	}
	// Bookkeeping first, so that apply (and whoever it wakes) already sees
	// the new document in Status and the metrics.
	l.log.Info().Str("source", l.source).Str("fingerprint", fp).Int("routes", len(doc.Routes)).
		Int("bytes", len(f.body)).Msg("routing document changed")
	l.m.setFingerprint(fp)
	l.mu.Lock()
	l.st.Fingerprint = fp
	l.st.LastChange = start
	l.mu.Unlock()
	l.succeeded(start, resultChanged)
	apply(u)
}

func (l *loop) succeeded(start time.Time, result string) {
	if !l.failingSince.IsZero() {
		l.mu.Lock()
		n := l.st.ConsecutiveFailures
		l.mu.Unlock()
		l.log.Info().Str("source", l.source).Int("failed_polls", n).
			Dur("failing_for", start.Sub(l.failingSince)).Msg("routing document poll recovered")
		l.failingSince = time.Time{}
		l.failKey = ""
	}
	l.m.poll(result) // before the status, as in failed
	l.mu.Lock()
	l.st.LastSuccess = start
	l.st.LastError = ""
	l.st.ConsecutiveFailures = 0
	l.st.Stale = false
	l.lastGood = start
	l.mu.Unlock()
}

func (l *loop) failed(start time.Time, err error, key string) {
	result := resultUnreachable
	var pe *pollError
	if errors.As(err, &pe) {
		result = pe.result
	}
	// Counted before the status shows it: whoever reads the status and
	// then the metrics sees this poll in both.
	l.m.poll(result)
	l.mu.Lock()
	l.st.LastError = err.Error()
	l.st.ConsecutiveFailures++
	l.mu.Unlock()

	if l.failingSince.IsZero() {
		l.failingSince = start
	}
	// Log once per kind of failure: a node down for an hour is one line,
	// not 720; a change of cause (down, then draining) is worth a new one.
	if k := result + " " + key; k != l.failKey {
		l.failKey = k
		ev := l.log.Warn()
		if result == resultUnauthorize {
			ev = l.log.Error()
		}
		ev = ev.Str("source", l.source).Str("result", result).Err(err)
		if l.cur != nil {
			ev.Str("serving", l.cur.Fingerprint).Msg("routing document poll failed; keeping the last good document")
		} else {
			ev.Msg("routing document poll failed; no document yet, every request is answered 503")
		}
	}
}

func quoteETag(fp string) string {
	if fp == "" {
		return ""
	}
	return `"` + fp + `"`
}

// metrics are a source's collectors; a nil *metrics records nothing.
type metrics struct {
	polls   *prometheus.CounterVec
	changes prometheus.Counter
	info    *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer, l *loop) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	m := &metrics{
		polls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scafo_edge_routing_polls_total",
			Help: "Polls of the routing document source, by result.",
		}, []string{"result"}),
		changes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scafo_edge_routing_document_changes_total",
			Help: "Changed, valid routing documents handed on to be served.",
		}),
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "scafo_edge_routing_document_info",
			Help: "Always 1, labelled with the fingerprint (SHA-256 hex) of the routing document being served.",
		}, []string{"fingerprint"}),
	}
	for _, r := range allResults {
		m.polls.WithLabelValues(r)
	}
	cs := []prometheus.Collector{
		m.polls, m.changes, m.info,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "scafo_edge_routing_seconds_since_last_good",
			Help: "Seconds since the source last confirmed the document being served (since its fetch time when loaded from the state file); -1 while no document is held.",
		}, func() float64 {
			l.mu.Lock()
			t := l.lastGood
			l.mu.Unlock()
			if t.IsZero() {
				return -1
			}
			return l.clock.Now().Sub(t).Seconds()
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "scafo_edge_routing_stale",
			Help: "1 while the document being served was loaded from the state file and not yet confirmed by the source.",
		}, func() float64 {
			if l.Status().Stale {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "scafo_edge_routing_consecutive_failures",
			Help: "Polls failed in a row; 0 once one succeeds.",
		}, func() float64 {
			return float64(l.Status().ConsecutiveFailures)
		}),
	}
	if err := promreg.Register(reg, cs...); err != nil {
		return nil, fmt.Errorf("register routing metrics: %w", err)
	}
	return m, nil
}

func (m *metrics) poll(result string) {
	if m == nil {
		return
	}
	m.polls.WithLabelValues(result).Inc()
	if result == resultChanged {
		m.changes.Inc()
	}
}

func (m *metrics) setFingerprint(fp string) {
	if m == nil {
		return
	}
	m.info.Reset()
	m.info.WithLabelValues(fp).Set(1)
}
