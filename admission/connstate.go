package admission

import (
	"context"
	"net"
	"net/http"
)

// connKey is the context key under which ConnContext puts a connection's
// *trackedConn, for Admit to note its request on it.
type connKey struct{}

// ConnContext is the hook for http.Server.ConnContext: it lets Admit find
// the connection a request came on. A connection not from c's listeners
// gets ctx as it is.
func (c *Controller) ConnContext(ctx context.Context, conn net.Conn) context.Context {
	if c == nil {
		return ctx
	}
	if t := trackedOf(conn); t != nil {
		return context.WithValue(ctx, connKey{}, t)
	}
	return ctx
}

// ConnState is the hook for http.Server.ConnState: it notes where each
// connection stands, for shedding to find the idle ones. A connection not
// from c.Listener is ignored. A keep-alive request's two calls touch its
// connection's own fields only.
func (c *Controller) ConnState(conn net.Conn, st http.ConnState) {
	if c == nil {
		return
	}
	t := trackedOf(conn)
	if t == nil {
		return
	}
	switch st {
	case http.StateNew:
		// Idle until its first request: a connection opened ahead of need,
		// or one that never sends anything, is as cheap to shed as an idle
		// keep-alive one (minIdleAge spares those whose request is on its
		// way).
		if t.headDeadline.Load() == 0 { // its wait began at the accept
			t.since.Store(c.clock.Now().UnixNano())
		}
		c.conns.add(t, conn)
	case http.StateIdle:
		t.headDeadline.Store(0)
		t.arriving.Store(false)
		t.since.Store(c.clock.Now().UnixNano())
		if !t.setState(stateIdle) {
			return
		}
		if t.goingAway.Load() {
			// Told to go away, the client opens no stream on it again.
			// Its last stream's final frames may still be on their way
			// out of the server's buffer: close it a little later.
			c.closeIfIdleAfter(t, goAwayGrace)
		}
	case http.StateActive:
		t.headDeadline.Store(0)
		t.since.Store(c.clock.Now().UnixNano())
		t.setState(stateActive)
		if t.goingAway.Load() {
			// A GOAWAY may be on its way out: the stream's first frame
			// waits for it.
			t.awaitGoAway()
		}
	case http.StateHijacked, http.StateClosed:
		t.state.Store(uint32(stateGone))
		c.conns.remove(t)
	}
}

// awaitGoAway waits until a GOAWAY being written to t is out: goAway holds
// goAwayMu while it writes. A barrier: the lock guards nothing.
func (t *trackedConn) awaitGoAway() {
	t.goAwayMu.Lock()
	//lint:ignore SA2001 a barrier: locked only to wait for goAway's write
	t.goAwayMu.Unlock()
}

// setState moves t to st unless it is gone, and reports whether it did.
func (t *trackedConn) setState(st connState) bool {
	for {
		cur := t.state.Load()
		if connState(cur) == stateGone {
			return false
		}
		if t.state.CompareAndSwap(cur, uint32(st)) {
			return true
		}
	}
}

// isIdle reports whether t is idle now.
func (t *trackedConn) isIdle() bool { return connState(t.state.Load()) == stateIdle }
