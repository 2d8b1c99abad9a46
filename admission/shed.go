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
// takes its shard's lock when it is listed and when it closes, never for a
// request.
const connShards = 64

// connRegistry lists every client connection a server reported, for
// shedding to walk. A connection's shard is fixed at accept (round robin).
type connRegistry struct {
	shards [connShards]connShard
}

type connShard struct {
	mu         sync.Mutex
	head, tail *trackedConn
	_          [40]byte // its own cache line
}

// add lists t, whose server's connection is outer, unless it is closed.
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

// idleLen counts the connections idle or new now.
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

// shedPlan is the order in which connections are closed under pressure
// (docs/design.md, admission table), guarded by Controller.shedMu: the idle
// connections (list: step 1, those of addresses past their share, then the
// rest), the slow first requests (slow, tried between the two steps, for
// room at the budget only) and the held requests. It walks every
// connection, so it is made only when needed: by Accept at the budget when
// the last one ran out (planStale), by the monitor when monitorMayPlan.
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

// planStale reports whether the plan may be made again; c.shedMu is held.
func (c *Controller) planStale() bool {
	p := &c.plan
	return time.Since(p.built) >= max(planEvery, 20*p.took)
}

// makePlan makes the plan at now; c.shedMu is held.
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
	type ranked struct {
		cd   candidate
		rank int
	}
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

// orderSlow puts first the slow first requests of addresses at or past
// their share, each address's oldest and as many as take it under it, in
// a stable partition in place: the rest wait in slowRest (kept from plan
// to plan, so that a million slow first requests leave nothing to the
// collector) and follow. c.shedMu is held.
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

// forget empties the plan, keeping its arrays for the next one but not the
// connections it listed, closed since most of them, from the collector.
func (p *shedPlan) forget() {
	p.list, p.slow, p.held = emptied(p.list), emptied(p.slow), emptied(p.held)
	p.next, p.over, p.slowNext = 0, 0, 0
	clear(p.slowBy)
}

// emptied returns s cleared, at length 0.
func emptied[S ~[]E, E any](s S) S {
	clear(s)
	return s[:0]
}

// idleCandidate reports whether t may be shed, idle since cutoff or
// before, as a candidate. Bytes arriving rule out an HTTP/1 connection
// only, in tryShed: an HTTP/2 one receives frames while idle.
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
// found an idle connection for every planYield it visited. Under a
// slowloris at the budget nothing is idle, and a plan remade every tick
// took a fifth of the edge's CPU; but idle connections arriving faster
// than a plan a second closes them would take the box to the budget.
// c.shedMu is held.
func (c *Controller) monitorMayPlan() bool {
	p := &c.plan
	due := time.Since(p.built) >= monitorPlanEvery || len(p.list)*planYield >= max(p.walked, 1)
	return due && c.planStale()
}

// shedRoom closes one connection to make room for a new one at the
// budget, in the plan's order, as fast as c.slowShed allows slow first
// requests; it makes a new plan once if this one ran out. newcomer is the
// new connection's address (nil for none). For a request's upstream leg
// (forRequest) it neither makes a plan nor closes a slow first request:
// the overdraft covers a leg, and a slowloris's reconnection would take
// the room. It reports whether it closed one; if not, when the rate allows
// the next (0: none waits for it), and whether the newcomer is to be
// refused rather than wait, as a slowloris's is (slowly; docs/design.md,
// admission table) unless it may take room (nextSlowFor, step 1). c.shedMu
// is held.
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
			// Nothing else is its to take, and waiting it would hold up
			// every visitor's connection behind it in the backlog.
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

// slowly reports whether newcomer's address is a slowloris's, as the plan
// saw its other connections.
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
// slow first requests of an address (or of none, a proxy's) that holds
// more connections than newcomer's does with the new one, and reports
// whether there is one.
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

// shedNextSlow closes the plan's next slow first request if it still is
// one, counting it against c.slowShed. c.shedMu is held.
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

// tryShed sheds cd's connection if it is still idle as planned, for at
// least age at now, and reports whether it did: it closes t, the TCP
// connection, never outer, as a TLS close_notify could wait on a client
// that does not read; an h2 one is sent a GOAWAY instead.
func (c *Controller) tryShed(cd candidate, now time.Time, age time.Duration) bool {
	t := cd.t
	if _, ok := idleCandidate(t, cd.outer, now.Add(-age).UnixNano()); !ok || t.since.Load() != cd.since {
		return false
	}
	// Only a connection past its handshake (idle) can be asked its
	// protocol without waiting on the handshake's lock. A GOAWAY is
	// graceful whatever arrives meanwhile.
	tc, ok := cd.outer.(*tls.Conn)
	h2 := ok && t.isIdle() && tc.ConnectionState().NegotiatedProtocol == "h2"
	if h2 && !t.goingAway.CompareAndSwap(false, true) {
		return false
	}
	if !h2 && t.arriving.Load() &&
		(age < pressureIdleTimeout || connState(t.state.Load()) == stateNew) {
		// A handshake or a request is on its way: not idle, unless a
		// keep-alive's next request has been on its way for the whole
		// pressureIdleTimeout. A first request that slow is room at the
		// budget only (slow).
		return false
	}
	c.m.shed.WithLabelValues(shedIdle).Inc()
	c.shedIdle.Add(1)
	if !h2 {
		t.Close()
		return true
	}
	t.draining.Store(true) // until it closes
	c.draining.Add(1)
	go c.goAway(t, cd.outer)
	return true
}
