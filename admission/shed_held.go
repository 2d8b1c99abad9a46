package admission

import "time"

// heldAge is how long a request must have been in flight before it may be
// shed as held: longer than a page's requests take, even on a slow
// upstream.
const heldAge = 2 * time.Second

// setLevel sets, during an episode of pressure, the most requests one
// application may hold: its fair part of the descriptors under the
// low-water mark (appTable.fairLevel). Set once a tick while pressed, it
// holds until the episode ends, calm included, so that an application
// shed down to it does not take the room back the moment the count dips.
func (c *Controller) setLevel(pressed bool) {
	if wall := time.Now(); pressed && wall.Sub(c.levelSet) >= tick {
		c.levelSet = wall
		capacity := int64(lowWater * float64(c.limits.MaxConns))
		c.apps.level.Store(c.apps.fairLevel(capacity, c.inUse()-c.draining.Load(), wall))
	}
}

// shedHeld closes the connections of the HTTP/1 requests held longest by
// each application past the level (setLevel), down to it. Those requests
// hold what the other applications' visitors are short of, and they move
// least: a request that never ends, against a NAT's browsers that finish
// one a second. Once a tick at most: the plan it walks is remade about
// once a second. c.shedMu is held.
func (c *Controller) shedHeld() {
	p := &c.plan
	level, wall := c.apps.level.Load(), time.Now()
	if level == 0 || len(p.held) == 0 || wall.Sub(c.heldShed) < tick {
		return
	}
	c.heldShed = wall
	for i, cd := range p.held {
		t := cd.t
		if t == nil {
			continue
		}
		a := t.request.Load()
		if a == nil || t.closed.Load() || connState(t.state.Load()) == stateGone {
			p.held[i] = candidate{} // released, hijacked or closed: not again
			continue
		}
		// Listed held heldAge at least when the plan was made, it is older
		// now unless a new request took its place.
		if t.since.Load() != cd.since || a.inFlight.Load()-a.shedding.Load() <= level {
			continue
		}
		if !t.request.CompareAndSwap(a, nil) {
			continue // released meanwhile
		}
		// Its Release finds no request noted and takes this back.
		a.shedding.Add(1)
		if t.since.Load() != cd.since {
			continue // a new request, admitted as this one was released
		}
		c.m.shed.WithLabelValues(shedHeld).Inc()
		c.shedHeldN.Add(1)
		if cancel := t.cancel.Load(); cancel != nil {
			// A handler blocked writing a body to its upstream never reads
			// the closed connection: its context ends it. A handler waiting
			// for its answer sees it at its upstream reader's next tick
			// (backhaul's tickReader: within 8 s, as when a client leaves);
			// until then the upstream descriptor and the slot stay held,
			// counted in shedding so that nothing is cut twice.
			(*cancel)()
		}
		t.Close()
	}
}
