package handover

import (
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
)

// Gate stops HTTP servers accepting without starting their shutdown, and
// tells when every connection they accepted has had its first request read.
//
// http.Server.Shutdown closes the listeners, then drops any request it
// reads from then on: a connection accepted a moment before, whose request
// (or TLS handshake) was still on its way, is closed unanswered. A client
// that sent its request on a fresh connection sees it fail. So the old edge
// stops accepting through a Gate, waits until no connection is new, and
// only then calls Shutdown, which closes idle connections (a client retries
// an idempotent request on a reused connection that closes) and waits for
// the active ones. Waiting for new connections also lets TLS handshakes in
// progress finish while edge.db is still open.
//
// Wrap each server's listener with Listener (innermost, around the bound
// socket) and set each server's ConnState to the Gate's. The zero value is
// ready to use; its methods are safe for concurrent use.
type Gate struct {
	mu        sync.Mutex
	listeners []*gatedListener
	// handedOut counts connections Accept returned that the server has
	// not yet reported as new; fresh holds those it reported as new and
	// that have not moved on. Together they are the connections that may
	// still be waiting for their first request to be read.
	handedOut int
	fresh     map[net.Conn]bool
	changed   chan struct{} // closed and replaced whenever the counts drop
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
			g.fresh = map[net.Conn]bool{}
		}
		g.fresh[c] = true
		if g.handedOut > 0 {
			g.handedOut--
		}
		return
	}
	if g.fresh[c] {
		delete(g.fresh, c)
		g.notify()
	}
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

// Wait returns once no connection accepted through the gate is waiting for
// its first request, or with ctx's error when ctx ends first (a client
// that connects and sends nothing). Call it after Stop.
func (g *Gate) Wait(ctx context.Context) error {
	for {
		g.mu.Lock()
		if g.handedOut == 0 && len(g.fresh) == 0 {
			g.mu.Unlock()
			return nil
		}
		if g.changed == nil {
			g.changed = make(chan struct{})
		}
		ch := g.changed
		g.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
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
	return c, nil
}

func (l *gatedListener) Close() error {
	l.closeOnce.Do(func() { close(l.closed) })
	if l.stopped.Load() {
		return nil // Stop closed the socket already
	}
	return l.Listener.Close()
}
