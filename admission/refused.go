package admission

import (
	"net"
	"sync"
	"time"
)

// refuseHold is how long a refused connection is kept open, unread (it
// wakes no goroutine whatever it sends), before it is closed: a client
// that reconnects the moment its connection closes (a slowloris tool, a
// retrying client behind a NAT) would otherwise have the edge accept and
// close its connections in a loop, thousands a second, nothing served.
const refuseHold = time.Second

// refusedHold keeps refused connections until their hold is over. It is
// bounded: past max, a refused connection is closed at once, as it would
// be without the hold.
type refusedHold struct {
	mu    sync.Mutex
	conns []heldConn // in the order they were refused, which their holds end in
	max   int
}

type heldConn struct {
	conn  net.Conn
	until time.Time
}

// heldFor is how many refused connections may be held at once: half the
// overdraft (the edge's own half of the reserve is the rest), at least 16,
// at most 1,024.
func heldFor(l Limits) int { return min(max(l.Overdraft/2, 16), 1024) }

// hold keeps conn until now+refuseHold, first closing the holds that are
// over; with the hold full it closes conn at once.
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
// FIFO moves along its array, which append replaces, with the live holds
// only, once it is spent: nothing is copied at every call.
func (h *refusedHold) takeExpired(now time.Time) []heldConn {
	i := 0
	for i < len(h.conns) && !h.conns[i].until.After(now) {
		i++
	}
	expired := h.conns[:i:i]
	h.conns = h.conns[i:]
	return expired
}

// closeAll closes held, out of the FIFO, and clears it: the array it is
// the dead head of keeps no closed connection from the collector.
func closeAll(held []heldConn) {
	for _, hc := range held {
		hc.conn.Close()
	}
	clear(held)
}
