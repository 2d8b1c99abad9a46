package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/promreg"
)

// OperatorSource keeps the operator routes file (--operator-routes)
// current: Load reads it once at start, where a broken file is an error;
// Run re-reads it every interval and hands on each changed, valid one.
// While the file on disk is broken (or gone), the last good one stays
// served: the failure is logged once, Status and
// scafo_edge_operator_routes_valid say so, and the fix is logged once.
// As for FileSource, no inotify: a read and a hash of a small file every
// second cost nothing and miss no event on any mount.
type OperatorSource struct {
	path     string
	interval time.Duration
	log      zerolog.Logger
	clock    clock.Clock

	// Owned by Load, then by the goroutine in Run.
	served  string // fingerprint of the file being served
	failKey string // fingerprint (or cause) last logged as failing

	mu sync.Mutex
	st OperatorStatus
}

// OperatorSourceOptions configures an OperatorSource.
type OperatorSourceOptions struct {
	// Path is the operator routes file. Required.
	Path string
	// Interval between reads. Zero: 1s.
	Interval time.Duration
	// Log receives failures (once per cause), recoveries and changes. The
	// zero value logs nothing.
	Log zerolog.Logger
	// Registerer receives scafo_edge_operator_routes_valid. Nil: no
	// metrics.
	Registerer prometheus.Registerer
	// Clock drives the interval. Nil: the wall clock.
	Clock clock.Clock
}

// OperatorUpdate is one valid operator file, as handed to apply.
type OperatorUpdate struct {
	Doc         *OperatorDocument
	Fingerprint string // Fingerprint of the file's bytes
	ReadAt      time.Time
}

// OperatorStatus is a snapshot of the operator file's state, for the status
// page. Zero times mean "never".
type OperatorStatus struct {
	File string
	// Valid reports whether the file on disk is the one served: false
	// while a broken edit (or a missing file) is kept out.
	Valid       bool
	LastError   string // why the file on disk is not served; empty while Valid
	Fingerprint string // of the file being served
	LastChange  time.Time
	Routes      int
}

// NewOperatorSource checks opts and returns an OperatorSource; nothing is
// read until Load.
func NewOperatorSource(opts OperatorSourceOptions) (*OperatorSource, error) {
	if opts.Path == "" {
		return nil, errors.New("operator routes: empty path")
	}
	s := &OperatorSource{path: opts.Path, interval: opts.Interval, log: opts.Log, clock: opts.Clock}
	if s.interval <= 0 {
		s.interval = time.Second
	}
	if s.clock == nil {
		s.clock = clock.Real
	}
	s.st.File = opts.Path
	valid := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "scafo_edge_operator_routes_valid",
		Help: "1 while the operator routes file on disk is the one served; 0 while a broken edit (or a missing file) is kept out and the last good one served.",
	}, func() float64 {
		if s.Status().Valid {
			return 1
		}
		return 0
	})
	if err := promreg.Register(opts.Registerer, valid); err != nil {
		return nil, fmt.Errorf("register operator routes metrics: %w", err)
	}
	return s, nil
}

// Status reports the file's state; safe from any goroutine.
func (s *OperatorSource) Status() OperatorStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

// Load reads and parses the file once, for start-up: a missing, unreadable
// or broken file is an error naming the file (and, when broken, the line,
// column and field: an *OperatorError). On success the file is the one
// served, and Run hands on only later changes.
func (s *OperatorSource) Load() (OperatorUpdate, error) {
	body, err := s.read()
	if err != nil {
		return OperatorUpdate{}, err
	}
	u, err := s.parse(body)
	if err != nil {
		return OperatorUpdate{}, err
	}
	s.served = u.Fingerprint
	s.setServed(u)
	return u, nil
}

// Run re-reads the file every interval until ctx ends, calling apply from
// its own goroutine, in order, with every changed and valid file. Call it
// once, after Load.
func (s *OperatorSource) Run(ctx context.Context, apply func(OperatorUpdate)) {
	for {
		t := s.clock.NewTimer(s.interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		s.once(apply)
	}
}

func (s *OperatorSource) once(apply func(OperatorUpdate)) {
	body, err := s.read()
	if err != nil {
		s.failed(err.Error(), err)
		return
	}
	fp := Fingerprint(body)
	if fp == s.served {
		s.recovered()
		return
	}
	if fp == s.failKey {
		return // the same broken file: logged already
	}
	u, err := s.parse(body)
	if err != nil {
		s.failed(fp, err)
		return
	}
	s.recovered()
	s.served = fp
	s.log.Info().Str("file", s.path).Str("fingerprint", fp).Int("routes", len(u.Doc.Routes)).Msg("operator routes file changed")
	s.setServed(u)
	apply(u)
}

func (s *OperatorSource) read() ([]byte, error) {
	fh, err := os.Open(s.path)
	if err != nil {
		return nil, fmt.Errorf("operator routes: %w", err)
	}
	defer fh.Close()
	body, err := io.ReadAll(io.LimitReader(fh, MaxOperatorFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("operator routes: read %s: %w", s.path, err)
	}
	return body, nil
}

func (s *OperatorSource) parse(body []byte) (OperatorUpdate, error) {
	doc, err := ParseOperator(s.path, body)
	if err != nil {
		return OperatorUpdate{}, err
	}
	return OperatorUpdate{Doc: doc, Fingerprint: Fingerprint(body), ReadAt: s.clock.Now()}, nil
}

func (s *OperatorSource) setServed(u OperatorUpdate) {
	s.mu.Lock()
	s.st.Valid, s.st.LastError = true, ""
	s.st.Fingerprint, s.st.LastChange, s.st.Routes = u.Fingerprint, u.ReadAt, len(u.Doc.Routes)
	s.mu.Unlock()
}

// failed keeps the served file and logs err once per key (the broken
// file's fingerprint, or the read error).
func (s *OperatorSource) failed(key string, err error) {
	s.mu.Lock()
	s.st.Valid, s.st.LastError = false, err.Error()
	s.mu.Unlock()
	if key == s.failKey {
		return
	}
	s.failKey = key
	s.log.Error().Str("file", s.path).Str("serving", s.served).Err(err).
		Msg("operator routes file refused; keeping the last good one")
}

// recovered logs, once, that the file on disk is good again.
func (s *OperatorSource) recovered() {
	if s.failKey == "" {
		return
	}
	s.failKey = ""
	s.mu.Lock()
	s.st.Valid, s.st.LastError = true, ""
	s.mu.Unlock()
	s.log.Info().Str("file", s.path).Msg("operator routes file is good again")
}

// WithOperator returns src with the operator file's state added to its
// Status (PollStatus.Operator), for the status surfaces. Its Run is src's:
// the operator file's documents are applied differently, and its Run is
// its caller's to start.
func WithOperator(src Source, op *OperatorSource) Source {
	return withOperator{src, op}
}

type withOperator struct {
	Source
	op *OperatorSource
}

func (w withOperator) Status() PollStatus {
	st := w.Source.Status()
	o := w.op.Status()
	st.Operator = &o
	return st
}
