package admission

import (
	"net"
	"sync"
	"time"
)

// refuseHold: docs/design.md, admission table. A held connection is
// unread: it wakes no goroutine whatever it sends.
const refuseHold = time.Second

// refusedHold keeps refused connections until their hold is over, at most
// max of them (heldFor).
type refusedHold struct {
	mu    sync.Mutex
	conns []heldConn // in the order they were refused, which their holds end in
	max   int
}

type heldConn struct {
	conn  net.Conn
	until time.Time
}

// heldFor is how many refused connections may be held at once.
func heldFor(l Limits) int { return min(max(l.Overdraft/2, 16), 1024) }

// hold keeps conn until now+refuseHold, or closes it at once when full.
func (h *refusedHold) hold(conn net.Conn, now time.Time) {
	h.mu.Lock()
	expired := h.takeExpired(now)
	full := len(h.conns) >= h.max
	if !full {
		h.conns = append(h.conns, heldConn{conn: conn, until: now.Add(refuseHold)})
	}
	h.mu.Unlock()
	closeAll(expired)
	if full {
		conn.Close()
	}
}

// release closes the connections whose hold is over at now.
func (h *refusedHold) release(now time.Time) {
	h.mu.Lock()
	expired := h.takeExpired(now)
	h.mu.Unlock()
	closeAll(expired)
}

func (h *refusedHold) releaseAll() {
	h.mu.Lock()
	held := h.conns
	h.conns = nil
	h.mu.Unlock()
	closeAll(held)
}

func (h *refusedHold) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.conns)
}

// takeExpired removes and returns the holds over at now; h.mu is held. The
// FIFO moves along its array, which append replaces once it is spent:
// nothing is copied at every call.
func (h *refusedHold) takeExpired(now time.Time) []heldConn {
	i := 0
	for i < len(h.conns) && !h.conns[i].until.After(now) {
		i++
	}
	expired := h.conns[:i:i]
	h.conns = h.conns[i:]
	return expired
}

// closeAll closes held and clears it: the array it is the dead head of
// keeps no closed connection from the collector.
func closeAll(held []heldConn) {
	for _, hc := range held {
		hc.conn.Close()
	}
	clear(held)
}
