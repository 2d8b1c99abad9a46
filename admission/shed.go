package admission

import (
	"cmp"
	"container/heap"
	"crypto/tls"
	"net"
	"slices"
	"sync"
	"time"
)

// connShards spreads the registry of client connections: a connection
// takes its shard's lock when its server first reports it and when it
// closes, never for a request.
const connShards = 64

// connRegistry holds every client connection a server reported, in lists
// by shard; shedding walks them to find the idle ones. A connection's shard
// is fixed when it is accepted (round robin), so that the add and the
// remove of one connection meet on one lock.
type connRegistry struct {
	shards [connShards]connShard
}

type connShard struct {
	mu         sync.Mutex
	head, tail *trackedConn
	_          [40]byte // its own cache line
}

// add lists t, whose server's connection is outer; a connection closed
// already is not listed.
func (r *connRegistry) add(t *trackedConn, outer net.Conn) {
	s := &r.shards[t.shardIdx]
	s.mu.Lock()
	defer s.mu.Unlock()
	t.outer = outer
	if t.listed || t.closed.Load() {
		return
	}
	t.prev, t.next, t.listed = s.tail, nil, true
	if s.tail != nil {
		s.tail.next = t
	} else {
		s.head = t
	}
	s.tail = t
}

func (r *connRegistry) remove(t *trackedConn) {
	s := &r.shards[t.shardIdx]
	s.mu.Lock()
	defer s.mu.Unlock()
	if !t.listed {
		return
	}
	if t.prev != nil {
		t.prev.next = t.next
	} else {
		s.head = t.next
	}
	if t.next != nil {
		t.next.prev = t.prev
	} else {
		s.tail = t.prev
	}
	t.prev, t.next, t.listed = nil, nil, false
}

// each calls f with every listed connection and its server's connection,
// a shard's lock held at a time.
func (r *connRegistry) each(f func(t *trackedConn, outer net.Conn)) {
	for i := range r.shards {
		s := &r.shards[i]
		s.mu.Lock()
		for t := s.head; t != nil; t = t.next {
			f(t, t.outer)
		}
		s.mu.Unlock()
	}
}

// idleLen counts the connections idle now (and those accepted that have
// sent no request yet).
func (r *connRegistry) idleLen() int {
	n := 0
	r.each(func(t *trackedConn, _ net.Conn) {
		if st := connState(t.state.Load()); st == stateIdle || st == stateNew {
			n++
		}
	})
	return n
}

// candidate is an idle connection shedding may close, as it was when the
// plan was made.
type candidate struct {
	t     *trackedConn
	outer net.Conn
	since int64
}

// shedPlan is the order in which idle connections are closed under
// pressure, guarded by Controller.shedMu:
//
//  1. the connections of client addresses past their share, furthest past
//     first, each address down to its share; among addresses as far past,
//     the connection idle longest first;
//  2. then every other idle connection, idle longest first.
//
// It is made by walking every connection, so it is made at most once a
// tick and when the last one ran out (not more often than planEvery): an
// Accept at the budget takes the next one from it.
type shedPlan struct {
	list  []candidate
	next  int           // list[:next] have been tried
	over  int           // list[:over] are of step 1
	built time.Time     // wall clock: a test's fake clock may stand still
	took  time.Duration // how long making it took
}

// planEvery is how soon a spent plan may be made again: at least this, and
// twenty times what making the last one took, so that a box with a million
// connections spends at most a twentieth of a core walking them while its
// Accept waits for room.
const planEvery = 20 * time.Millisecond

// makePlan lists the connections idle at least minIdleAge at now, in the
// order they are to be shed; c.shedMu is held.
func (c *Controller) makePlan(now time.Time) {
	p := &c.plan
	clear(p.list)
	p.list, p.next, p.over, p.built = p.list[:0], 0, 0, time.Now()
	defer func() { p.took = time.Since(p.built) }()
	cutoff := now.Add(-minIdleAge).UnixNano()
	c.conns.each(func(t *trackedConn, outer net.Conn) {
		if cd, ok := idleCandidate(t, outer, cutoff); ok {
			p.list = append(p.list, cd)
		}
	})
	slices.SortFunc(p.list, func(a, b candidate) int { return cmp.Compare(a.since, b.since) })

	// Step 1: each address past its share, as a queue of its
	// connections (oldest first), served furthest past first.
	byAddr := map[*clientEntry]*addrQueue{}
	var h addrHeap
	for i, cd := range p.list {
		e := cd.t.client
		if e == nil {
			continue
		}
		q := byAddr[e]
		if q == nil {
			q = &addrQueue{over: c.clients.overShare(e)}
			byAddr[e] = q
			if q.over > 0 {
				h = append(h, q)
			}
		}
		if q.over > 0 {
			q.idx = append(q.idx, i)
		}
	}
	if len(h) == 0 {
		return
	}
	for _, q := range h {
		q.since = p.list[q.idx[0]].since
	}
	heap.Init(&h)
	first := make([]candidate, 0, len(p.list))
	taken := make([]bool, len(p.list))
	for h.Len() > 0 {
		q := h[0]
		i := q.idx[q.pos]
		first = append(first, p.list[i])
		taken[i] = true
		q.pos++
		q.over--
		if q.over == 0 || q.pos == len(q.idx) {
			heap.Pop(&h)
			continue
		}
		q.since = p.list[q.idx[q.pos]].since
		heap.Fix(&h, 0)
	}
	p.over = len(first)
	for i, cd := range p.list {
		if !taken[i] {
			first = append(first, cd)
		}
	}
	p.list = first
}

// idleCandidate reports whether t may be shed, idle since cutoff or
// before, as a candidate. Bytes arriving rule out an HTTP/1 connection
// only (tryShed): an HTTP/2 one receives frames while idle, and a GOAWAY
// is graceful anyway.
func idleCandidate(t *trackedConn, outer net.Conn, cutoff int64) (candidate, bool) {
	st := connState(t.state.Load())
	if st != stateIdle && st != stateNew {
		return candidate{}, false
	}
	since := t.since.Load()
	if since > cutoff || t.goingAway.Load() || t.closed.Load() {
		return candidate{}, false
	}
	return candidate{t: t, outer: outer, since: since}, true
}

// addrQueue is one address past its share in makePlan: its idle
// connections (indices into the plan, oldest first), the next to take, how
// many more it may lose, and how long its next one has been idle.
type addrQueue struct {
	idx   []int
	pos   int
	over  int
	since int64
}

// addrHeap orders the addresses furthest past their share first, then the
// one whose next connection has been idle longest.
type addrHeap []*addrQueue

func (h addrHeap) Len() int { return len(h) }
func (h addrHeap) Less(i, j int) bool {
	if h[i].over != h[j].over {
		return h[i].over > h[j].over
	}
	return h[i].since < h[j].since
}
func (h addrHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *addrHeap) Push(x any)   { *h = append(*h, x.(*addrQueue)) }
func (h *addrHeap) Pop() any {
	old := *h
	q := old[len(old)-1]
	*h = old[:len(old)-1]
	return q
}

// shedNext closes the next connection of the plan still idle as planned
// and idle at least age at now, making a new plan once if this one ran
// out; it reports whether it shed one. c.shedMu is held.
func (c *Controller) shedNext(now time.Time, age time.Duration) bool {
	for range 2 {
		p := &c.plan
		for p.next < len(p.list) {
			cd := p.list[p.next]
			p.next++
			if c.tryShed(cd, now, age) {
				return true
			}
		}
		if time.Since(p.built) < max(planEvery, 20*p.took) {
			return false
		}
		c.makePlan(now)
	}
	return false
}

// shedOver closes every connection of the plan's first step still idle as
// planned: the addresses past their share, down to it. c.shedMu is held.
func (c *Controller) shedOver(now time.Time) {
	p := &c.plan
	for _, cd := range p.list[:p.over] {
		c.tryShed(cd, now, minIdleAge)
	}
	p.next = max(p.next, p.over)
}

// shedIdleLongerThan closes every connection of the plan idle at least d
// at now, those tried before included (one whose headers were arriving
// may be past d). c.shedMu is held.
func (c *Controller) shedIdleLongerThan(now time.Time, d time.Duration) {
	for _, cd := range c.plan.list {
		c.tryShed(cd, now, d)
	}
}

// tryShed sheds cd's connection if it is still idle as planned, for at
// least age at now, and reports whether it did.
func (c *Controller) tryShed(cd candidate, now time.Time, age time.Duration) bool {
	t := cd.t
	if _, ok := idleCandidate(t, cd.outer, now.Add(-age).UnixNano()); !ok || t.since.Load() != cd.since {
		return false
	}
	// Only a connection past its handshake can be asked its protocol
	// without waiting on the handshake's lock.
	if tc, ok := cd.outer.(*tls.Conn); ok && t.isIdle() && tc.ConnectionState().NegotiatedProtocol == "h2" {
		// A GOAWAY is graceful whatever arrives meanwhile (a PING, a
		// stream its client opened first).
		if !t.goingAway.CompareAndSwap(false, true) {
			return false
		}
		c.shed(t, cd.outer, true)
		return true
	}
	if t.arriving.Load() && age < pressureIdleTimeout {
		// A handshake or a request is on its way: not idle. Unless it has
		// been on its way for the whole short idle timeout while the box
		// is under pressure: headers that slow are an attack (slowloris)
		// more often than a visitor, and --read-header-timeout is long.
		return false
	}
	c.shed(t, cd.outer, false)
	return true
}
