package admission

import (
	"cmp"
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

func oldestFirst(a, b candidate) int { return cmp.Compare(a.since, b.since) }

// shedPlan is the order in which connections are closed under pressure,
// guarded by Controller.shedMu. Idle connections (list), to bring the
// count under the low-water mark and to make room at the budget:
//
//  1. the connections of client addresses past their share, furthest past
//     first, each address down to its share; among addresses as far past,
//     the connection idle longest first;
//  2. then every other idle connection, idle longest first.
//
// Slow first requests (slow), only to make room at the budget, one for
// each connection accepted, between steps 1 and 2: connections whose
// first request's headers (or TLS handshake) have been arriving for
// slowAge or more: those of client addresses at or past their share
// first, each address's oldest first and as many as take it under its
// share, then the rest, oldest first. They are never closed to bring the
// count down: a slowloris reconnects at once, so that would only churn.
//
// It is made by walking every connection, so it is made only when needed
// and never more often than planEvery allows: by Accept at the budget
// when the last one ran out, and by the monitor once a monitorPlanEvery,
// or at its next tick when the last walk paid for itself
// (monitorMayPlan).
type shedPlan struct {
	list     []candidate
	next     int // list[:next] have been tried
	over     int // list[:over] are of step 1
	slow     []candidate
	slowNext int                  // slow[:slowNext] have been tried
	slowBy   map[*clientEntry]int // how many of slow are each address's
	built    time.Time            // wall clock: a test's fake clock may stand still
	took     time.Duration        // how long making it took
	walked   int                  // how many connections it walked
	slowRest []candidate          // scratch space for ordering slow
	held     []candidate          // HTTP/1 requests in flight heldAge or more, oldest first
}

// planEvery is how soon a spent plan may be made again: at least this, and
// twenty times what making the last one took, so that a box with a million
// connections spends at most a twentieth of a core walking them while its
// Accept waits for room.
const planEvery = 20 * time.Millisecond

// planStale reports whether the plan may be made again (planEvery);
// c.shedMu is held.
func (c *Controller) planStale() bool {
	p := &c.plan
	return time.Since(p.built) >= max(planEvery, 20*p.took)
}

// makePlan lists the connections idle at least minIdleAge at now, in the
// order they are to be shed, the slow first requests and the held
// requests; c.shedMu is held.
func (c *Controller) makePlan(now time.Time) {
	p := &c.plan
	p.forget()
	p.walked, p.built = 0, time.Now()
	defer func() { p.took = time.Since(p.built) }()
	cutoff := now.Add(-minIdleAge).UnixNano()
	slowCutoff := now.Add(-slowAge).UnixNano()
	heldCutoff := now.Add(-heldAge).UnixNano()
	c.conns.each(func(t *trackedConn, outer net.Conn) {
		p.walked++
		if t.request.Load() != nil {
			if since := t.since.Load(); since <= heldCutoff {
				p.held = append(p.held, candidate{t: t, outer: outer, since: since})
			}
			return
		}
		cd, ok := idleCandidate(t, outer, cutoff)
		switch {
		case !ok:
		case connState(t.state.Load()) == stateNew && t.arriving.Load():
			if cd.since <= slowCutoff {
				p.slow = append(p.slow, cd)
			}
		default:
			p.list = append(p.list, cd)
		}
	})
	slices.SortFunc(p.list, oldestFirst)
	slices.SortFunc(p.held, oldestFirst)
	slices.SortFunc(p.slow, oldestFirst)
	if len(p.slow) > 0 {
		c.orderSlow()
	}

	// Step 1: an address n past its share gives its n oldest idle
	// connections, ranked n, n-1, …, 1 (how far past it still is as each
	// goes): by rank, the addresses furthest past lose theirs first, each
	// down to its share, and among equal ranks the oldest go first.
	left := map[*clientEntry]int{}
	var over []ranked
	rest := p.list[:0] // filtered in place
	for _, cd := range p.list {
		if n := countDown(left, cd.t.client, c.clients.overShare); n > 0 {
			over = append(over, ranked{cd, n})
		} else {
			rest = append(rest, cd)
		}
	}
	slices.SortStableFunc(over, func(a, b ranked) int { return cmp.Compare(b.rank, a.rank) })
	copy(p.list[len(over):], rest)
	for i, r := range over {
		p.list[i] = r.cd
	}
	p.over = len(over)
}

// ranked is a connection of makePlan's step 1, and how far past its share
// its address still is as it goes.
type ranked struct {
	cd   candidate
	rank int
}

// orderSlow puts first the plan's slow first requests that go first
// (shedPlan; a visitor's address is seldom at its share), in a stable
// partition in place: the rest wait in slowRest (kept from one plan to the
// next, so that a plan of a million slow first requests leaves nothing to
// the collector) and follow. c.shedMu is held.
func (c *Controller) orderSlow() {
	p := &c.plan
	if p.slowBy == nil {
		p.slowBy = map[*clientEntry]int{}
	}
	left := map[*clientEntry]int{}
	atShare := func(e *clientEntry) int { return c.clients.overShare(e) + 1 }
	first, rest := 0, p.slowRest[:0]
	for _, cd := range p.slow {
		if e := cd.t.client; e != nil {
			p.slowBy[e]++
		}
		if countDown(left, cd.t.client, atShare) > 0 {
			p.slow[first] = cd
			first++
		} else {
			rest = append(rest, cd)
		}
	}
	copy(p.slow[first:], rest)
	p.slowRest = emptied(rest)
}

// countDown returns how many of e's connections, this one included, are
// still to go first: quota(e) at the first of e's that it is asked about,
// one less at each next (0 or less: none; 0 for no address).
func countDown(left map[*clientEntry]int, e *clientEntry, quota func(*clientEntry) int) int {
	if e == nil {
		return 0
	}
	n, seen := left[e]
	if !seen {
		n = quota(e)
	}
	left[e] = n - 1
	return n
}

// emptied returns s cleared and at length 0: its array is kept for reuse,
// holding on to nothing.
// forget empties the plan, keeping its arrays for the next one: the
// connections it listed, closed since most of them, are not kept from the
// collector.
func (p *shedPlan) forget() {
	p.list, p.slow, p.held = emptied(p.list), emptied(p.slow), emptied(p.held)
	p.next, p.over, p.slowNext = 0, 0, 0
	clear(p.slowBy)
}

func emptied[S ~[]E, E any](s S) S {
	clear(s)
	return s[:0]
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

// shedNextIdle closes the next connection of list[:end] of the plan still
// idle as planned, and reports whether it shed one. c.shedMu is held.
func (c *Controller) shedNextIdle(now time.Time, end int) bool {
	p := &c.plan
	for p.next < end {
		p.next++
		if c.tryShed(p.list[p.next-1], now, minIdleAge) {
			return true
		}
	}
	return false
}

// planYield is how many connections a walk may visit for each idle one it
// finds and still be worth repeating at the monitor's next tick.
const planYield = 64

// monitorMayPlan reports whether the monitor may remake the plan, as
// planStale allows: once a monitorPlanEvery, or sooner when the last walk
// found an idle connection for every planYield it visited. A walk that
// finds little is not worth repeating before then: under a slowloris at
// the budget nothing is idle, and remade at every tick the plan took a
// fifth of the edge's CPU for the attack. One that finds many is: idle
// connections arriving faster than a plan a second closes them would
// otherwise take the box to the budget, where Accept makes room by
// closing slow first requests. c.shedMu is held.
func (c *Controller) monitorMayPlan() bool {
	p := &c.plan
	due := time.Since(p.built) >= monitorPlanEvery || len(p.list)*planYield >= max(p.walked, 1)
	return due && c.planStale()
}

// shedRoom closes one connection to make room for a new one at the
// budget, in shedPlan's order: an idle one of an address past its share,
// else a slow first request (as fast as c.slowShed allows), else any idle
// one; it makes a new plan once if this one ran out. newcomer is the new
// connection's address (nil for none). For a request's upstream leg
// (forRequest) it neither makes a plan nor closes a slow first request:
// the overdraft covers a leg, and the slowloris's reconnection, not the
// request, would take the room. It reports whether it closed one; if not,
// when the rate of slow first requests allows the next (0: none waits for
// it), and whether the newcomer is to be refused rather than wait.
//
// A newcomer of a slowloris's address (slowly) is refused unless it can
// take the room of a slow first request of an address that holds more
// connections than its own (nextSlowFor), with the rate allowing one now;
// it never takes an idle connection but of an address past its share. A
// slowloris reconnects the moment one of its connections is closed, and at
// the budget that reconnection would otherwise take the room of another
// of its slow first requests, or of a visitor's idle connection, whose
// reconnection would take the next: a close and an accept at a time, for
// nobody. c.shedMu is held.
func (c *Controller) shedRoom(now time.Time, forRequest bool, newcomer *clientEntry) (shed bool, wait time.Duration, refuse bool) {
	p := &c.plan
	for range 2 {
		if c.shedNextIdle(now, p.over) {
			return true, 0, false
		}
		if !forRequest && p.slowly(newcomer) {
			for p.slowNext < len(p.slow) && c.slowShed.TokensAt(now) >= 1 && p.nextSlowFor(newcomer) {
				if c.shedNextSlow(now) {
					return true, 0, false
				}
			}
			// Nothing else is its to take, and it does not wait for room:
			// waiting, it would hold every visitor's connection up behind
			// it in the backlog.
			if !c.planStale() {
				return false, 0, true
			}
			c.makePlan(now)
			continue
		}
		for !forRequest && p.slowNext < len(p.slow) {
			if tokens := c.slowShed.TokensAt(now); tokens < 1 {
				wait = time.Duration((1 - tokens) / float64(c.slowShed.Limit()) * float64(time.Second))
				break
			}
			if c.shedNextSlow(now) {
				return true, 0, false
			}
		}
		if c.shedNextIdle(now, len(p.list)) {
			return true, 0, false
		}
		if wait > 0 || forRequest || !c.planStale() {
			return false, wait, false
		}
		c.makePlan(now)
	}
	return false, wait, !forRequest && p.slowly(newcomer)
}

// slowly reports whether newcomer's address is a slowloris's as the plan
// saw it: two or more of its other connections, and more than half of
// them, were slow first requests. A visitor with one slow handshake, or a
// NAT with a few among thousands, is not.
func (p *shedPlan) slowly(newcomer *clientEntry) bool {
	if newcomer == nil {
		return false
	}
	slow := p.slowBy[newcomer]
	return slow >= 2 && slow > (newcomer.conns()-1)/2
}

// slowLookAhead bounds how far past the next slow first request
// nextSlowFor looks for one a slowloris's newcomer may take.
const slowLookAhead = 64

// nextSlowFor moves to slow[slowNext] the first of the next slowLookAhead
// slow first requests of an address that holds more connections than
// newcomer's does with the new one, and reports whether there is one (one
// of no address, a proxy's, always qualifies): room a slowloris takes
// evens addresses out and stops there.
func (p *shedPlan) nextSlowFor(newcomer *clientEntry) bool {
	n := newcomer.conns()
	end := min(len(p.slow), p.slowNext+slowLookAhead)
	for i := p.slowNext; i < end; i++ {
		if e := p.slow[i].t.client; e == nil || e.conns() > n {
			p.slow[p.slowNext], p.slow[i] = p.slow[i], p.slow[p.slowNext]
			return true
		}
	}
	return false
}

// shedNextSlow closes the plan's next slow first request if it is still
// on its first request, its headers arriving, counts it against the rate
// (c.slowShed), and reports whether it closed it. c.shedMu is held.
func (c *Controller) shedNextSlow(now time.Time) bool {
	p := &c.plan
	cd := p.slow[p.slowNext]
	p.slowNext++
	t := cd.t
	if connState(t.state.Load()) != stateNew || !t.arriving.Load() || t.closed.Load() ||
		t.since.Load() != cd.since || cd.since > now.Add(-slowAge).UnixNano() {
		return false
	}
	c.m.shed.WithLabelValues(shedSlow).Inc()
	c.shedSlow.Add(1)
	t.Close()
	c.slowShed.AllowN(now, 1)
	return true
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
	if t.arriving.Load() && (age < pressureIdleTimeout || connState(t.state.Load()) == stateNew) {
		// A handshake or a request is on its way: not idle. Unless a
		// keep-alive connection's next request has been on its way for
		// the whole short idle timeout while the box is under pressure:
		// headers that slow are an attack more often than a visitor, and
		// --read-header-timeout is long. A first request that slow is
		// room for a new connection at the budget only (tryShedSlow):
		// closed in bulk, a slowloris's connections would all come back
		// at once.
		return false
	}
	c.shed(t, cd.outer, false)
	return true
}
