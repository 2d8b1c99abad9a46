package admission

import (
	"time"
)

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

// tryShedSlow closes cd's connection if it is still on its first request,
// its headers arriving, and reports whether it did.
func (c *Controller) tryShedSlow(cd candidate, now time.Time) bool {
	t := cd.t
	if connState(t.state.Load()) != stateNew || !t.arriving.Load() || t.closed.Load() || t.since.Load() != cd.since ||
		cd.since > now.Add(-slowAge).UnixNano() {
		return false
	}
	c.m.shed.WithLabelValues(shedSlow).Inc()
	c.shedSlow.Add(1)
	t.closeRaw()
	return true
}
