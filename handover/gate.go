package handover

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scafo/scafo-edge/internal/clock"
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
// the Gate's; set its ConnContext and wrap its handler with Handler too, or
// Wait waits for first requests to be answered rather than to be read. The
// zero value is ready to use; its methods are safe for concurrent use.
type Gate struct {
	mu        sync.Mutex
	listeners []*gatedListener
	// handedOut counts connections Accept returned that the server has
	// not yet reported as new; fresh holds those it reported as new and
	// that have not moved on, by the server's conn, with the gate's own.
	handedOut int
	fresh     map[net.Conn]*gateConn
	changed   chan struct{} // closed and replaced whenever the counts move
	clock     clock.Clock   // nil: the wall clock; tests set a fake
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
	// A connection past its first request is no longer watched: its
	// keep-alive requests take no lock that every connection shares.
	if st != http.StateNew {
		if gc := gateConnOf(c); gc != nil && !gc.watched.Load() {
			return
		}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	switch st {
	case http.StateNew:
		if g.fresh == nil {
			g.fresh = map[net.Conn]*gateConn{}
		}
		gc := gateConnOf(c)
		if gc != nil {
			gc.served = c
		}
		g.fresh[c] = gc
		if g.handedOut > 0 {
			g.handedOut--
		}
		g.notify()
	case http.StateActive:
		// An HTTP/1 server reports a connection active as soon as it has
		// read a request, and only then checks whether it is shutting
		// down: a Shutdown in between drops the request unanswered. So
		// the connection still counts as arriving until its request
		// reaches the handler (Handler says so) or it moves on.
		if gc := g.fresh[c]; gc != nil {
			gc.reading = true
			return
		}
		g.arrived(c)
	default:
		g.arrived(c)
	}
}

// ConnContext is the hook for http.Server.ConnContext (see
// serving.ResetGuard.Configure to chain another): it lets Handler find
// the connection a request came on.
func (g *Gate) ConnContext(ctx context.Context, c net.Conn) context.Context {
	if gc := gateConnOf(c); gc != nil {
		return context.WithValue(ctx, gateConnKey{}, gc)
	}
	return ctx
}

type gateConnKey struct{}

// Handler tells the gate when a connection's first request reaches h, so
// that Wait need not wait for its answer; a server without it still loses
// no request, but Wait waits until the first answer is written.
func (g *Gate) Handler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if gc, _ := r.Context().Value(gateConnKey{}).(*gateConn); gc != nil && gc.watched.Load() {
			g.mu.Lock()
			if g.fresh[gc.served] == gc {
				g.arrived(gc.served)
			}
			g.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	})
}

// arrived stops watching c, the server's connection; g.mu is held.
func (g *Gate) arrived(c net.Conn) {
	gc, ok := g.fresh[c]
	if !ok {
		return
	}
	if gc != nil {
		gc.watched.Store(false)
	}
	delete(g.fresh, c)
	g.notify()
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
func (g *Gate) Wait(ctx context.Context) error { return g.wait(ctx, true) }

// Drain returns once every connection accepted through the gate has had
// its first request reach the handler, or has moved on or closed, however
// long it has been quiet; or with ctx's error. Wait's quiet time is a
// guess, and a TLS handshake on a loaded box can pause longer: a server
// whose keep-alives are off (so that each such connection closes after
// its answer) calls Drain before Shutdown, which would read and drop the
// request. ctx bounds how long it takes (the servers' header timeout
// would too, but it is long).
func (g *Gate) Drain(ctx context.Context) error { return g.wait(ctx, false) }

// wait is Wait, and with quietEnds false, Drain.
func (g *Gate) wait(ctx context.Context, quietEnds bool) error {
	for {
		g.mu.Lock()
		busy, recheck := g.handedOut > 0, time.Duration(0)
		for _, l := range g.listeners {
			busy = busy || (l.accepting || l.more) && l.stopped.Load()
		}
		now := g.now()
		for _, gc := range g.fresh {
			if gc == nil {
				continue
			}
			if gc.reading || !quietEnds {
				busy = true
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
		var timer clock.Timer
		var fired <-chan time.Time
		if recheck > 0 {
			timer = clock.OrReal(g.clock).NewTimer(recheck)
			fired = timer.C()
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

func (g *Gate) now() time.Time { return clock.OrReal(g.clock).Now() }

type gatedListener struct {
	net.Listener
	gate *Gate
	// accepting is set while Accept waits for a connection (g.mu held to
	// change it). Stop interrupts that wait, but the kernel may have given
	// the connection just before: until that Accept returns, Wait cannot
	// tell that no connection is on its way to the server.
	accepting bool
	// more is set while the last Accept returned a connection (g.mu held
	// to change it): a stopped listener may still hold connections it
	// accepted before the stop (one that awaits first heads does) and
	// hands them out before its end, so until an Accept returns an error,
	// Wait cannot tell that none is on its way.
	more      bool
	stopped   atomic.Bool
	closeOnce sync.Once
	closed    chan struct{}
}

func (l *gatedListener) Accept() (net.Conn, error) {
	l.gate.mu.Lock()
	l.accepting = true
	l.gate.mu.Unlock()
	c, err := l.Listener.Accept()
	l.gate.mu.Lock()
	l.accepting = false
	l.more = err == nil
	if err == nil {
		l.gate.handedOut++
	}
	l.gate.notify()
	l.gate.mu.Unlock()
	if err != nil {
		if !l.stopped.Load() {
			return nil, err
		}
		// Stopped, not closed: Serve must not see an error yet, or it
		// would return before Shutdown and report a failure.
		<-l.closed
		return nil, net.ErrClosed
	}
	gc := &gateConn{Conn: c, gate: l.gate}
	gc.watched.Store(true)
	gc.last.Store(l.gate.now().UnixNano())
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
	gate    *Gate
	watched atomic.Bool
	last    atomic.Int64 // unix nanoseconds of the accept or of the last read that got bytes
	// served is the connection the server reports states of (c or a
	// *tls.Conn over it); reading is set once it has read a request that
	// has not reached the handler. Both are guarded by the gate's mu.
	served  net.Conn
	reading bool
}

// NetConn returns the connection underneath, as tls.Conn's does, for the
// wrappers that look for theirs below.
func (c *gateConn) NetConn() net.Conn { return c.Conn }

func (c *gateConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.watched.Load() {
		c.last.Store(c.gate.now().UnixNano())
	}
	return n, err
}
