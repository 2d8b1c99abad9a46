package admission

import (
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/time/rate"

	"github.com/scafo/scafo-edge/internal/clock"
)

// Water marks of the connection budget: pressure starts when the
// connections in use reach highWater of MaxConns and ends below lowWater;
// the gap keeps a box near its limit from starting an episode a second.
const (
	highWater = 0.90
	lowWater  = 0.80
	// memHighWater and memLowWater are the same for memory in use (live
	// heap and stacks), as shares of Limits.MemoryLimit. Past three
	// quarters live, the collector has too little room left to keep up
	// (Go's own limit is set at 90 % of a cgroup's).
	memHighWater = 0.75
	memLowWater  = 0.65
	// minIdleAge spares a connection idle for less than this from shedding:
	// a keep-alive connection between two requests of a page, or a new one
	// whose first request is on its way.
	minIdleAge = 250 * time.Millisecond
	// pressureIdleTimeout is the idle timeout under pressure: every
	// connection idle longer is closed, whatever the water marks say.
	pressureIdleTimeout = 5 * time.Second
	// slowAge is how long a connection may take over its first request's
	// headers (its TLS handshake included) before, at the budget, it may
	// be closed to make room for a new connection: a visitor's take a
	// round trip or two, a slowloris's the whole --read-header-timeout.
	slowAge = time.Second
	// slowShedDivisor: at the budget, slow first requests are closed for
	// room at most MaxConns/slowShedDivisor a second (at least
	// minSlowShedRate). A slowloris reconnects as soon as one of its
	// connections is closed and takes the room back: without a bound,
	// each of its connections past the budget would cycle through accept
	// and close as fast as the box can, and the edge's CPU would go to
	// that churn instead of to its visitors.
	slowShedDivisor = 16
	minSlowShedRate = 64
	// goAwayGrace is how long an HTTP/2 connection sent a GOAWAY has to
	// finish a stream its client started before it read the GOAWAY; past
	// it, an idle one is closed.
	goAwayGrace = time.Second
	// upstreamIdleUnderPressure: under pressure, the monitor closes the
	// pooled upstream connections idle at least this long, once a tick,
	// and so does Accept at the budget with no client connection to close.
	upstreamIdleUnderPressure = time.Second
	// monitorPlanEvery is how often, at most, the monitor remakes the
	// shedding plan under pressure.
	monitorPlanEvery = time.Second
	// tick is how often the controller samples memory and, under
	// pressure, looks for idle connections to close.
	tick = 250 * time.Millisecond
	// calmFor is how long connections and memory must stay under their
	// low-water marks before an episode ends: a flood that comes in waves
	// is one episode, logged once, not one a second.
	calmFor = 5 * time.Second
)

// Options configure a Controller.
type Options struct {
	// Limits are the derived limits (Derive); every field but the rate and
	// MemoryLimit must be set.
	Limits Limits
	// Proxies are the peers whose connections carry many clients: PROXY
	// protocol senders and trusted proxies. Their connections count against
	// the budget but not as one client address's.
	Proxies []netip.Prefix
	// TrustedProxies are the proxies whose X-Forwarded-For is believed (as
	// backhaul believes it): for their requests the client is the address
	// it names after the last trusted proxy. A request straight from
	// another of Proxies (a PROXY protocol sender that sent no header) is
	// not counted per address.
	TrustedProxies []netip.Prefix
	// Log receives one line when an episode of pressure starts and one when
	// it ends, and one per refusal kind per minute. The zero value logs
	// nothing.
	Log zerolog.Logger
	// Registerer receives the package's metrics. Nil: no metrics.
	Registerer prometheus.Registerer
	// Clock is where connection ages and rate limits read the time. Nil:
	// the wall clock.
	Clock clock.Clock
	// CloseIdleUpstreams, if non-nil, closes the idle pooled connections to
	// upstreams idle for at least idleFor (0: all): under pressure they
	// are given up before any client's.
	CloseIdleUpstreams func(idleFor time.Duration)
	// MemoryInUse reports the memory the edge's work holds, in bytes. Nil:
	// the live heap and the goroutine stacks, from the Go runtime.
	MemoryInUse func() int64
}

// Controller enforces Limits. Its methods are safe for concurrent use; a
// nil *Controller admits everything.
type Controller struct {
	limits  Limits
	proxies []netip.Prefix
	trusted []netip.Prefix
	log     zerolog.Logger
	clock   clock.Clock
	memUse  func() int64
	m       *metrics

	clientConns   atomic.Int64 // TCP, each a descriptor
	upstreamConns atomic.Int64
	quicConns     atomic.Int64 // HTTP/3: memory, no descriptor
	draining      atomic.Int64 // connections sent a GOAWAY, closing soon
	shedIdle      atomic.Int64 // idle connections shed, ever
	shedSlow      atomic.Int64 // slow first requests closed for room, ever

	// Accept waits for room on room, closed and replaced whenever a
	// connection closes while waiting > 0.
	roomMu  sync.Mutex
	room    chan struct{}
	waiting atomic.Int32
	paused  atomic.Bool // an Accept waits for room now

	// heads are the listeners' connections whose first request head is
	// awaited outside the server (heads.go).
	headsMu sync.Mutex
	heads   []*headWait

	conns   connRegistry
	connSeq atomic.Uint32 // spreads connections over the registry's shards
	clients clientTable
	apps    appTable
	admin   adminPool
	refused refusedHold

	memHigh atomic.Bool
	// contended is set when connections pass the high-water mark, memory
	// its own, or Accept waits for room, and cleared once the connections
	// are back under the low-water mark, memory under its own and Accept
	// not waiting: while it is set, a client address past its share is
	// refused new connections and requests.
	contended atomic.Bool
	wake      chan struct{}

	// shedMu serialises shedding and guards plan; closeIdleUpstreams is
	// Options.CloseIdleUpstreams. slowShed bounds how fast slow first
	// requests are closed for room (slowShedDivisor).
	shedMu             sync.Mutex
	plan               shedPlan
	closeIdleUpstreams func(idleFor time.Duration)
	upstreamsClosed    time.Time // wall clock, when step last closed them
	slowShed           *rate.Limiter

	// episode is the monitor's; Snapshot reads it under episodeMu.
	episodeMu sync.Mutex
	episode   episode
}

// episode is one stretch of pressure, from its start to its end.
type episode struct {
	active      bool
	started     time.Time
	reason      string
	shedAtStart int64     // c.shedIdle when it started
	slowAtStart int64     // c.shedSlow when it started
	peak        int64     // most connections in use
	calm        time.Time // since when it has been under the low-water marks; zero: not
}

// New returns a Controller enforcing opts.Limits, or the error registering
// its metrics. Run must be running for shedding and memory checks.
func New(opts Options) (*Controller, error) {
	if err := opts.Limits.validate(); err != nil {
		return nil, err
	}
	if opts.Limits.MaxConns < 1 {
		return nil, errors.New("admission: MaxConns must be set")
	}
	c := &Controller{
		limits:  opts.Limits,
		proxies: opts.Proxies,
		trusted: opts.TrustedProxies,
		log:     opts.Log,
		clock:   clock.OrReal(opts.Clock),
		memUse:  opts.MemoryInUse,
		wake:    make(chan struct{}, 1),

		closeIdleUpstreams: opts.CloseIdleUpstreams,
	}
	if c.memUse == nil {
		c.memUse = goMemoryInUse
	}
	slowRate := max(opts.Limits.MaxConns/slowShedDivisor, minSlowShedRate)
	c.slowShed = rate.NewLimiter(rate.Limit(slowRate), max(slowRate/4, 1))
	c.clients.init(opts.Limits, c.clock.Now)
	c.apps.init(opts.Limits)
	c.apps.contended = &c.contended
	if c.limits.AdminConns == 0 {
		c.limits.AdminConns = minAdminConns
	}
	c.admin.init(c.limits, c)
	c.refused.max = heldFor(opts.Limits)
	var err error
	if c.m, err = newMetrics(opts.Registerer, c); err != nil {
		return nil, err
	}
	c.apps.m = c.m
	return c, nil
}

// inUse is the traffic descriptors held now: client and upstream
// connections.
func (c *Controller) inUse() int64 { return c.clientConns.Load() + c.upstreamConns.Load() }

// poke wakes the monitor without waiting for its tick.
func (c *Controller) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// opened notes a new connection; past the high-water mark the box is
// contended, and it wakes the monitor to shed idle ones.
func (c *Controller) opened() {
	if float64(c.inUse()+c.quicConns.Load()) >= highWater*float64(c.limits.MaxConns) {
		if !c.contended.Load() {
			c.contended.Store(true)
		}
		c.poke()
	}
}

// released wakes every Accept waiting for room.
func (c *Controller) released() {
	if c.waiting.Load() == 0 {
		return
	}
	c.roomMu.Lock()
	if c.room != nil {
		close(c.room)
		c.room = nil
	}
	c.roomMu.Unlock()
}

// awaitRoom returns true once one more connection, of newcomer's address
// (nil: counted by no address), fits in MaxConns, or once done is closed;
// false when it is to be refused: a slowloris's connection at the budget
// with no room its to take (shedRoom). While it waits, with this one
// connection accepted, the listener accepts no other: new connections stay
// in the kernel's backlog rather than being accepted and reset.
func (c *Controller) awaitRoom(done <-chan struct{}, newcomer *clientEntry) bool {
	max := int64(c.limits.MaxConns)
	for c.inUse() >= max && !isDone(done) {
		// Make room at once where an idle connection or a slow first
		// request can give it: a listener that waits lets its backlog
		// fill, and a visitor's connection waits behind every one queued
		// there, or is dropped with it.
		ok, retry, refuse := c.makeRoom(newcomer)
		if ok {
			break
		}
		if refuse {
			if c.waiting.Load() == 0 {
				c.paused.Store(false)
			}
			return false
		}
		c.roomMu.Lock()
		if c.room == nil {
			c.room = make(chan struct{})
		}
		room := c.room
		c.waiting.Add(1)
		c.roomMu.Unlock()
		// Checked again after registering: a connection that closed in
		// between saw no waiter and woke nobody.
		if c.inUse() < max {
			c.waiting.Add(-1)
			break
		}
		if c.paused.CompareAndSwap(false, true) {
			c.m.acceptPauses.Inc()
		}
		c.contended.Store(true)
		c.poke()
		// Room comes from a connection that closes, from the rate of
		// slow first requests closed allowing the next (retry, on the
		// controller's clock), or from a connection becoming old enough
		// to close: look again after a tick, as the monitor does.
		var rateC <-chan time.Time
		var rateT clock.Timer
		if retry > 0 {
			rateT = c.clock.NewTimer(retry)
			rateC = rateT.C()
		}
		relook := time.NewTimer(tick)
		select {
		case <-room:
		case <-rateC:
		case <-relook.C:
		case <-done:
		}
		relook.Stop()
		if rateT != nil {
			rateT.Stop()
		}
		if n := c.waiting.Add(-1); isDone(done) {
			if n == 0 {
				c.paused.Store(false)
			}
			return true
		}
	}
	if c.waiting.Load() == 0 {
		c.paused.Store(false)
	}
	return true
}

// makeRoom reports whether a descriptor is free, closing a connection to
// free one if the budget is spent (shedRoom says which, for a connection
// of newcomer's address), or, with none to close, the upstream ones idle
// for upstreamIdleUnderPressure (those the traffic reuses would only be
// dialled again). If it is not, retry is when the rate of slow first
// requests closed allows the next (0: none waits for it), and refuse says
// that the newcomer is to be refused rather than wait (shedRoom).
func (c *Controller) makeRoom(newcomer *clientEntry) (ok bool, retry time.Duration, refuse bool) {
	max := int64(c.limits.MaxConns)
	c.shedMu.Lock()
	defer c.shedMu.Unlock()
	if c.inUse() < max {
		return true, 0, false
	}
	now := c.clock.Now()
	shed, wait, refuse := c.shedRoom(now, false, newcomer)
	if !shed && !refuse && c.closeIdleUpstreams != nil {
		c.closeIdleUpstreams(upstreamIdleUnderPressure)
	}
	if c.inUse() < max {
		return true, 0, false
	}
	return false, wait, refuse
}

// isDone reports whether done is closed.
func isDone(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// roomForRequest reports whether a descriptor is free for a request's
// upstream within MaxConns and the overdraft, closing an idle connection of
// the plan to free one if the budget is spent, as makeRoom does but without
// waiting: not for another shedder, nor to make a new plan, which walks
// every connection. A request is on its client's time; the overdraft
// covers it meanwhile. The idle upstream connections are closed only past
// the overdraft, the last thing before the request is refused: at the
// budget the request most likely reuses one of them, and closing them
// would have it, and every request after it, dial its upstream again.
func (c *Controller) roomForRequest() bool {
	max := int64(c.limits.MaxConns)
	limit := max + int64(c.limits.Overdraft)
	if !c.shedMu.TryLock() {
		return c.inUse() < limit
	}
	defer c.shedMu.Unlock()
	if c.inUse() < max {
		return true
	}
	if shed, _, _ := c.shedRoom(c.clock.Now(), true, nil); !shed && c.inUse() >= limit && c.closeIdleUpstreams != nil {
		c.closeIdleUpstreams(0)
	}
	return c.inUse() < limit
}
