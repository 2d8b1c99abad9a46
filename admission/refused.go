package admission

import (
	"net"
	"sync"
	"time"
)

// refuseHold is how long a connection refused for its address's share is
// kept open, unread, before it is closed. A client that reconnects the
// moment its connection closes (a slowloris tool does, and so does a
// retrying client behind a NAT) would otherwise have the edge accept and
// close its connections in a loop, one per round trip: thousands a second
// from a handful of connections past the share, each an accept and a close
// for the edge and nothing served. Held, each costs one accept and one
// close a second. Unread, a held connection wakes no goroutine whatever it
// sends.
const refuseHold = time.Second

// refusedHold keeps refused connections until their hold is over, in the
// order they were refused (which is the order their holds end). It is
// bounded: past max, a refused connection is closed at once, as it would
// be without the hold. It holds at most half as many descriptors as the
// overdraft (heldFor), out of the half of the reserve that the overdraft
// leaves the edge.
type refusedHold struct {
	mu    sync.Mutex
	conns []heldConn // a FIFO: conns[head:] are held
	head  int
	max   int
}

type heldConn struct {
	conn  net.Conn
	until time.Time
}

// heldFor is how many refused connections may be held at once for limits:
// half the edge's own half of the reserve, at least 16, at most 1,024.
func heldFor(l Limits) int { return min(max(l.Overdraft/2, 16), 1024) }

// hold keeps conn until now+refuseHold, first closing the holds that are
// over. With the hold full it closes conn at once.
func (h *refusedHold) hold(conn net.Conn, now time.Time) {
	h.mu.Lock()
	expired := h.takeExpired(now)
	full := len(h.conns)-h.head >= h.max
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

// releaseAll closes every held connection.
func (h *refusedHold) releaseAll() {
	h.mu.Lock()
	held := h.conns[h.head:]
	h.conns, h.head = nil, 0
	h.mu.Unlock()
	closeAll(held)
}

// len is the connections held now.
func (h *refusedHold) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.conns) - h.head
}

// takeExpired removes and returns the holds over at now; h.mu is held.
// The slice is compacted once its dead head is half of it, so that it
// neither grows without bound nor is copied at every call.
func (h *refusedHold) takeExpired(now time.Time) []heldConn {
	i := h.head
	for i < len(h.conns) && !h.conns[i].until.After(now) {
		i++
	}
	if i == h.head {
		return nil
	}
	expired := make([]heldConn, i-h.head)
	copy(expired, h.conns[h.head:i])
	clear(h.conns[h.head:i])
	h.head = i
	if h.head == len(h.conns) {
		h.conns, h.head = h.conns[:0], 0
	} else if h.head >= len(h.conns)/2 {
		n := copy(h.conns, h.conns[h.head:])
		clear(h.conns[n:])
		h.conns, h.head = h.conns[:n], 0
	}
	return expired
}

func closeAll(held []heldConn) {
	for _, hc := range held {
		hc.conn.Close()
	}
}
