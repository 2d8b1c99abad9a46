package admission

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/scafo/scafo-edge/internal/forwarded"
)

// Listener returns l counted against the budget and the client addresses'
// shares. Wrap the raw listener, below the PROXY protocol and TLS: the
// peer it counts is the one that connected. Set the servers' ConnState to
// c.ConnState, and ConnContext to c.ConnContext.
func (c *Controller) Listener(l net.Listener) net.Listener {
	if c == nil {
		return l
	}
	return &listener{Listener: l, c: c, done: make(chan struct{})}
}

type listener struct {
	net.Listener
	c         *Controller
	done      chan struct{}
	closeOnce sync.Once
	heads     *headWait // nil: connections go to the server as accepted
}

func (l *listener) Accept() (net.Conn, error) {
	if l.heads != nil {
		return l.heads.accept(l)
	}
	return l.acceptTracked()
}

func (l *listener) isClosed() bool { return isDone(l.done) }

func (l *listener) acceptTracked() (*trackedConn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		client, ok := l.c.addClientConn(conn.RemoteAddr())
		if !ok {
			l.c.refuseConn(conn, refusedClientConns)
			continue
		}
		// Room is made only now, the connection's address known: shedRoom
		// weighs it. Waiting here holds one accepted connection; the rest
		// stay in the backlog. A listener closed meanwhile (an upgrade
		// hands the socket on) still returns this one: its server drains it.
		if !l.c.awaitRoom(l.done, client) {
			if client != nil {
				l.c.clients.releaseConn(client)
			}
			l.c.refuseConn(conn, refusedClientSlow)
			continue
		}
		l.c.clientConns.Add(1)
		l.c.opened()
		return &trackedConn{Conn: conn, c: l.c, client: client, shardIdx: uint8(l.c.connSeq.Add(1) % connShards), headWait: l.heads}, nil
	}
}

func (c *Controller) refuseConn(conn net.Conn, reason string) {
	c.refused.hold(conn, c.clock.Now())
	c.refusal(reason)
}

func (l *listener) Close() error {
	l.closeOnce.Do(func() {
		close(l.done)
		l.c.refused.releaseAll()
		if h := l.heads; h != nil {
			h.start.Do(func() { h.finish(net.ErrClosed) }) // never served: nothing waits
		}
	})
	return l.Listener.Close()
}

// addClientConn counts a connection of peer's client address, if it has
// one, or reports false when the box is contended and it holds its share.
func (c *Controller) addClientConn(peer net.Addr) (*clientEntry, bool) {
	key, ok := c.clientOfPeer(peer)
	if !ok {
		return nil, true
	}
	return c.clients.take(key, connUnit, c.clients.conns, c.contended.Load())
}

// clientOfPeer returns the client key of a connection's peer, false when
// it is a proxy's (or not an IP address).
func (c *Controller) clientOfPeer(a net.Addr) (netip.Addr, bool) {
	ip := peerIP(a)
	if !ip.IsValid() || forwarded.Contains(c.proxies, ip) {
		return netip.Addr{}, false
	}
	return clientKey(ip), true
}

// peerIP is a peer's IP address, unmapped and without a zone; zero if none.
func peerIP(a net.Addr) netip.Addr {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.TCPAddr:
		ap = a.AddrPort()
	case *net.UDPAddr:
		ap = a.AddrPort()
	}
	return ap.Addr().Unmap().WithZone("")
}

// clientKey is the address a client is counted by: an IPv4 address, or an
// IPv6 address's /64, which one subscriber usually holds whole.
func clientKey(ip netip.Addr) netip.Addr {
	if ip.Is4() {
		return ip
	}
	p, _ := ip.WithZone("").Prefix(64)
	return p.Addr()
}

// connState is where a client connection stands, as its server reported.
type connState uint8

const (
	stateNew connState = iota
	stateActive
	stateIdle
	stateGone
)

// trackedConn is one connection counted against the budget. Closing it
// gives its descriptor back, once.
type trackedConn struct {
	net.Conn
	c        *Controller
	client   *clientEntry // nil: not counted per client address
	upstream bool
	closed   atomic.Bool

	// Written by its own requests only (a request takes no lock another
	// connection takes), read by shedding.
	state     atomic.Uint32 // a connState
	since     atomic.Int64  // when it became idle or active (or was accepted), Unix ns of c.clock
	goingAway atomic.Bool   // sent a GOAWAY: close once idle
	draining  atomic.Bool   // sent a GOAWAY, not closed yet
	arriving  atomic.Bool   // received bytes since it was last idle
	// request is the application of the HTTP/1 request in flight on it,
	// admitted at since (Admit); nil: none, or not HTTP/1.
	request atomic.Pointer[appState]
	// cancel ends the context of its requests (ConnContext): shedHeld's.
	cancel atomic.Pointer[context.CancelFunc]

	// Guarded by its registry shard's lock; shardIdx is set at accept.
	shardIdx   uint8
	outer      net.Conn // the server's connection over this one (a *tls.Conn, say)
	listed     bool
	prev, next *trackedConn

	// goAwayMu is held while a GOAWAY is written to it (goAway).
	goAwayMu sync.Mutex

	// For a first head awaited outside the server (heads.go): the
	// listener's wait, its socket and its id there (under headWait.mu).
	headWait *headWait
	socket   *headSocket
	waitID   uint64
	// headDeadline, once handed over, is when its first head must be in
	// (Unix ns; 0: none): a head handed over unended gets no second timeout.
	headDeadline atomic.Int64
}

// closeUnread closes t, a connection whose first head waited, taking
// first what was only peeked at, as closed with bytes unread a socket
// sends a reset rather than a FIN.
func (t *trackedConn) closeUnread() {
	drainUnread(t)
	t.Close()
}

func (t *trackedConn) SetReadDeadline(d time.Time) error {
	return t.Conn.SetReadDeadline(t.heldToHeadDeadline(d))
}

func (t *trackedConn) SetDeadline(d time.Time) error {
	return t.Conn.SetDeadline(t.heldToHeadDeadline(d))
}

// heldToHeadDeadline returns d, or the deadline of t's first head if that
// comes first. Zero is left as it is: the server clears its header
// deadline once the head is in. (With a ReadTimeout, which the edge does
// not set, the body's deadline would be held too.)
func (t *trackedConn) heldToHeadDeadline(d time.Time) time.Time {
	if by := t.headDeadline.Load(); by != 0 && !d.IsZero() && d.UnixNano() > by {
		return time.Unix(0, by)
	}
	return d
}

func (t *trackedConn) NetConn() net.Conn { return t.Conn }

// Read notes that bytes arrived: a connection listed as idle (or new) has
// a handshake or a request on its way, which its server reports only once
// the request's headers are in.
func (t *trackedConn) Read(p []byte) (int, error) {
	n, err := t.Conn.Read(p)
	if n > 0 && !t.arriving.Load() {
		t.arriving.Store(true)
	}
	return n, err
}

func (t *trackedConn) Close() error {
	// Claimed before the connection goes: closing it wakes its server's
	// goroutine, which closes it too, and shedding counts on this call
	// giving the descriptor back before it returns.
	if !t.closed.CompareAndSwap(false, true) {
		return t.Conn.Close()
	}
	if h := t.headWait; h != nil && h.drop(t) {
		drainUnread(t) // peeked at only: a FIN, not a reset
	}
	err := t.Conn.Close()
	c := t.c
	if t.upstream {
		c.upstreamConns.Add(-1)
	} else {
		t.state.Store(uint32(stateGone))
		c.conns.remove(t)
		c.undrain(t)
		c.clientConns.Add(-1)
		if t.client != nil {
			c.clients.releaseConn(t.client)
		}
	}
	c.released()
	return err
}

// ErrNoDescriptor is DialUpstream's refusal. It wraps syscall.EMFILE, the
// kernel's past the descriptor limit, so that the upstream is not blamed.
var ErrNoDescriptor = fmt.Errorf("admission: the connection budget and its overdraft are spent: %w", syscall.EMFILE)

// DialUpstream makes, with dial, a connection to an upstream, and counts it
// against the budget until it is closed; its descriptor is claimed before
// the dial (docs/design.md, admission table).
func (c *Controller) DialUpstream(dial func() (net.Conn, error)) (net.Conn, error) {
	if c == nil {
		return dial()
	}
	if !c.reserveUpstream() {
		c.refusal(RefusedBudget.String())
		return nil, ErrNoDescriptor
	}
	made := false
	defer func() {
		if !made { // the dial failed, or panicked
			c.upstreamConns.Add(-1)
			c.released()
		}
	}()
	conn, err := dial()
	if err != nil {
		return nil, err
	}
	made = true
	c.opened()
	t := &trackedConn{Conn: conn, c: c, upstream: true}
	if sc, ok := conn.(syscall.Conn); ok {
		// The upstream pool peeks at idle connections through it.
		return &trackedSyscallConn{trackedConn: t, sc: sc}, nil
	}
	return t, nil
}

// reserveUpstream counts a descriptor for an upstream connection about to
// be dialled, freeing one as Admit does if there is none.
func (c *Controller) reserveUpstream() bool {
	limit := int64(c.limits.MaxConns + c.limits.Overdraft)
	for range 2 {
		if c.upstreamConns.Add(1)+c.clientConns.Load() <= limit {
			return true
		}
		c.upstreamConns.Add(-1)
		if !c.roomForRequest() {
			return false
		}
	}
	return false
}

type trackedSyscallConn struct {
	*trackedConn
	sc syscall.Conn
}

func (t *trackedSyscallConn) SyscallConn() (syscall.RawConn, error) { return t.sc.SyscallConn() }
