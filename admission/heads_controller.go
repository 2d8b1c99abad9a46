package admission

import (
	"time"
)

// addHeadWait notes h, for the monitor to expire its connections and the
// metrics to count them, until removeHeadWait.
func (c *Controller) addHeadWait(h *headWait) {
	c.headsMu.Lock()
	c.heads = append(c.heads, h)
	c.headsMu.Unlock()
}

func (c *Controller) removeHeadWait(h *headWait) {
	c.headsMu.Lock()
	defer c.headsMu.Unlock()
	for i, x := range c.heads {
		if x == h {
			c.heads = append(c.heads[:i:i], c.heads[i+1:]...)
			return
		}
	}
}

// expireHeads closes every listener's connections whose head waited past
// its deadline.
func (c *Controller) expireHeads(now time.Time) {
	for _, h := range c.headWaits() {
		h.expire(now)
	}
}

// headTurns looks at every listener's paced heads whose turn has come.
func (c *Controller) headTurns(now time.Time) {
	for _, h := range c.headWaits() {
		h.takeTurns(now)
	}
}

func (c *Controller) headWaits() []*headWait {
	c.headsMu.Lock()
	defer c.headsMu.Unlock()
	return c.heads
}

// waitingHeads counts the connections whose first head is awaited.
func (c *Controller) waitingHeads() int {
	c.headsMu.Lock()
	hs := c.heads
	c.headsMu.Unlock()
	n := 0
	for _, h := range hs {
		n += h.count()
	}
	return n
}
