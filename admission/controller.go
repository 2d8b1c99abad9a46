package admission

import (
	"cmp"
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

// The rules these bound, and why: docs/design.md, admission table.
const (
	// The gaps between the water marks keep a box near its limit from
	// starting an episode a second.
	highWater    = 0.90
	lowWater     = 0.80
	memHighWater = 0.75
	memLowWater  = 0.65

	minIdleAge                = 250 * time.Millisecond
	pressureIdleTimeout       = 5 * time.Second
	slowAge                   = time.Second // a TLS handshake included
	slowShedDivisor           = 16
	minSlowShedRate           = 64
	goAwayGrace               = time.Second
	upstreamIdleUnderPressure = time.Second
	// monitorPlanEvery is how often, at most, the monitor remakes the
	// shedding plan under pressure (monitorMayPlan).
	monitorPlanEvery = time.Second
	tick             = 250 * time.Millisecond // the monitor's
	// calmFor: a flood that comes in waves is one episode, logged once.
	calmFor = 5 * time.Second
)

// Options configure a Controller.
type Options struct {
	// Limits are the derived limits (Derive); every field but the rate and
	// MemoryLimit must be set.
	Limits Limits
	// Proxies are the peers whose connections carry many clients (PROXY
	// protocol senders and trusted proxies): counted against the budget,
	// but not as one client address's.
	Proxies []netip.Prefix
	// TrustedProxies are the proxies whose X-Forwarded-For is believed (as
	// backhaul believes it): their requests are counted by the address it
	// names after the last trusted proxy.
	TrustedProxies []netip.Prefix
	// Log receives a line when an episode of pressure starts and ends, and
	// one per refusal kind a minute.
	Log        zerolog.Logger
	Registerer prometheus.Registerer // nil: no metrics
	Clock      clock.Clock           // for connection ages and rates; nil: the wall clock
	// CloseIdleUpstreams, if non-nil, closes the pooled connections to
	// upstreams idle for at least idleFor (0: all).
	CloseIdleUpstreams func(idleFor time.Duration)
	// MemoryInUse reports the memory the edge's work holds, in bytes. Nil:
	// the live heap and the goroutine stacks.
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
	shedHeldN     atomic.Int64 // held requests shed, ever

	// Accept waits on room, closed and replaced when a connection closes
	// while waiting > 0.
	roomMu  sync.Mutex
	room    chan struct{}
	waiting atomic.Int32
	paused  atomic.Bool // an Accept waits for room now

	// The listeners' first heads awaited (heads.go). A slice of heads once
	// read is never written: appends go past its end, removals copy.
	headsMu sync.Mutex
	heads   []*headWait

	conns   connRegistry
	connSeq atomic.Uint32 // spreads connections over the registry's shards
	clients clientTable
	apps    appTable
	admin   adminPool
	refused refusedHold

	memHigh   atomic.Bool
	contended atomic.Bool // "pressure" in docs/design.md: the shares bind
	wake      chan struct{}

	// shedMu serialises shedding and guards plan and upstreamsClosed.
	shedMu             sync.Mutex
	plan               shedPlan
	closeIdleUpstreams func(idleFor time.Duration)
	upstreamsClosed    time.Time     // wall clock
	levelSet, heldShed time.Time     // wall clock: setLevel, shedHeld
	slowShed           *rate.Limiter // slowShedDivisor

	episodeMu sync.Mutex
	episode   episode // the monitor's
}

// episode is one stretch of pressure, for the log and the status page.
type episode struct {
	active      bool
	started     time.Time
	reason      string
	shedAtStart int64     // c.shedIdle when it started
	slowAtStart int64     // c.shedSlow when it started
	heldAtStart int64     // c.shedHeldN when it started
	peak        int64     // most connections in use
	calm        time.Time // since when it has been under the low-water marks; zero: not
}

// New returns a Controller enforcing opts.Limits. Run must be running for
// shedding and memory checks.
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
	c.limits.AdminConns = cmp.Or(c.limits.AdminConns, minAdminConns)
	c.admin.init(c.limits, c)
	c.refused.max = heldFor(opts.Limits)
	var err error
	if c.m, err = newMetrics(opts.Registerer, c); err != nil {
		return nil, err
	}
	c.apps.m = c.m
	return c, nil
}

func (c *Controller) inUse() int64 { return c.clientConns.Load() + c.upstreamConns.Load() }

// MemoryShort reports whether the edge's memory is past its high-water
// mark, for work that may wait or be skipped until it is not (compressing
// a response holds an encoder's window). A nil Controller is never short.
func (c *Controller) MemoryShort() bool {
	return c != nil && c.memHigh.Load()
}

func (c *Controller) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// opened notes a new connection; past the high-water mark the box is
// contended, and the monitor is woken.
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
// false when it is to be refused rather than wait (shedRoom).
func (c *Controller) awaitRoom(done <-chan struct{}, newcomer *clientEntry) bool {
	defer func() {
		if c.waiting.Load() == 0 {
			c.paused.Store(false)
		}
	}()
	max := int64(c.limits.MaxConns)
	for c.inUse() >= max && !isDone(done) {
		// Room is made at once where it can be: while a listener waits, a
		// visitor's connection waits behind its whole backlog, or is
		// dropped with it.
		ok, retry, refuse := c.makeRoom(newcomer)
		if ok {
			break
		}
		if refuse {
			return false
		}
		c.roomMu.Lock()
		if c.room == nil {
			c.room = make(chan struct{})
		}
		room := c.room
		c.waiting.Add(1)
		c.roomMu.Unlock()
		// Checked again once registered: a connection that closed in
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
		// Room comes from a connection that closes, the slow-shed rate
		// allowing the next (retry, on the controller's clock), or a
		// connection growing old enough to close (a tick).
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
		c.waiting.Add(-1)
	}
	return true
}

// makeRoom reports whether a descriptor is free, closing a connection to
// free one if the budget is spent (shedRoom), or, with none to close, the
// idle pooled upstream ones. If not, retry and refuse are shedRoom's.
func (c *Controller) makeRoom(newcomer *clientEntry) (ok bool, retry time.Duration, refuse bool) {
	max := int64(c.limits.MaxConns)
	c.shedMu.Lock()
	defer c.shedMu.Unlock()
	if c.inUse() < max {
		return true, 0, false
	}
	shed, wait, refuse := c.shedRoom(c.clock.Now(), false, newcomer)
	if !shed && !refuse && c.closeIdleUpstreams != nil {
		c.closeIdleUpstreams(upstreamIdleUnderPressure)
	}
	if c.inUse() < max {
		return true, 0, false
	}
	return false, wait, refuse
}

func isDone(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// roomForRequest reports whether a descriptor is free for a request's
// upstream within MaxConns and the overdraft, as makeRoom does but without
// waiting for another shedder or making a plan, which walks every
// connection: a request is on its client's time, and the overdraft covers
// it meanwhile. Idle upstream connections are closed only past the
// overdraft: at the budget the request most likely reuses one.
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
