package admission

import "time"

// heldAge is how long a request must have been in flight before it may be
// shed as held: longer than a page's requests take, even on a slow
// upstream.
const heldAge = 2 * time.Second

// shedHeld closes the connections of the HTTP/1 requests held longest by
// each application past its fair share (appTable.fairShare), down to it,
// and reports how many it closed. It runs only while the box is
// contended: then those requests hold what the other applications'
// visitors are short of, and they are what moves least, a request that
// never ends against a NAT's browsers that finish one a second. The
// application's limit is its fair share meanwhile, so its queue does not
// take the room back. c.shedMu is held.
func (c *Controller) shedHeld(now time.Time) int {
	p := &c.plan
	if len(p.held) == 0 || !c.contended.Load() {
		return 0
	}
	fair := c.apps.fairShare(false)
	cutoff := now.Add(-heldAge).UnixNano()
	closed := 0
	for _, cd := range p.held {
		t := cd.t
		a := t.request.Load()
		if a == nil || t.since.Load() != cd.since || cd.since > cutoff || a.inFlight.Load()-a.shedding.Load() <= fair {
			continue
		}
		if !t.request.CompareAndSwap(a, nil) {
			continue // released meanwhile
		}
		a.shedding.Add(1)
		c.m.shed.WithLabelValues(shedHeld).Inc()
		t.closeRaw()
		closed++
	}
	return closed
}
