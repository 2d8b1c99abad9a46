package handover

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// quiet is how long a new connection must have been accepted and have
// received nothing before Wait stops waiting for it: a TLS handshake or a
// request on its way keeps arriving; a connection a client opened ahead of
// need (browsers and Go's transport do) sends nothing, or nothing after its
// handshake, and is treated like an idle one.
const quiet = 100 * time.Millisecond

// Gate stops HTTP servers accepting without starting their shutdown, and
// tells when the connections they accepted have stopped arriving: their
// first request read, or nothing more coming.
//
// http.Server.Shutdown closes the listeners, then drops any request it
// reads from then on: a connection accepted a moment before, whose request
// (or TLS handshake) was still on its way, is closed unanswered. A client
// that sent its request on a fresh connection sees it fail. So the old edge
// stops accepting through a Gate, waits, and only then calls Shutdown,
// which closes idle connections (a client retries an idempotent request on
// a reused or pre-opened connection that closes) and waits for the active
// ones. The wait also lets TLS handshakes in progress finish while edge.db
// is still open.
//
// Wrap each server's listener with Listener (outermost, below TLS: the gate
// sees the bytes a connection receives) and set each server's ConnState to
// the Gate's. The zero value is ready to use; its methods are safe for
// concurrent use.
type Gate struct {
	mu        sync.Mutex
	listeners []*gatedListener
	// handedOut counts connections Accept returned that the server has
	// not yet reported as new; fresh holds those it reported as new and
	// that have not moved on, by the server's conn, with the gate's own.
	handedOut int
	fresh     map[net.Conn]*gateConn
	changed   chan struct{} // closed and replaced whenever the counts move
}

// Listener returns l gated: it accepts until Stop, then blocks until
// closed, so a server's Serve keeps running until its Shutdown.
func (g *Gate) Listener(l net.Listener) net.Listener {
	gl := &gatedListener{Listener: l, gate: g, closed: make(chan struct{})}
	g.mu.Lock()
	g.listeners = append(g.listeners, gl)
	g.mu.Unlock()
	return gl
}

// ConnState is the hook for http.Server.ConnState.
func (g *Gate) ConnState(c net.Conn, st http.ConnState) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if st == http.StateNew {
		if g.fresh == nil {
			g.fresh = map[net.Conn]*gateConn{}
		}
		g.fresh[c] = gateConnOf(c)
		if g.handedOut > 0 {
			g.handedOut--
		}
		g.notify()
		return
	}
	if gc, ok := g.fresh[c]; ok {
		if gc != nil {
			gc.watched.Store(false)
		}
		delete(g.fresh, c)
		g.notify()
	}
}

// gateConnOf finds the gate's connection under c (a *tls.Conn's, say);
// nil when c is not from a gated listener.
func gateConnOf(c net.Conn) *gateConn {
	for range 8 { // wrappers do not nest deeper than this
		if gc, ok := c.(*gateConn); ok {
			return gc
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		c = u.NetConn()
	}
	return nil
}

// notify wakes Wait; g.mu is held.
func (g *Gate) notify() {
	if g.changed != nil {
		close(g.changed)
		g.changed = nil
	}
}

// Stop closes every gated listener's socket: the kernel gives this process
// no more connections (a successor holding the same socket gets them).
// The servers' Serve calls keep blocking until their Shutdown.
func (g *Gate) Stop() {
	g.mu.Lock()
	ls := g.listeners
	g.mu.Unlock()
	for _, l := range ls {
		l.stopped.Store(true)
		l.Listener.Close()
	}
}

// Wait returns once no connection accepted through the gate is still
// receiving its TLS handshake or first request (a new connection that has
// received something within the last 100ms), or with ctx's error when ctx
// ends first (a client trickling its request). Call it after Stop.
func (g *Gate) Wait(ctx context.Context) error {
	for {
		g.mu.Lock()
		busy, recheck := g.handedOut > 0, time.Duration(0)
		now := time.Now()
		for _, gc := range g.fresh {
			if gc == nil {
				continue
			}
			if left := quiet - now.Sub(time.Unix(0, gc.last.Load())); left > 0 {
				busy = true
				if recheck == 0 || left < recheck {
					recheck = left
				}
			}
		}
		if !busy {
			g.mu.Unlock()
			return nil
		}
		if g.changed == nil {
			g.changed = make(chan struct{})
		}
		ch := g.changed
		g.mu.Unlock()
		var timer *time.Timer
		var fired <-chan time.Time
		if recheck > 0 {
			timer = time.NewTimer(recheck)
			fired = timer.C
		}
		select {
		case <-ch:
		case <-fired:
		case <-ctx.Done():
		}
		if timer != nil {
			timer.Stop()
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

type gatedListener struct {
	net.Listener
	gate      *Gate
	stopped   atomic.Bool
	closeOnce sync.Once
	closed    chan struct{}
}

func (l *gatedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		if !l.stopped.Load() {
			return nil, err
		}
		// Stopped, not closed: Serve must not see an error yet, or it
		// would return before Shutdown and report a failure.
		<-l.closed
		return nil, net.ErrClosed
	}
	l.gate.mu.Lock()
	l.gate.handedOut++
	l.gate.mu.Unlock()
	gc := &gateConn{Conn: c}
	gc.watched.Store(true)
	gc.last.Store(time.Now().UnixNano())
	return gc, nil
}

func (l *gatedListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	if l.stopped.Load() {
		return nil // Stop closed the socket already
	}
	return l.Listener.Close()
}

// gateConn notes when it last received bytes, until its server reports it
// past its first request.
type gateConn struct {
	net.Conn
	watched atomic.Bool
	last    atomic.Int64 // unix nanoseconds of the accept or of the last read that got bytes
}

// NetConn returns the connection underneath, as tls.Conn's does, for the
// wrappers that look for theirs below.
func (c *gateConn) NetConn() net.Conn { return c.Conn }

func (c *gateConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.watched.Load() {
		c.last.Store(time.Now().UnixNano())
	}
	return n, err
}
