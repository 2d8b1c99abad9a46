package certs

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/promreg"
	"github.com/scafo/scafo-edge/node"
)

// Defaults for zero FleetOptions fields.
const (
	DefaultFleetNodeTimeout = 5 * time.Second
	DefaultFleetRetryMin    = time.Second
	DefaultFleetRetryMax    = 30 * time.Second
	DefaultFleetLockPollMax = time.Second
)

// FleetOptions configures a FleetStorage. The zero value is usable.
type FleetOptions struct {
	// Holder names this edge in lock records, for an operator reading
	// them. Empty: the host name and a random suffix.
	Holder string
	// LockTTL is how long a lock is honoured without renewal: a lock whose
	// record is older than this (its holder died) is taken over. Zero
	// means DefaultLockTTL. certmagic renews it before every issuance
	// attempt (RenewLockLease) for longer than the attempt can take.
	LockTTL time.Duration
	// LockPollMax is the longest wait between two tries of a held lock;
	// waits start at a twentieth of it and double, jittered. Zero means
	// DefaultFleetLockPollMax, or a quarter of LockTTL if that is shorter.
	LockPollMax time.Duration
	// NodeTimeout bounds each call to the node, so a hung node costs a
	// handshake at most this before the local copy answers. Zero means
	// DefaultFleetNodeTimeout.
	NodeTimeout time.Duration
	// RetryMin and RetryMax bound the wait between retries of writes the
	// node did not take (doubling, jittered); RetryMin is also how long
	// reads go straight to the local copy after the node failed. Zero
	// means the defaults above.
	RetryMin, RetryMax time.Duration
	// Log receives outages and recoveries (each once) and takeovers of
	// stale locks; the zero value logs nothing.
	Log zerolog.Logger
	// Registerer receives the store's metrics; nil registers none.
	Registerer prometheus.Registerer

	// clock is the time source; nil is the wall clock. Tests set a fake.
	clock clock.Clock
}

// FleetStorage is the certificate store one fleet shares, through the
// node's /v1/storage surface, with a copy kept in this edge's bbolt store.
// It is a certmagic.Storage, TryLocker and LockLeaseRenewer; hand it to
// the Manager as Options.Storage, which keeps ACME accounts out of it
// (docs/design.md rule 9).
//
// Writes go to the local copy first and then to the node. A write the node
// does not take is queued in the local store (so a restart does not lose
// it) and retried in the background, in order, until it lands: nothing
// issued is lost to an outage. Reads ask the node and fall back to the
// local copy when it does not answer (or while writes for the key are
// queued), so a node outage never takes a certificate away from a running
// or restarting edge; what the node returns is copied locally.
//
// Locks: the node's locks are try-only and never expire, so a holder
// also leaves a record (holder, token, expiry) under "locks/<name>" in the
// node's store, renewed by RenewLockLease. A lock whose record has
// expired, or that stays held without any record for LockTTL, was left
// by a holder that died: it is released and retaken. Like certmagic's
// FileStorage, this trades perfect exclusion on stale locks for never
// blocking issuance forever: a holder stalled past its lease can overlap
// with the one that took over, and certmagic re-checks storage after
// acquiring a lock, so an overlap costs at most a duplicate order. Expiry
// compares the holder's clock with the waiter's: fleet clocks must agree
// to well within LockTTL. While the node cannot be reached, locks fall back
// to the local store's: edges then issue independently (duplicates are
// possible), because refusing would stop renewals for the outage.
//
// Close stops the background retries; queued writes stay queued.
type FleetStorage struct {
	remote      *node.StorageClient
	local       *BoltStorage
	holder      string
	ttl         time.Duration
	poll        time.Duration
	nodeTimeout time.Duration
	retryMin    time.Duration
	retryMax    time.Duration
	log         zerolog.Logger
	m           fleetMetrics
	clock       clock.Clock

	// flushMu orders writes to the node: a new write goes out only after
	// the queue before it has landed.
	flushMu sync.Mutex

	// localMu, gen and inflight keep a copy taken from the node from
	// overwriting a newer local write: a write bumps gen when it starts and
	// when it ends, and a read copies into the local store only when no
	// write started, ended or is running since it asked the node.
	localMu  sync.Mutex
	gen      atomic.Uint64
	inflight int // under localMu

	mu        sync.Mutex
	queue     []fleetOp // in order; mirrors the outbox in the local store
	nextSeq   uint64
	down      bool
	downUntil time.Time
	held      map[string]fleetHeld
	noRecord  map[string]noRecordSeen
	unlocked  lockWake // released on every Unlock

	kick chan struct{}
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

var (
	_ certmagic.Storage          = (*FleetStorage)(nil)
	_ certmagic.TryLocker        = (*FleetStorage)(nil)
	_ certmagic.LockLeaseRenewer = (*FleetStorage)(nil)
)

// copy, and its queue of writes still to land, in local. It resumes the
// queue a previous run left and retries it in the background until
// Close.
func NewFleetStorage(remote *node.StorageClient, local *BoltStorage, opts FleetOptions) (*FleetStorage, error) {
	if remote == nil || local == nil {
		return nil, errors.New("fleet storage: nil node client or local store")
	}
	s := &FleetStorage{
		remote:      remote,
		local:       local,
		holder:      opts.Holder,
		ttl:         orDur(opts.LockTTL, DefaultLockTTL),
		nodeTimeout: orDur(opts.NodeTimeout, DefaultFleetNodeTimeout),
		retryMin:    orDur(opts.RetryMin, DefaultFleetRetryMin),
		retryMax:    orDur(opts.RetryMax, DefaultFleetRetryMax),
		log:         opts.Log,
		clock:       opts.clock,
		held:        map[string]fleetHeld{},
		noRecord:    map[string]noRecordSeen{},
		kick:        make(chan struct{}, 1),
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
	}
	if s.clock == nil {
		s.clock = clock.Real
	}
	s.poll = opts.LockPollMax
	if s.poll <= 0 {
		s.poll = min(DefaultFleetLockPollMax, s.ttl/4)
	}
	if s.holder == "" {
		host, _ := os.Hostname()
		s.holder = host + "-" + randomHex(4)
	}
	if err := s.loadQueue(); err != nil {
		return nil, err
	}
	var err error
	if s.m, err = newFleetMetrics(opts.Registerer, s); err != nil {
		return nil, err
	}
	s.m.nodeUp.Set(1)
	go s.run()
	if len(s.queue) > 0 {
		s.wake()
	}
	return s, nil
}

// Close stops the background retries and waits for them to end. Writes
// still queued stay in the local store for the next run. The node client
// and the local store are the caller's to close, after Close.
func (s *FleetStorage) Close() {
	s.once.Do(func() { close(s.stop) })
	<-s.done
}

func (s *FleetStorage) String() string {
	return fmt.Sprintf("FleetStorage(%v, local copy in %v)", s.remote, s.local)
}

// Pending returns how many writes wait to reach the node.
func (s *FleetStorage) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue)
}

// nodeCtx bounds one call to the node.
func (s *FleetStorage) nodeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.nodeTimeout)
}

// available reports whether a call should ask the node now. After a
// failure the node is left alone for RetryMin; then one caller at a time
// probes it, so a hung node costs one call NodeTimeout, not every
// handshake that needs storage meanwhile.
func (s *FleetStorage) available() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.down {
		return true
	}
	now := s.clock.Now()
	if now.Before(s.downUntil) {
		return false
	}
	s.downUntil = now.Add(s.nodeTimeout + s.retryMin) // this caller's probe
	return true
}

// outage reports whether err means the node could not serve the call
// (no answer, a 5xx, a refused token, no storage surface) rather than an
// answer about the key, and marks the node down if so. A caller's own
// cancellation is neither.
func (s *FleetStorage) outage(ctx context.Context, err error) bool {
	if ctx.Err() != nil || errors.Is(err, node.ErrBadKey) {
		return false
	}
	var se *node.StatusError
	if errors.As(err, &se) {
		switch {
		case se.Status >= 500, se.Status == http.StatusUnauthorized, se.Status == http.StatusForbidden,
			se.Status == http.StatusRequestTimeout, se.Status == http.StatusTooManyRequests,
			se.Status == http.StatusNotFound && se.Op != "get" && se.Op != "stat" && se.Op != "list":
		default:
			return false
		}
	}
	s.mu.Lock()
	was := s.down
	s.down, s.downUntil = true, s.clock.Now().Add(s.retryMin)
	s.mu.Unlock()
	if !was {
		s.m.nodeUp.Set(0)
		s.log.Warn().Err(err).Str("node", s.remote.String()).Msg("certificate store: node unreachable; serving the local copy and queueing writes")
	}
	return true
}

// up records an answer from the node, logging a recovery once.
func (s *FleetStorage) up() {
	s.mu.Lock()
	was := s.down
	s.down = false
	s.mu.Unlock()
	if was {
		s.m.nodeUp.Set(1)
		s.log.Info().Str("node", s.remote.String()).Msg("certificate store: node answers again")
	}
}

// fleetMetrics are the store's gauges and counters, one set per FleetStorage.
type fleetMetrics struct {
	nodeUp     prometheus.Gauge
	pending    prometheus.Gauge
	localReads prometheus.Counter
	localLocks prometheus.Counter
	takeovers  prometheus.Counter
}

func newFleetMetrics(reg prometheus.Registerer, s *FleetStorage) (fleetMetrics, error) {
	m := fleetMetrics{
		nodeUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scafo_edge_cert_store_node_up",
			Help: "1 while the node's certificate store answers, 0 while the edge serves its local copy.",
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scafo_edge_cert_store_pending_writes",
			Help: "Certificate store writes kept locally that have not reached the node yet.",
		}),
		localReads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scafo_edge_cert_store_local_reads_total",
			Help: "Certificate store reads answered from the local copy because the node did not answer or was behind.",
		}),
		localLocks: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scafo_edge_cert_store_local_locks_total",
			Help: "Issuance locks taken in the local store because the node could not be reached.",
		}),
		takeovers: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "scafo_edge_cert_store_stale_lock_takeovers_total",
			Help: "Fleet locks taken over because their holder stopped renewing them.",
		}),
	}
	m.pending.Set(float64(len(s.queue)))
	if reg == nil {
		return m, nil
	}
	if err := promreg.Register(reg, m.nodeUp, m.pending, m.localReads, m.localLocks, m.takeovers); err != nil {
		return fleetMetrics{}, fmt.Errorf("register certificate store metrics: %w", err)
	}
	return m, nil
}
