package admission

import (
	"context"
	"time"
)

// Run samples memory and sheds under pressure until ctx ends.
func (c *Controller) Run(ctx context.Context) {
	if c == nil {
		return
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	sweep := 0
	for {
		select {
		case <-ctx.Done():
			c.refused.releaseAll()
			return
		case <-t.C:
			c.refused.release(c.clock.Now())
			c.sampleMemory()
			c.headTurns(c.clock.Now())
			if sweep%4 == 0 { // every second
				c.expireHeads(c.clock.Now())
			}
			if sweep++; sweep%20 == 0 { // every 5s
				c.clients.sweep()
				c.apps.prune()
			}
		case <-c.wake:
		}
		c.step()
		c.apps.grantAll()
	}
}

// sampleMemory moves the memory high-water state.
func (c *Controller) sampleMemory() {
	limit := c.limits.MemoryLimit
	if limit <= 0 {
		return
	}
	use := float64(c.memUse())
	switch {
	case !c.memHigh.Load() && use >= memHighWater*float64(limit):
		c.memHigh.Store(true)
		c.contended.Store(true)
	case c.memHigh.Load() && use < memLowWater*float64(limit):
		c.memHigh.Store(false)
	}
}

// step starts or ends an episode of pressure and, during one, sheds in
// the plan's order, down to the low-water mark.
func (c *Controller) step() {
	budget := float64(c.limits.MaxConns)
	// Those sent a GOAWAY are as good as closed.
	pressed := func() bool {
		return float64(c.inUse()-c.draining.Load()) >= lowWater*budget || c.memHigh.Load() || c.paused.Load()
	}
	if c.contended.Load() && !pressed() && float64(c.inUse()+c.quicConns.Load()-c.draining.Load()) < lowWater*budget {
		c.contended.Store(false)
	}
	used := c.inUse()
	now := c.clock.Now()
	c.episodeMu.Lock()
	ep := c.episode
	c.episodeMu.Unlock()
	if !ep.active {
		reason := ""
		switch {
		case c.paused.Load():
			reason = "connection limit reached: not accepting"
		case float64(used) >= highWater*budget:
			reason = "connections past the high-water mark"
		case c.memHigh.Load():
			reason = "memory past the high-water mark"
		}
		if reason == "" {
			return
		}
		ep = episode{active: true, started: now, reason: reason, peak: used, shedAtStart: c.shedIdle.Load(), slowAtStart: c.shedSlow.Load(), heldAtStart: c.shedHeldN.Load()}
		c.m.pressure.Set(1)
		c.m.episodes.Inc()
		msg := "overload: closing idle connections (client addresses furthest past their share first, then oldest first), idle timeout " +
			pressureIdleTimeout.String() + ", client addresses held to their share until it is over"
		if c.memHigh.Load() {
			msg += "; new requests get 503 while memory is past its high-water mark"
		}
		c.log.Warn().Str("reason", reason).Int64("conns", used).Int("max_conns", c.limits.MaxConns).
			Bool("memory_high", c.memHigh.Load()).Int("idle_conns", c.conns.idleLen()).Msg(msg)
	}
	// One shedder at a time (Accept and Admit make room too), or two
	// would close a connection more than needed.
	c.shedMu.Lock()
	if pressed() {
		// Once a tick, not at every wake: each connection accepted past
		// the high-water mark wakes the monitor.
		if wall := time.Now(); c.closeIdleUpstreams != nil && wall.Sub(c.upstreamsClosed) >= tick {
			c.upstreamsClosed = wall
			c.closeIdleUpstreams(upstreamIdleUnderPressure)
		}
		if c.monitorMayPlan() {
			c.makePlan(now)
		}
	}
	// Held requests go first (docs/design.md, admission table).
	c.setLevel(pressed())
	c.shedHeld()
	for float64(c.inUse()-c.draining.Load()) >= lowWater*budget {
		if !c.shedNextIdle(now, len(c.plan.list)) {
			break
		}
	}
	// While the pressure lasts, the addresses past their share lose their
	// idle connections down to it, and the short idle timeout holds; not
	// while the episode waits out calmFor: by then every connection idle
	// since the start would be past it.
	if p := &c.plan; pressed() {
		for _, cd := range p.list[:p.over] {
			c.tryShed(cd, now, minIdleAge)
		}
		p.next = max(p.next, p.over)
		// Those tried before too: one whose headers were arriving may be
		// past the timeout.
		for _, cd := range p.list {
			c.tryShed(cd, now, pressureIdleTimeout)
		}
	}
	c.shedMu.Unlock()
	used = c.inUse()
	ep.peak = max(ep.peak, used)
	switch {
	case pressed():
		ep.calm = time.Time{}
	case ep.calm.IsZero():
		ep.calm = now
	case now.Sub(ep.calm) >= calmFor:
		c.m.pressure.Set(0)
		c.apps.level.Store(0)
		c.shedMu.Lock()
		c.plan.forget()
		c.shedMu.Unlock()
		c.log.Info().Dur("lasted", now.Sub(ep.started)).Int64("idle_closed", c.shedIdle.Load()-ep.shedAtStart).
			Int64("slow_headers_closed", c.shedSlow.Load()-ep.slowAtStart).Int64("held_requests_closed", c.shedHeldN.Load()-ep.heldAtStart).Int64("peak_conns", ep.peak).
			Int64("conns", used).Msg("overload over: idle timeout back to normal, client shares no longer bind")
		ep = episode{}
	}
	c.episodeMu.Lock()
	c.episode = ep
	c.episodeMu.Unlock()
}
