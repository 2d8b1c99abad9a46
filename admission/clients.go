package admission

import (
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// clientShards spreads the client table's map: a request reads its
// address's shard under a read lock, so requests of different addresses
// share no lock.
const clientShards = 256

// clientTable counts, per client address, the connections it holds, its
// requests in flight and, with a rate, its token bucket. An address's entry
// lives while it holds anything or its bucket is not full again, and the
// table never grows past maxEntries.
type clientTable struct {
	shards     [clientShards]clientShard
	entries    atomic.Int64
	maxEntries int64
	conns      uint32
	requests   uint32
	rate       rate.Limit
	burst      int
	now        func() time.Time
}

type clientShard struct {
	mu sync.RWMutex
	m  map[netip.Addr]*clientEntry
	_  [64 - 32]byte // its own cache line
}

// An entry's counts are one word, changed by compare-and-swap: the
// connections in the high half, the requests in flight in the low 31 bits,
// and a bit that says the entry left the table (a count taken on it would
// be lost: take it on the entry that replaced it).
const (
	connUnit    = 1 << 32
	requestUnit = 1
	requestMask = 1<<31 - 1
	deadBit     = 1 << 31
)

type clientEntry struct {
	key     netip.Addr
	word    atomic.Uint64
	limiter *rate.Limiter // nil without a rate
}

func (e *clientEntry) conns() int { return int(e.word.Load() >> 32) }

func (t *clientTable) init(l Limits, now func() time.Time) {
	t.now = now
	t.conns, t.requests = uint32(l.ConnsPerClient), uint32(l.RequestsPerClient)
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

// entry returns key's entry, creating it. A full table makes room by
// forgetting an address that holds nothing (its bucket starts full again):
// those that hold something are at most the budget's worth, far under
// maxEntries, so an attacker spraying addresses cannot fill the table and
// have new addresses go uncounted. Nil only if every entry holds something.
func (t *clientTable) entry(key netip.Addr) *clientEntry {
	s := t.shard(key)
	s.mu.RLock()
	e := s.m[key]
	s.mu.RUnlock()
	if e != nil {
		return e
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.m[key]; e != nil {
		return e
	}
	if t.entries.Load() >= t.maxEntries && !t.evictOne(s) {
		return nil
	}
	e = &clientEntry{key: key}
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
	if t.evictUnused(s) {
		return true
	}
	for i := range t.shards {
		o := &t.shards[i]
		if o == s || !o.mu.TryLock() {
			continue
		}
		ok := t.evictUnused(o)
		o.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}

// evictUnused deletes an entry of s that holds nothing; s.mu is held.
func (t *clientTable) evictUnused(s *clientShard) bool {
	for _, e := range s.m {
		if t.retire(s, e) {
			return true
		}
	}
	return false
}

// retire takes e out of the table if it holds nothing; s.mu is held.
func (t *clientTable) retire(s *clientShard, e *clientEntry) bool {
	if !e.word.CompareAndSwap(0, deadBit) {
		return false
	}
	delete(s.m, e.key)
	t.entries.Add(-1)
	return true
}

// unused reports whether e holds nothing and its bucket is full.
func (t *clientTable) unused(e *clientEntry, now time.Time) bool {
	return e.word.Load() == 0 && (e.limiter == nil || e.limiter.TokensAt(now) >= float64(t.burst))
}

// dropIfUnused takes e out of the table if it is unused.
func (t *clientTable) dropIfUnused(e *clientEntry, now time.Time) {
	if !t.unused(e, now) {
		return
	}
	s := t.shard(e.key)
	s.mu.Lock()
	if s.m[e.key] == e {
		t.retire(s, e)
	}
	s.mu.Unlock()
}

// take counts one unit (connUnit or requestUnit) on key's entry, or
// reports false when contended and key already holds limit of them. A full
// table counts nothing and refuses nothing (ok, nil entry).
func (t *clientTable) take(key netip.Addr, unit uint64, limit uint32, contended bool) (*clientEntry, bool) {
	for {
		e := t.entry(key)
		if e == nil {
			return nil, true
		}
		for {
			w := e.word.Load()
			if w&deadBit != 0 {
				break // it left the table: take it on its successor
			}
			n := uint32(w >> 32)
			if unit == requestUnit {
				n = uint32(w & requestMask)
			}
			if contended && n >= limit {
				return nil, false
			}
			if e.word.CompareAndSwap(w, w+unit) {
				return e, true
			}
		}
	}
}

func (t *clientTable) releaseConn(e *clientEntry) {
	if e.word.Add(^uint64(connUnit-1)) == 0 {
		t.dropIfUnused(e, t.now())
	}
}

// overShare is how many connections e holds past its share (negative:
// under it).
func (t *clientTable) overShare(e *clientEntry) int { return e.conns() - int(t.conns) }

// addRequest counts a request of key's in flight, or names the limit it
// would pass: its share when contended, its rate at any time.
func (t *clientTable) addRequest(key netip.Addr, now time.Time, contended bool) (*clientEntry, Refusal) {
	e, ok := t.take(key, requestUnit, t.requests, contended)
	if !ok {
		return nil, RefusedClientRequests
	}
	if e != nil && e.limiter != nil && !e.limiter.AllowN(now, 1) {
		e.word.Add(^uint64(requestUnit - 1))
		return nil, RefusedClientRate
	}
	return e, Admitted
}

// releaseRequest gives a request back. An entry left holding nothing stays
// for sweep while the table is at most half full: a client behind a proxy
// holds no connection, and dropping it here would allocate it anew for its
// every request.
func (t *clientTable) releaseRequest(e *clientEntry) {
	if e.word.Add(^uint64(requestUnit-1)) == 0 && t.entries.Load() > t.maxEntries/2 {
		t.dropIfUnused(e, t.now())
	}
}

// sweep drops the entries that hold nothing and whose buckets are full.
func (t *clientTable) sweep() {
	now := t.now()
	for i := range t.shards {
		s := &t.shards[i]
		s.mu.Lock()
		for _, e := range s.m {
			if t.unused(e, now) {
				t.retire(s, e)
			}
		}
		s.mu.Unlock()
	}
}

func (t *clientTable) len() int { return int(t.entries.Load()) }
