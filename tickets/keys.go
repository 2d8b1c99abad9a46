package tickets

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/internal/clock"
)

// Defaults for zero Options fields (see the package doc).
const (
	DefaultRotate = 12 * time.Hour
	DefaultRetain = 36 * time.Hour
	DefaultLead   = 30 * time.Minute
	DefaultSync   = 10 * time.Minute
)

// StoreKey is where a fleet's session ticket keys live in its store.
const StoreKey = "scafo-edge/session-ticket-keys.json"

// lockName is the store lock an edge holds while it rotates the fleet's
// keys.
const lockName = "session-ticket-keys"

// syncTimeout bounds one read, and rotation, of the store's keys: the
// lock may be held by an edge that is rotating, which takes a read and a
// write. startTimeout bounds the first, which start-up waits for: an edge
// whose node is down serves with keys of its own rather than late.
const (
	syncTimeout  = 30 * time.Second
	startTimeout = 5 * time.Second
)

// Store is where a fleet keeps its keys: a certmagic.Storage (the fleet
// certificate store) is one. Load returns an error matching fs.ErrNotExist
// for a key never stored; Lock waits for the named lock until ctx ends.
type Store interface {
	Load(ctx context.Context, key string) ([]byte, error)
	Store(ctx context.Context, key string, value []byte) error
	Lock(ctx context.Context, name string) error
	Unlock(ctx context.Context, name string) error
}

// Options configures Keys. The zero value is an edge on its own with the
// default schedule.
type Options struct {
	// Store shares the keys with the fleet's other edges; nil keeps them
	// in this process and its successors only.
	Store Store
	// Inherited is what the edge this one replaces returned from Export;
	// nil or unreadable (logged) starts afresh.
	Inherited []byte
	// Rotate, Retain, Lead and Sync are the schedule; zero means the
	// defaults above. Lead must exceed Sync for every edge of a fleet to
	// read a key before it encrypts.
	Rotate, Retain, Lead, Sync time.Duration
	// Log receives store failures and recoveries, each once; the zero
	// value logs nothing.
	Log zerolog.Logger
	// Registerer receives scafo_edge_tls_tickets_presented_total; nil
	// registers nothing.
	Registerer prometheus.Registerer
	// Clock is the time source; nil is the wall clock.
	Clock clock.Clock
}

// Keys are the session ticket keys of one edge. Its methods are safe for
// concurrent use.
type Keys struct {
	t     timing
	sync  time.Duration
	store Store
	log   zerolog.Logger
	clock clock.Clock
	m     metrics

	// ring holds the keys as crypto/tls uses them, the encrypting one
	// first: a handshake's whole cost here is one atomic load.
	ring atomic.Pointer[tls.Config]

	mu       sync.Mutex
	own      schedule  // the schedule encrypted by: the store's, or this edge's
	accepted []key     // decrypt only: keys held before adopting the store's
	nextSync time.Time // with a store
	storeErr error     // the last sync's failure, logged once

	cancel context.CancelFunc
	done   chan struct{}
}

// handed is what Export writes: the schedule and the keys accepted only.
type handed struct {
	schedule
	Accepted []key `json:"accepted,omitempty"`
}

// New starts the keys: the inherited ones if any, then, with a store, the
// fleet's (read before New returns, within startTimeout), else keys of its
// own. It rotates them until Close. The error is the metrics'
// registration's; nothing is started then.
func New(o Options) (*Keys, error) {
	m, err := newMetrics(o.Registerer)
	if err != nil {
		return nil, err
	}
	k := &Keys{
		m:     m,
		t:     timing{rotate: o.Rotate, retain: o.Retain, lead: o.Lead},
		sync:  o.Sync,
		store: o.Store,
		log:   o.Log,
		clock: clock.OrReal(o.Clock),
		done:  make(chan struct{}),
	}
	if k.t.rotate <= 0 {
		k.t.rotate = DefaultRotate
	}
	if k.t.retain <= 0 {
		k.t.retain = DefaultRetain
	}
	if k.t.lead <= 0 {
		k.t.lead = DefaultLead
	}
	if k.sync <= 0 {
		k.sync = DefaultSync
	}
	if o.Inherited != nil {
		h, err := parseHanded(o.Inherited)
		if err != nil {
			k.log.Warn().Err(err).Msg("session ticket keys: the previous edge's are unreadable; starting with new ones (returning visitors pay a full handshake once)")
		}
		k.own, k.accepted = h.schedule, h.Accepted
	}
	ctx, cancel := context.WithCancel(context.Background())
	k.cancel = cancel
	k.tick(ctx, startTimeout)
	go k.run(ctx)
	return k, nil
}

// Configure makes cfg encrypt and decrypt session tickets with these keys,
// through its WrapSession and UnwrapSession hooks: a clone of cfg (which
// http.Server and quic-go make) follows rotations too.
func (k *Keys) Configure(cfg *tls.Config) {
	cfg.WrapSession = func(cs tls.ConnectionState, ss *tls.SessionState) ([]byte, error) {
		return k.ring.Load().EncryptTicket(cs, ss)
	}
	cfg.UnwrapSession = func(identity []byte, cs tls.ConnectionState) (*tls.SessionState, error) {
		ss, err := k.ring.Load().DecryptTicket(identity, cs)
		if ss != nil {
			k.m.known.Inc()
		} else {
			k.m.unknown.Inc()
		}
		return ss, err
	}
}

// Export returns the keys for the edge that replaces this one (Options.
// Inherited). It is a secret: it travels over the handover socket only.
func (k *Keys) Export() []byte {
	k.mu.Lock()
	defer k.mu.Unlock()
	b, _ := json.Marshal(handed{schedule: k.own, Accepted: k.accepted}) // cannot fail
	return b
}

// Close stops rotating; the keys keep working for the handshakes that
// still come.
func (k *Keys) Close() {
	k.cancel()
	<-k.done
}

func (k *Keys) run(ctx context.Context) {
	defer close(k.done)
	for {
		wait := k.untilNext(k.clock.Now())
		t := k.clock.NewTimer(wait)
		select {
		case <-t.C():
			k.tick(ctx, syncTimeout)
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

// untilNext is how long the keys stay as they are from now.
func (k *Keys) untilNext(now time.Time) time.Duration {
	k.mu.Lock()
	defer k.mu.Unlock()
	at := k.own.next(now, k.t)
	for _, a := range k.accepted {
		if e := a.From.Add(k.t.retain); e.After(now) && (at.IsZero() || e.Before(at)) {
			at = e
		}
	}
	if k.store != nil && (at.IsZero() || k.nextSync.Before(at)) {
		at = k.nextSync
	}
	if at.IsZero() {
		return k.t.rotate
	}
	return max(at.Sub(now), time.Millisecond)
}

// tick brings the keys to the present: the fleet's when a sync is due (or
// a rotation is, which the fleet's edges do through the store), this
// edge's own otherwise, then hands them to crypto/tls.
func (k *Keys) tick(ctx context.Context, timeout time.Duration) {
	now := k.clock.Now()
	k.mu.Lock()
	syncing := k.store != nil && (!now.Before(k.nextSync) || k.own.due(now, k.t))
	k.mu.Unlock()
	if syncing {
		sctx, cancel := context.WithTimeout(ctx, timeout)
		s, err := k.fromStore(sctx, now)
		cancel()
		k.mu.Lock()
		k.nextSync = now.Add(k.sync)
		k.synced(s, err)
		k.mu.Unlock()
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.store == nil || k.storeErr != nil {
		// On its own, or cut off from the fleet: forward secrecy does
		// not wait for the store.
		k.own, _ = k.own.rotated(now, k.t)
	}
	k.accepted = slices.DeleteFunc(k.accepted, func(a key) bool { return expired(a, now, k.t) || k.own.has(a.Secret) })
	k.publish(now)
}

// synced adopts the store's schedule s, or notes err; k.mu is held.
func (k *Keys) synced(s schedule, err error) {
	if err != nil {
		if k.storeErr == nil {
			k.log.Warn().Err(err).Msg("session ticket keys: the fleet's are unreadable; rotating this edge's own until they are (its tickets resume on this edge only meanwhile)")
		}
		k.storeErr = err
		return
	}
	if k.storeErr != nil {
		k.log.Info().Msg("session ticket keys: the fleet's are readable again; adopted them")
		k.storeErr = nil
	}
	for _, own := range k.own.Keys {
		if !s.has(own.Secret) && !slices.ContainsFunc(k.accepted, func(a key) bool { return string(a.Secret) == string(own.Secret) }) {
			k.accepted = append(k.accepted, own)
		}
	}
	if len(k.accepted) > maxKeys { // the newest appended last
		k.accepted = k.accepted[len(k.accepted)-maxKeys:]
	}
	k.own = s
}

// fromStore reads the fleet's schedule at now and, when a rotation is
// due, rotates it under the store's lock.
func (k *Keys) fromStore(ctx context.Context, now time.Time) (schedule, error) {
	s, err := k.load(ctx)
	if err != nil || !s.due(now, k.t) {
		return s, err
	}
	if err := k.store.Lock(ctx, lockName); err != nil {
		return schedule{}, fmt.Errorf("lock session ticket keys: %w", err)
	}
	defer k.store.Unlock(context.WithoutCancel(ctx), lockName)
	// Another edge may have rotated while this one waited for the lock.
	if s, err = k.load(ctx); err != nil {
		return s, err
	}
	next, changed := s.rotated(now, k.t)
	if changed {
		if err := k.store.Store(ctx, StoreKey, next.marshal()); err != nil {
			return schedule{}, fmt.Errorf("store session ticket keys: %w", err)
		}
	}
	return next, nil
}

func (k *Keys) load(ctx context.Context) (schedule, error) {
	b, err := k.store.Load(ctx, StoreKey)
	if errors.Is(err, fs.ErrNotExist) {
		return schedule{}, nil
	}
	if err != nil {
		return schedule{}, fmt.Errorf("load session ticket keys: %w", err)
	}
	return parseSchedule(b)
}

// publish hands the keys to crypto/tls, the encrypting one first; k.mu is
// held. Expired keys are left out even between rotations.
func (k *Keys) publish(now time.Time) {
	var secrets [][32]byte
	add := func(ks []key) {
		for _, a := range ks {
			if !expired(a, now, k.t) {
				secrets = append(secrets, [32]byte(a.Secret))
			}
		}
	}
	if len(k.own.Keys) > 0 {
		i := k.own.active(now)
		secrets = append(secrets, [32]byte(k.own.Keys[i].Secret))
		add(k.own.Keys[:i])
		add(k.own.Keys[i+1:])
	}
	add(k.accepted)
	cfg := &tls.Config{}
	if len(secrets) == 0 {
		// No keys yet: never after New, which makes or reads some.
		cfg.SessionTicketsDisabled = true
	} else {
		cfg.SetSessionTicketKeys(secrets)
	}
	k.ring.Store(cfg)
}

func parseHanded(b []byte) (handed, error) {
	var h handed
	if err := json.Unmarshal(b, &h); err != nil {
		return handed{}, fmt.Errorf("decode handed-over session ticket keys: %w", err)
	}
	s, err := parseSchedule(h.schedule.marshal())
	if err != nil {
		return handed{}, err
	}
	acc, err := parseSchedule(schedule{Keys: h.Accepted}.marshal())
	if err != nil {
		return handed{}, err
	}
	return handed{schedule: s, Accepted: acc.Keys}, nil
}
