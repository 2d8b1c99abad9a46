package admission

import (
	"context"
	"net"
	"net/http"
	"time"
)

// connKey is the context key of a connection's *trackedConn.
type connKey struct{}

// ConnContext is the hook for http.Server.ConnContext: it lets Admit find
// the connection a request came on, and shedHeld end its requests.
func (c *Controller) ConnContext(ctx context.Context, conn net.Conn) context.Context {
	if c == nil {
		return ctx
	}
	if t := trackedOf(conn); t != nil {
		ctx, cancel := context.WithCancel(ctx)
		t.cancel.Store(&cancel)
		return context.WithValue(ctx, connKey{}, t)
	}
	return ctx
}

// ConnState is the hook for http.Server.ConnState: it notes where each
// connection stands, for shedding. A keep-alive request's two calls touch
// its connection's own fields only.
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
		// Idle until its first request: one opened ahead of need, or that
		// never sends anything, is as cheap to shed as a keep-alive one.
		if t.headDeadline.Load() == 0 { // its wait began at the accept
			t.since.Store(c.clock.Now().UnixNano())
		}
		c.conns.add(t, conn)
	case http.StateIdle:
		t.headDeadline.Store(0)
		t.arriving.Store(false)
		t.since.Store(c.clock.Now().UnixNano())
		if t.setState(stateIdle) && t.goingAway.Load() {
			// Its last stream's final frames may still be on their way out
			// of the server's buffer: close it a little later.
			c.closeIfIdleAfter(t, goAwayGrace)
		}
	case http.StateActive:
		t.headDeadline.Store(0)
		t.setState(stateActive)
		if t.goingAway.Load() {
			// A GOAWAY may be on its way out: the stream's first frame
			// waits for it (a barrier: the lock guards nothing).
			t.goAwayMu.Lock()
			//lint:ignore SA2001 a barrier: locked only to wait for goAway's write
			t.goAwayMu.Unlock()
		}
	case http.StateHijacked, http.StateClosed:
		t.state.Store(uint32(stateGone))
		c.conns.remove(t)
	}
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

func (t *trackedConn) isIdle() bool { return connState(t.state.Load()) == stateIdle }

// trackedOf finds the tracked connection under conn (a *tls.Conn's, or one
// wrapped by the PROXY protocol or a gate), if any.
func trackedOf(conn net.Conn) *trackedConn {
	for range 8 { // wrappers do not nest deeper than this
		switch v := conn.(type) {
		case *trackedConn:
			return v
		case interface{ NetConn() net.Conn }:
			conn = v.NetConn()
		case interface{ Raw() net.Conn }: // go-proxyproto's Conn
			conn = v.Raw()
		default:
			return nil
		}
	}
	return nil
}

// goAway writes a GOAWAY to an idle HTTP/2 connection, then closes it
// after goAwayGrace if it is idle again; on its own goroutine, as the
// write could wait on a client that stopped reading. The GOAWAY goes in
// only while the connection has no stream: ConnState waits on t.goAwayMu
// before a stream makes it active, so no response frame is split by it.
func (c *Controller) goAway(t *trackedConn, outer net.Conn) {
	t.goAwayMu.Lock()
	idle := t.isIdle()
	var err error
	if idle {
		_, err = outer.Write(goAwayFrame[:])
	}
	t.goAwayMu.Unlock()
	switch {
	case !idle:
		// A stream started first: the connection is listed again when idle.
		t.goingAway.Store(false)
		c.undrain(t)
	case err != nil:
		t.Close()
	default:
		c.closeIfIdleAfter(t, goAwayGrace)
	}
}

func (c *Controller) closeIfIdleAfter(t *trackedConn, d time.Duration) {
	time.AfterFunc(d, func() {
		if t.isIdle() {
			t.Close()
		}
	})
}

func (c *Controller) undrain(t *trackedConn) {
	if t.draining.CompareAndSwap(true, false) {
		c.draining.Add(-1)
	}
}

// goAwayFrame is RFC 9113 §6.8's first step of a graceful shutdown: a
// GOAWAY (length 8, type 7, no flags, stream 0) with the last stream
// identifier 2^31-1 and NO_ERROR.
var goAwayFrame = [17]byte{0, 0, 8, 0x7, 0, 0, 0, 0, 0, 0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0}
