package admission

import "time"

// The held-request rule: docs/design.md, admission table.
const heldAge = 2 * time.Second // longer than a page's requests take

// setLevel sets the most requests one application may hold (fairLevel).
// Set once a tick while pressed, it holds until the episode ends, calm
// included, so that an application shed down to it does not take the room
// back the moment the count dips.
func (c *Controller) setLevel(pressed bool) {
	if wall := time.Now(); pressed && wall.Sub(c.levelSet) >= tick {
		c.levelSet = wall
		capacity := int64(lowWater * float64(c.limits.MaxConns))
		c.apps.level.Store(c.apps.fairLevel(capacity, c.inUse()-c.draining.Load(), wall))
	}
}

// shedHeld closes the connections of the HTTP/1 requests held longest by
// each application past the level, down to it; once a tick at most, as
// the plan it walks is remade about once a second. c.shedMu is held.
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
		// Held heldAge when the plan was made; older now unless a new
		// request took its place.
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
			// A handler writing a body upstream never reads the closed
			// connection: its context ends it. One waiting for its answer
			// sees it at backhaul's tickReader's next tick (within 8 s):
			// until then its slot is held, counted in shedding so that it
			// is not cut twice.
			(*cancel)()
		}
		t.Close()
	}
}
