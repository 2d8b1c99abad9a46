package admission

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// clientShards spreads the client table's lock: every request and every
// connection of a client takes its shard's lock twice.
const clientShards = 64

// clientTable counts, per client address, the connections it holds, its
// requests in flight and, with a rate, its token bucket. An address's entry
// lives while it holds anything or its bucket is not full again, so the
// table is bounded by the connection budget plus the addresses seen within a
// bucket's refill time, and never past maxEntries.
type clientTable struct {
	shards     [clientShards]clientShard
	entries    atomic.Int64
	maxEntries int64
	conns      int32
	requests   int32
	rate       rate.Limit
	burst      int
	now        func() time.Time
}

type clientShard struct {
	mu sync.Mutex
	m  map[netip.Addr]*clientEntry
}

type clientEntry struct {
	key      netip.Addr
	conns    int32 // under the shard's lock
	requests int32
	limiter  *rate.Limiter // nil without a rate
}

func (t *clientTable) init(l Limits, now func() time.Time) {
	t.now = now
	t.conns, t.requests = int32(l.ConnsPerClient), int32(l.RequestsPerClient)
	t.maxEntries = max(int64(4*l.MaxConns), 1024)
	if l.ClientRate > 0 {
		t.rate, t.burst = rate.Limit(l.ClientRate), l.ClientBurst
	}
	for i := range t.shards {
		t.shards[i].m = map[netip.Addr]*clientEntry{}
	}
}

func (t *clientTable) shard(key netip.Addr) *clientShard {
	b := key.As16()
	// FNV-1a over the bytes that vary: the last 8 of an IPv4-mapped
	// address, the first 8 (the /64) of an IPv6 one.
	h := uint32(2166136261)
	from := 8
	if !key.Is4() {
		from = 0
	}
	for _, c := range b[from : from+8] {
		h = (h ^ uint32(c)) * 16777619
	}
	return &t.shards[h%clientShards]
}

// entry returns key's entry, creating it; s.mu is held. A full table makes
// room by forgetting an address that holds nothing (its bucket, if any,
// starts full again): addresses that hold connections or requests are at
// most the budget's worth, far under maxEntries, so an attacker spraying
// addresses cannot fill the table and have new addresses go uncounted. Nil
// only if every entry holds something.
func (t *clientTable) entry(s *clientShard, key netip.Addr) *clientEntry {
	if e := s.m[key]; e != nil {
		return e
	}
	if t.entries.Load() >= t.maxEntries && !t.evictOne(s) {
		return nil
	}
	e := &clientEntry{key: key}
	if t.rate > 0 {
		e.limiter = rate.NewLimiter(t.rate, t.burst)
	}
	s.m[key] = e
	t.entries.Add(1)
	return e
}

// evictOne forgets one address that holds nothing, from s (whose lock is
// held) or, failing that, from another shard whose lock is free.
func (t *clientTable) evictOne(s *clientShard) bool {
	if evictUnused(s, t) {
		return true
	}
	for i := range t.shards {
		o := &t.shards[i]
		if o == s || !o.mu.TryLock() {
			continue
		}
		ok := evictUnused(o, t)
		o.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}

// evictUnused deletes an entry of s that holds nothing; s.mu is held.
func evictUnused(s *clientShard, t *clientTable) bool {
	for k, e := range s.m {
		if e.conns == 0 && e.requests == 0 {
			delete(s.m, k)
			t.entries.Add(-1)
			return true
		}
	}
	return false
}

// dropIfUnused removes e once it holds nothing and its bucket is full;
// s.mu is held.
func (t *clientTable) dropIfUnused(s *clientShard, e *clientEntry, now time.Time) {
	if e.conns > 0 || e.requests > 0 {
		return
	}
	if e.limiter != nil && e.limiter.TokensAt(now) < float64(t.burst) {
		return
	}
	delete(s.m, e.key)
	t.entries.Add(-1)
}

// addConn counts a connection of key's, or reports false when key holds its
// share. A full table counts nothing and refuses nothing (ok, nil entry).
func (t *clientTable) addConn(key netip.Addr) (*clientEntry, bool) {
	s := t.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := t.entry(s, key)
	if e == nil {
		return nil, true
	}
	if e.conns >= t.conns {
		t.dropIfUnused(s, e, t.now())
		return nil, false
	}
	e.conns++
	return e, true
}

func (t *clientTable) releaseConn(e *clientEntry) {
	s := t.shard(e.key)
	s.mu.Lock()
	e.conns--
	t.dropIfUnused(s, e, t.now())
	s.mu.Unlock()
}

// addRequest counts a request of key's in flight, or names the limit it
// would pass.
func (t *clientTable) addRequest(key netip.Addr, now time.Time) (*clientEntry, Refusal) {
	s := t.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := t.entry(s, key)
	if e == nil {
		return nil, Admitted
	}
	if e.requests >= t.requests {
		t.dropIfUnused(s, e, now)
		return nil, RefusedClientRequests
	}
	if e.limiter != nil && !e.limiter.AllowN(now, 1) {
		t.dropIfUnused(s, e, now)
		return nil, RefusedClientRate
	}
	e.requests++
	return e, Admitted
}

// releaseRequest gives a request back. An entry left holding nothing stays
// for sweep to drop while the table is at most half full: a client behind a
// proxy holds no connection entry, and dropping it here would allocate it
// anew for its every request.
func (t *clientTable) releaseRequest(e *clientEntry) {
	s := t.shard(e.key)
	s.mu.Lock()
	e.requests--
	if t.entries.Load() > t.maxEntries/2 {
		t.dropIfUnused(s, e, t.now())
	}
	s.mu.Unlock()
}

// sweep drops the entries that hold nothing and whose buckets are full.
func (t *clientTable) sweep() {
	now := t.now()
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for _, e := range s.m {
			t.dropIfUnused(s, e, now)
		}
		s.mu.Unlock()
	}
}

func (t *clientTable) len() int { return int(t.entries.Load()) }
