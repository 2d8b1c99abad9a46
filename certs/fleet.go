package certs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	mrand "math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/node"
)

// Defaults for zero FleetOptions fields.
const (
	DefaultFleetNodeTimeout = 5 * time.Second
	DefaultFleetRetryMin    = time.Second
	DefaultFleetRetryMax    = 30 * time.Second
	DefaultFleetLockPollMax = time.Second
)

// fleetOutbox is the key prefix, in the local bbolt store, of writes that
// have not reached the node yet. certmagic never uses it.
const fleetOutbox = "scafo-edge-fleet-outbox"

// fleetLockRecords is the key prefix, in the node's store, of the records
// lock holders leave: who holds a lock and until when.
const fleetLockRecords = "locks"

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
}

// FleetStorage is the certificate store one fleet shares, through the
// node's /v1/storage surface, with a copy kept in this edge's bbolt store.
// It is a certmagic.Storage, TryLocker and LockLeaseRenewer; hand it to
// the Manager as Options.Storage, which keeps ACME accounts out of it
// (DESIGN.md rule 9).
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
	remote *node.StorageClient
	local  *BoltStorage
	holder string
	ttl    time.Duration
	poll   time.Duration
	tmo    time.Duration
	rmin   time.Duration
	rmax   time.Duration
	log    zerolog.Logger
	m      fleetMetrics

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

type fleetOp struct {
	Seq    uint64 `json:"seq"`
	Delete bool   `json:"delete,omitempty"`
	Key    string `json:"key"`
}

func (o fleetOp) outboxKey() string { return fmt.Sprintf("%s/%020d", fleetOutbox, o.Seq) }

// fleetHeld is a lock this value holds: on the node under token, or, when
// the node could not be reached, in the local store.
type fleetHeld struct {
	token string
	local bool
}

// noRecordSeen tracks a lock seen held with no record, in consecutive
// looks: it is stale once that has lasted LockTTL over several looks.
type noRecordSeen struct {
	since time.Time
	looks int
}

// fleetLock is a lock record, the body of the node's lock and the value
// of its record object.
type fleetLock struct {
	Holder  string    `json:"holder"`
	Token   string    `json:"token"`
	Created time.Time `json:"created"`
	Expires time.Time `json:"expires"`
}

// NewFleetStorage returns a store writing through remote and keeping its
// copy, and its queue of writes still to land, in local. It resumes the
// queue a previous run left and retries it in the background until
// Close.
func NewFleetStorage(remote *node.StorageClient, local *BoltStorage, opts FleetOptions) (*FleetStorage, error) {
	if remote == nil || local == nil {
		return nil, errors.New("fleet storage: nil node client or local store")
	}
	s := &FleetStorage{
		remote:   remote,
		local:    local,
		holder:   opts.Holder,
		ttl:      orDur(opts.LockTTL, DefaultLockTTL),
		tmo:      orDur(opts.NodeTimeout, DefaultFleetNodeTimeout),
		rmin:     orDur(opts.RetryMin, DefaultFleetRetryMin),
		rmax:     orDur(opts.RetryMax, DefaultFleetRetryMax),
		log:      opts.Log,
		held:     map[string]fleetHeld{},
		noRecord: map[string]noRecordSeen{},
		kick:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
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
	return context.WithTimeout(ctx, s.tmo)
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
	now := time.Now()
	if now.Before(s.downUntil) {
		return false
	}
	s.downUntil = now.Add(s.tmo + s.rmin) // this caller's probe
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
	s.down, s.downUntil = true, time.Now().Add(s.rmin)
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

// --- writes ---

// Store writes value to the local copy, then to the node, queueing it when
// the node does not take it.
func (s *FleetStorage) Store(ctx context.Context, key string, value []byte) error {
	key = cleanKey(key)
	if key == "" {
		return errors.New("store: empty key")
	}
	if err := s.localWrite(func() error { return s.local.Store(ctx, key, value) }); err != nil {
		return err
	}
	defer s.endWrite()
	return s.write(ctx, fleetOp{Key: key}, func(ctx context.Context) error {
		return s.remote.Put(ctx, key, value)
	})
}

// Delete removes key and everything beneath it, locally and on the node,
// queueing the delete when the node does not take it.
func (s *FleetStorage) Delete(ctx context.Context, key string) error {
	key = cleanKey(key)
	if key == "" {
		// Deleting the root would empty the whole fleet's store (and the
		// local bucket the ACME account shares); certmagic never does.
		return errors.New("delete: empty key")
	}
	if err := s.localWrite(func() error { return s.local.Delete(ctx, key) }); err != nil {
		return err
	}
	defer s.endWrite()
	return s.write(ctx, fleetOp{Key: key, Delete: true}, func(ctx context.Context) error {
		return s.remote.Delete(ctx, key)
	})
}

func (s *FleetStorage) localWrite(f func() error) error {
	s.localMu.Lock()
	defer s.localMu.Unlock()
	s.gen.Add(1)
	s.inflight++
	if err := f(); err != nil {
		s.inflight--
		return err
	}
	return nil
}

func (s *FleetStorage) endWrite() {
	s.localMu.Lock()
	defer s.localMu.Unlock()
	s.gen.Add(1)
	s.inflight--
}

// write sends op to the node after whatever is queued before it, or
// queues it. The local copy already holds the write, so a queued write
// returns nil: it is durable here and will land.
func (s *FleetStorage) write(ctx context.Context, op fleetOp, send func(context.Context) error) error {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	if s.available() && (s.Pending() == 0 || s.flushLocked(ctx) == nil) {
		nctx, cancel := s.nodeCtx(ctx)
		err := send(nctx)
		cancel()
		if err == nil {
			s.up()
			return nil
		}
		if !s.outage(ctx, err) && ctx.Err() == nil {
			// The node answered and refused this write (a 4xx about the
			// write itself): retrying cannot help.
			return fmt.Errorf("write to fleet store: %w", err)
		}
	}
	if err := s.enqueue(op); err != nil {
		return err
	}
	s.wake()
	return nil
}

func (s *FleetStorage) enqueue(op fleetOp) error {
	s.mu.Lock()
	op.Seq = s.nextSeq
	s.nextSeq++
	s.mu.Unlock()
	b, err := json.Marshal(op)
	if err != nil {
		return fmt.Errorf("queue write %q: %w", op.Key, err)
	}
	// The outbox lives outside the context of the call that queued it.
	if err := s.local.Store(context.Background(), op.outboxKey(), b); err != nil {
		return fmt.Errorf("queue write %q: %w", op.Key, err)
	}
	s.mu.Lock()
	s.queue = append(s.queue, op)
	n := len(s.queue)
	s.mu.Unlock()
	s.m.pending.Set(float64(n))
	return nil
}

func (s *FleetStorage) loadQueue() error {
	ctx := context.Background()
	keys, err := s.local.List(ctx, fleetOutbox, false)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("load queued writes: %w", err)
	}
	for _, k := range keys {
		b, err := s.local.Load(ctx, k)
		if err != nil {
			return fmt.Errorf("load queued write %q: %w", k, err)
		}
		var op fleetOp
		if err := json.Unmarshal(b, &op); err != nil {
			s.log.Error().Err(err).Str("entry", k).Msg("certificate store: dropping an unreadable queued write")
			_ = s.local.Delete(ctx, k)
			continue
		}
		s.queue = append(s.queue, op)
		s.nextSeq = max(s.nextSeq, op.Seq+1)
	}
	return nil
}

// flushLocked sends the queue to the node in order, dropping each entry
// as it lands. flushMu must be held. It stops at the first failure.
func (s *FleetStorage) flushLocked(ctx context.Context) error {
	landed := 0
	defer func() {
		if landed > 0 {
			s.log.Info().Int("writes", landed).Int("still_queued", s.Pending()).Msg("certificate store: queued writes reached the node")
		}
	}()
	for {
		s.mu.Lock()
		if len(s.queue) == 0 {
			s.mu.Unlock()
			return nil
		}
		op := s.queue[0]
		s.mu.Unlock()

		err := s.send(ctx, op)
		if err != nil && s.outage(ctx, err) {
			return err
		}
		if err != nil && ctx.Err() != nil {
			return err
		}
		if err != nil {
			// The node refuses this write for good; keeping it would stall
			// every write after it.
			s.log.Error().Err(err).Str("key", op.Key).Msg("certificate store: node refused a queued write; dropping it")
		} else {
			landed++
			s.up()
		}
		if derr := s.local.Delete(context.Background(), op.outboxKey()); derr != nil {
			return fmt.Errorf("drop queued write %q: %w", op.Key, derr)
		}
		s.mu.Lock()
		s.queue = s.queue[1:]
		n := len(s.queue)
		s.mu.Unlock()
		s.m.pending.Set(float64(n))
	}
}

// send replays one queued write: a put sends what the local copy holds
// now (a later write of the same key is queued after it anyway).
func (s *FleetStorage) send(ctx context.Context, op fleetOp) error {
	nctx, cancel := s.nodeCtx(ctx)
	defer cancel()
	if op.Delete {
		return s.remote.Delete(nctx, op.Key)
	}
	v, err := s.local.Load(nctx, op.Key)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // deleted since; its delete is queued behind
	}
	if err != nil {
		return err
	}
	return s.remote.Put(nctx, op.Key, v)
}

func (s *FleetStorage) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// run retries the queue until Close, with jittered, doubling waits after
// failures.
func (s *FleetStorage) run() {
	defer close(s.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.stop
		cancel()
	}()
	wait := s.rmin
	var timer <-chan time.Time
	for {
		select {
		case <-s.stop:
			return
		case <-s.kick:
		case <-timer:
		}
		timer = nil
		if s.Pending() == 0 {
			continue
		}
		s.flushMu.Lock()
		err := s.flushLocked(ctx)
		s.flushMu.Unlock()
		if err == nil {
			wait = s.rmin
			continue
		}
		timer = time.After(jitter(wait))
		wait = min(wait*2, s.rmax)
	}
}

// jitter spreads d over [d/2, 3d/2) so edges that failed together do not
// retry together.
func jitter(d time.Duration) time.Duration {
	return d/2 + time.Duration(mrand.Int64N(int64(d)+1))
}

// --- reads ---

// dirty reports whether a queued write touches key: the key itself, a
// key beneath it, or a key above it (a delete). The node is behind this
// edge on such a key, so the local copy answers.
func (s *FleetStorage) dirty(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, op := range s.queue {
		if op.Key == key || isUnder(key, op.Key) || isUnder(op.Key, key) {
			return true
		}
	}
	return false
}

// isUnder reports whether key lies beneath dir, component-wise.
func isUnder(key, dir string) bool {
	return dir == "" || strings.HasPrefix(key, dir+"/")
}

// fromNode reports whether a read of key should ask the node, counting a
// read the local copy answers instead.
func (s *FleetStorage) fromNode(key string) bool {
	if !s.dirty(key) && s.available() {
		return true
	}
	s.m.localReads.Inc()
	return false
}

// Load returns the value at key from the node, or from the local copy
// when the node does not answer.
func (s *FleetStorage) Load(ctx context.Context, key string) ([]byte, error) {
	key = cleanKey(key)
	g := s.gen.Load()
	if !s.fromNode(key) {
		return s.local.Load(ctx, key)
	}
	nctx, cancel := s.nodeCtx(ctx)
	v, err := s.remote.Get(nctx, key)
	cancel()
	switch {
	case err == nil:
		s.up()
		s.keepCopy(ctx, g, key, v)
		return v, nil
	case errors.Is(err, fs.ErrNotExist):
		s.up()
		return nil, fmt.Errorf("load %q: %w", key, fs.ErrNotExist)
	case ctx.Err() != nil:
		return nil, err
	}
	s.outage(ctx, err)
	s.m.localReads.Inc()
	return s.local.Load(ctx, key)
}

// keepCopy copies what the node returned into the local store, unless a
// write of this edge may have raced the read (see localMu).
func (s *FleetStorage) keepCopy(ctx context.Context, g uint64, key string, v []byte) {
	s.localMu.Lock()
	defer s.localMu.Unlock()
	if s.inflight > 0 || s.gen.Load() != g {
		return
	}
	if old, err := s.local.Load(ctx, key); err == nil && bytes.Equal(old, v) {
		return
	}
	if err := s.local.Store(ctx, key, v); err != nil {
		s.log.Warn().Err(err).Str("key", key).Msg("certificate store: could not keep a local copy")
	}
}

// Exists reports whether key is a file or a directory, asking the node
// and falling back to the local copy.
func (s *FleetStorage) Exists(ctx context.Context, key string) bool {
	_, err := s.Stat(ctx, key)
	return err == nil
}

// Stat describes key from the node (a file, or a directory when keys lie
// beneath it), or from the local copy when the node does not answer.
func (s *FleetStorage) Stat(ctx context.Context, key string) (certmagic.KeyInfo, error) {
	key = cleanKey(key)
	if !s.fromNode(key) {
		return s.local.Stat(ctx, key)
	}
	nctx, cancel := s.nodeCtx(ctx)
	defer cancel()
	var info node.ObjectInfo
	var err error
	if key != "" {
		info, err = s.remote.Stat(nctx, key)
	} else {
		err = fs.ErrNotExist
	}
	if err == nil {
		s.up()
		return certmagic.KeyInfo{Key: key, Modified: info.Modified, Size: info.Size, IsTerminal: true}, nil
	}
	if errors.Is(err, fs.ErrNotExist) {
		_, err = s.remote.List(nctx, key, false)
		if err == nil {
			s.up()
			return certmagic.KeyInfo{Key: key}, nil
		}
		if errors.Is(err, fs.ErrNotExist) {
			s.up()
			return certmagic.KeyInfo{}, fmt.Errorf("stat %q: %w", key, fs.ErrNotExist)
		}
	}
	if ctx.Err() != nil {
		return certmagic.KeyInfo{}, err
	}
	s.outage(ctx, err)
	s.m.localReads.Inc()
	return s.local.Stat(ctx, key)
}

// List returns the keys directly under dir, or every key and directory
// beneath it when recursive is true, in sorted order, from the node or,
// when it does not answer, the local copy. Nothing under dir is an error
// wrapping fs.ErrNotExist.
func (s *FleetStorage) List(ctx context.Context, dir string, recursive bool) ([]string, error) {
	dir = cleanKey(dir)
	if !s.fromNode(dir) {
		return s.localList(ctx, dir, recursive)
	}
	nctx, cancel := s.nodeCtx(ctx)
	keys, err := s.remote.List(nctx, dir, recursive)
	cancel()
	switch {
	case err == nil:
		s.up()
		return shapeList(dir, keys, recursive), nil
	case errors.Is(err, fs.ErrNotExist):
		s.up()
		return nil, fmt.Errorf("list %q: %w", dir, fs.ErrNotExist)
	case ctx.Err() != nil:
		return nil, err
	}
	s.outage(ctx, err)
	s.m.localReads.Inc()
	return s.localList(ctx, dir, recursive)
}

func (s *FleetStorage) localList(ctx context.Context, dir string, recursive bool) ([]string, error) {
	keys, err := s.local.List(ctx, dir, recursive)
	if err != nil {
		return nil, err
	}
	keys = slices.DeleteFunc(keys, func(k string) bool { return k == fleetOutbox || isUnder(k, fleetOutbox) })
	if len(keys) == 0 && dir == "" {
		return nil, fmt.Errorf("list %q: %w", dir, fs.ErrNotExist)
	}
	return keys, nil
}

// shapeList makes what the node listed into what certmagic expects
// whatever the node's listing style: only keys beneath dir, cut to the
// direct child when not recursive, and with every directory between dir
// and a key when recursive (a bucket lists objects only).
func shapeList(dir string, keys []string, recursive bool) []string {
	seen := map[string]bool{}
	base := ""
	if dir != "" {
		base = dir + "/"
	}
	for _, k := range keys {
		k = cleanKey(k)
		if !isUnder(k, dir) || k == dir {
			continue
		}
		rel := k[len(base):]
		for i := 0; i < len(rel); i++ {
			if rel[i] != '/' {
				continue
			}
			if !recursive {
				break
			}
			seen[base+rel[:i]] = true
		}
		if !recursive {
			if i := strings.IndexByte(rel, '/'); i >= 0 {
				rel = rel[:i]
			}
		}
		seen[base+rel] = true
	}
	out := make([]string, 0, len(seen))
	for k := range seen {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// --- locks ---

func lockRecordKey(name string) string { return fleetLockRecords + "/" + name }

// lockBody is the record this edge leaves for a lock it holds under token,
// valid for lease from now.
func (s *FleetStorage) lockBody(token string, lease time.Duration) ([]byte, error) {
	now := time.Now()
	return json.Marshal(fleetLock{Holder: s.holder, Token: token, Created: now, Expires: now.Add(lease)})
}

// lockRecord reads the record of lock name from the node. found is false
// when there is none or it cannot be decoded (an unreadable record names
// no holder); err is a failure to ask, never a missing record.
func (s *FleetStorage) lockRecord(ctx context.Context, name string) (rec fleetLock, found bool, err error) {
	b, err := s.remote.Get(ctx, lockRecordKey(name))
	if errors.Is(err, fs.ErrNotExist) {
		return fleetLock{}, false, nil
	}
	if err != nil {
		return fleetLock{}, false, err
	}
	if json.Unmarshal(b, &rec) != nil {
		return fleetLock{}, false, nil
	}
	return rec, true, nil
}

// Lock blocks until it holds the lock for name, or ctx ends. It tries
// again after jittered waits doubling up to LockPollMax, or at once when
// this value releases a lock.
func (s *FleetStorage) Lock(ctx context.Context, name string) error {
	wait := max(s.poll/20, time.Millisecond)
	return pollLock(ctx, name, &s.unlocked, func() time.Duration {
		d := jitter(wait)
		wait = min(wait*2, s.poll)
		return d
	}, s.TryLock)
}

// TryLock takes the lock for name if it is free or stale, without
// waiting. While the node cannot be reached it takes the local store's
// lock instead.
func (s *FleetStorage) TryLock(ctx context.Context, name string) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if !s.available() {
		return s.tryLocal(ctx, name)
	}
	for attempt := 0; ; attempt++ {
		token := randomHex(12)
		body, err := s.lockBody(token, s.ttl)
		if err != nil {
			return false, fmt.Errorf("lock %q: %w", name, err)
		}
		nctx, cancel := s.nodeCtx(ctx)
		ok, err := s.remote.TryLock(nctx, name, body)
		cancel()
		if err != nil {
			if s.outage(ctx, err) {
				return s.tryLocal(ctx, name)
			}
			return false, fmt.Errorf("lock %q: %w", name, err)
		}
		s.up()
		if ok {
			s.mu.Lock()
			s.held[name] = fleetHeld{token: token}
			delete(s.noRecord, name)
			s.mu.Unlock()
			nctx, cancel := s.nodeCtx(ctx)
			if err := s.remote.Put(nctx, lockRecordKey(name), body); err != nil {
				// Without a record, waiters take the lock over after
				// LockTTL of seeing none: the same bound as an expiry.
				s.log.Warn().Err(err).Str("lock", name).Msg("certificate store: could not write a lock record")
			}
			cancel()
			return true, nil
		}
		if attempt > 0 {
			return false, nil
		}
		stale, holder := s.stale(ctx, name)
		if !stale {
			return false, nil
		}
		s.log.Warn().Str("lock", name).Str("holder", holder).Msg("certificate store: taking over a stale lock (its holder stopped renewing it)")
		nctx, cancel = s.nodeCtx(ctx)
		err = s.remote.Unlock(nctx, name)
		cancel()
		if err != nil {
			s.outage(ctx, err)
			return false, nil
		}
		s.m.takeovers.Inc()
	}
}

// stale reports whether the held lock name was left by a holder that
// died: its record expired, or no record has been seen for LockTTL over
// several looks (a holder dies between taking the lock and writing the
// record, or a record is being replaced, for a moment at most).
func (s *FleetStorage) stale(ctx context.Context, name string) (bool, string) {
	nctx, cancel := s.nodeCtx(ctx)
	rec, ok, err := s.lockRecord(nctx, name)
	cancel()
	if err != nil {
		s.outage(ctx, err)
		return false, ""
	}
	now := time.Now()
	if ok && !rec.Expires.IsZero() {
		s.mu.Lock()
		delete(s.noRecord, name)
		s.mu.Unlock()
		return now.After(rec.Expires), rec.Holder
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	seen, ok := s.noRecord[name]
	if !ok {
		seen.since = now
	}
	seen.looks++
	s.noRecord[name] = seen
	if seen.looks >= 3 && now.Sub(seen.since) > s.ttl {
		delete(s.noRecord, name)
		return true, "(no record)"
	}
	return false, ""
}

func (s *FleetStorage) tryLocal(ctx context.Context, name string) (bool, error) {
	ok, err := s.local.TryLock(ctx, name)
	if ok {
		s.mu.Lock()
		s.held[name] = fleetHeld{local: true}
		s.mu.Unlock()
		s.m.localLocks.Inc()
	}
	return ok, err
}

// Unlock releases the lock for name if this value still holds it; a lock
// that went stale and was taken over is left to its new holder.
func (s *FleetStorage) Unlock(ctx context.Context, name string) error {
	s.mu.Lock()
	h, ok := s.held[name]
	delete(s.held, name)
	s.mu.Unlock()
	defer s.unlocked.release()
	if !ok {
		return fmt.Errorf("unlock %q: not held by this storage", name)
	}
	if h.local {
		return s.local.Unlock(ctx, name)
	}
	nctx, cancel := s.nodeCtx(ctx)
	defer cancel()
	rec, found, err := s.lockRecord(nctx, name)
	if err != nil {
		s.outage(ctx, err)
		return fmt.Errorf("unlock %q: %w", name, err)
	}
	if found && rec.Token != h.token {
		s.log.Warn().Str("lock", name).Str("holder", rec.Holder).Msg("certificate store: a lock this edge held was taken over as stale")
		return nil
	}
	// The record goes first: a waiter that then sees the lock held with no
	// record waits LockTTL before it doubts it.
	if err := s.remote.Delete(nctx, lockRecordKey(name)); err != nil {
		s.outage(ctx, err)
		return fmt.Errorf("unlock %q: %w", name, err)
	}
	if err := s.remote.Unlock(nctx, name); err != nil {
		s.outage(ctx, err)
		return fmt.Errorf("unlock %q: %w", name, err)
	}
	s.up()
	return nil
}

// RenewLockLease extends a lock this value holds to now+lease.
func (s *FleetStorage) RenewLockLease(ctx context.Context, name string, lease time.Duration) error {
	s.mu.Lock()
	h, ok := s.held[name]
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("renew lock %q: not held by this storage", name)
	}
	if h.local {
		return s.local.RenewLockLease(ctx, name, lease)
	}
	nctx, cancel := s.nodeCtx(ctx)
	defer cancel()
	rec, found, err := s.lockRecord(nctx, name)
	if err != nil {
		return s.renewFailed(ctx, name, err)
	}
	if found && rec.Token != h.token {
		return fmt.Errorf("renew lock %q: taken over by %s", name, rec.Holder)
	}
	body, err := s.lockBody(h.token, lease)
	if err != nil {
		return fmt.Errorf("renew lock %q: %w", name, err)
	}
	if err := s.remote.Put(nctx, lockRecordKey(name), body); err != nil {
		return s.renewFailed(ctx, name, err)
	}
	return nil
}

// renewFailed decides what a renewal the node did not take means. An
// outage is not worth failing an issuance attempt for (certmagic would
// abort it): the lock stays held until its last expiry, after which an
// edge that can still reach the node takes it over, as for any stale lock.
func (s *FleetStorage) renewFailed(ctx context.Context, name string, err error) error {
	if s.outage(ctx, err) {
		return nil
	}
	return fmt.Errorf("renew lock %q: %w", name, err)
}

// --- metrics ---

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
	for _, c := range []prometheus.Collector{m.nodeUp, m.pending, m.localReads, m.localLocks, m.takeovers} {
		if err := reg.Register(c); err != nil {
			return fleetMetrics{}, fmt.Errorf("register certificate store metrics: %w", err)
		}
	}
	return m, nil
}
