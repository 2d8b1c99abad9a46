package admission

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Listener returns l counted against the budget: at the budget, Accept
// makes room for the connection it accepted or waits for room (leaving the
// next connections in the kernel's backlog); while the box is under
// pressure it refuses a connection from a client address that holds its
// share (held a second, unread, then closed).
// Wrap the raw listener, below the PROXY protocol and TLS: the peer it
// counts is the one that connected. Set the servers' ConnState to
// c.ConnState so that idle connections can be shed.
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

func (l *listener) isClosed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// acceptTracked accepts the next connection admitted.
func (l *listener) acceptTracked() (*trackedConn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		var client *clientEntry
		if key, ok := l.c.clientOfPeer(conn.RemoteAddr()); ok {
			if client, ok = l.c.clients.addConn(key, l.c.contended.Load()); !ok {
				l.c.refuseConn(conn, refusedClientConns)
				continue
			}
		}
		// Room is made only now, once the connection's address is known:
		// at the budget, closing another address's slow first request for
		// a connection of an address past its share, or as large as that
		// one, would trade their connections for each other's, a close and
		// a reconnect at a time, and serve nobody (shedRoom). Waiting here
		// holds one accepted connection; the rest stay in the kernel's
		// backlog. A listener closed meanwhile (an upgrade hands the
		// socket on) still returns this one: it was accepted, and its
		// server drains it.
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

// refuseConn holds conn, refused for reason, until its hold is over, and
// counts it.
func (c *Controller) refuseConn(conn net.Conn, reason string) {
	c.refused.hold(conn, c.clock.Now())
	c.m.refused(reason)
	c.logRefusal(reason)
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

// clientOfPeer returns the client key of a connection's peer, false when
// it is a proxy's (or not an IP address): such connections are counted
// against the budget only.
func (c *Controller) clientOfPeer(a net.Addr) (netip.Addr, bool) {
	var ap netip.AddrPort
	switch a := a.(type) {
	case *net.TCPAddr:
		ap = a.AddrPort()
	case *net.UDPAddr:
		ap = a.AddrPort()
	default:
		return netip.Addr{}, false
	}
	ip := ap.Addr().Unmap().WithZone("")
	if !ip.IsValid() || c.isProxy(ip) {
		return netip.Addr{}, false
	}
	return clientKey(ip), true
}

func (c *Controller) isProxy(ip netip.Addr) bool { return contains(c.proxies, ip) }

func contains(ps []netip.Prefix, ip netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(ip) {
			return true
		}
	}
	return false
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

	// Where it stands, as its server reported: written by its own
	// requests only, so that a request takes no lock another connection
	// takes. Shedding reads them when it looks for idle connections.
	state     atomic.Uint32 // a connState
	since     atomic.Int64  // when it became idle or active (or was accepted), Unix ns of c.clock
	goingAway atomic.Bool   // sent a GOAWAY: close once idle
	draining  atomic.Bool   // sent a GOAWAY, not closed yet
	arriving  atomic.Bool   // received bytes since it was last idle
	// request is the application of the HTTP/1 request in flight on it,
	// admitted at since (Admit); nil: none, or not HTTP/1.
	request atomic.Pointer[appState]

	// Guarded by its registry shard's lock; shardIdx is set at accept.
	shardIdx   uint8
	outer      net.Conn // the server's connection over this one (a *tls.Conn, say)
	listed     bool
	prev, next *trackedConn

	// goAwayMu is held while a GOAWAY is written to the connection, and
	// waited on before it turns active (see goAway).
	goAwayMu sync.Mutex

	// socket is found when its first head begins to wait (heads.go), for
	// the calls made on it meanwhile; nil if it has none (a test's pipe).
	socket *headSocket

	// For a first head awaited outside the server (heads.go): the
	// listener's, if it awaits them.
	headWait *headWait
	// headDeadline, once handed over, is when its first head must be in
	// (Unix ns): its server's header deadline is held to it, so that a
	// head handed over unfinished gets no second timeout. 0: none.
	headDeadline atomic.Int64
}

// closeUnread closes t, a connection whose first head waited, taking
// first what its client sent that was only peeked at: closed with bytes
// unread, a socket sends a reset rather than a FIN.
func (t *trackedConn) closeUnread() {
	drainUnread(t)
	t.Close()
}

// isWaiting reports whether t waits for its first head.
func (h *headWait) isWaiting(t *trackedConn) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.byConn[t]
	return ok
}

// rawConn returns t's socket, for the calls made on it while its first
// head is awaited: the socket found when it began to wait.
func (t *trackedConn) rawConn() (syscall.RawConn, error) {
	if t.socket == nil {
		return nil, errors.New("no socket")
	}
	return t.socket.rc, nil
}

// SetReadDeadline sets the read deadline, held to its first head's.
func (t *trackedConn) SetReadDeadline(d time.Time) error {
	return t.Conn.SetReadDeadline(t.heldToHeadDeadline(d))
}

// SetDeadline sets both deadlines, the read one held to its first head's.
func (t *trackedConn) SetDeadline(d time.Time) error {
	return t.Conn.SetDeadline(t.heldToHeadDeadline(d))
}

// heldToHeadDeadline returns d, or the deadline of t's first head if that
// comes first (heads.go). No deadline (zero) is left as it is: the server
// clears its header deadline once the head is in. (With a ReadTimeout,
// which the edge does not set, the server would set the body's deadline
// before it reports the connection active, and that would be held too.)
func (t *trackedConn) heldToHeadDeadline(d time.Time) time.Time {
	if by := t.headDeadline.Load(); by != 0 && !d.IsZero() && d.UnixNano() > by {
		return time.Unix(0, by)
	}
	return d
}

// NetConn returns the connection underneath, as tls.Conn's does.
func (t *trackedConn) NetConn() net.Conn { return t.Conn }

// Read notes that bytes arrived: a connection listed as idle (or new) that
// receives some has a TLS handshake or a request on its way, which its
// server reports only once the request's headers are in.
func (t *trackedConn) Read(p []byte) (int, error) {
	n, err := t.Conn.Read(p)
	if n > 0 && !t.arriving.Load() {
		t.arriving.Store(true)
	}
	return n, err
}

func (t *trackedConn) Close() error {
	// Claimed before the connection goes: closing it wakes its server's
	// goroutine, which closes it too, and the descriptor must be given
	// back by this call, before it returns (shedding counts on it), not
	// later by that one.
	if !t.closed.CompareAndSwap(false, true) {
		return t.Conn.Close()
	}
	if h := t.headWait; h != nil && h.isWaiting(t) {
		drainUnread(t) // peeked at only: a FIN, not a reset
	}
	err := t.Conn.Close()
	t.c.connClosed(t)
	return err
}

func (c *Controller) connClosed(t *trackedConn) {
	if t.upstream {
		c.upstreamConns.Add(-1)
	} else {
		t.state.Store(uint32(stateGone))
		if t.headWait != nil {
			t.headWait.drop(t)
		}
		c.conns.remove(t)
		c.undrain(t)
		c.clientConns.Add(-1)
		if t.client != nil {
			c.clients.releaseConn(t.client)
		}
	}
	c.released()
}

// ErrNoDescriptor is DialUpstream's refusal: the budget and its overdraft
// are spent. It wraps syscall.EMFILE, which the kernel would have returned
// past the descriptor limit, so that the upstream is not blamed.
var ErrNoDescriptor = fmt.Errorf("admission: the connection budget and its overdraft are spent: %w", syscall.EMFILE)

// DialUpstream makes, with dial, a connection to an upstream, and counts it
// against the budget until it is closed. Its descriptor is claimed before
// the dial: Admit looks at the count, but the requests it admits together
// dial together, and counted only once connected, enough of them took the
// edge to the process's descriptor limit, where accept and the admin
// listener fail for everyone. Past MaxConns and its overdraft the dial is
// not made (ErrNoDescriptor). A connection made is never cut for pressure.
func (c *Controller) DialUpstream(dial func() (net.Conn, error)) (net.Conn, error) {
	if c == nil {
		return dial()
	}
	if !c.reserveUpstream() {
		c.refusedRequest(RefusedBudget)
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
		// The upstream pool peeks at idle connections through the
		// descriptor.
		return &trackedSyscallConn{trackedConn: t, sc: sc}, nil
	}
	return t, nil
}

// reserveUpstream counts a descriptor for an upstream connection about to
// be dialled, within MaxConns and the overdraft, first freeing one as
// Admit does (an idle client connection of the plan, or idle upstream
// ones) if there is none; false: none could be had.
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

// trackedOf finds the tracked connection under conn (a *tls.Conn's, or one
// wrapped by the PROXY protocol or a gate); nil when there is none.
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

// closeRaw closes the TCP connection itself, without a TLS close_notify,
// which could wait on a client that does not read. The server's next read
// fails and it ends the connection.
func (t *trackedConn) closeRaw() {
	t.Close()
}

// shed closes t, an idle connection shedding chose; h2 says it speaks
// HTTP/2, and is sent a GOAWAY instead and closed after goAwayGrace if
// still idle; until then it counts in c.draining.
func (c *Controller) shed(t *trackedConn, outer net.Conn, h2 bool) {
	c.m.shed.WithLabelValues(shedIdle).Inc()
	c.shedIdle.Add(1)
	if !h2 {
		t.closeRaw()
		return
	}
	t.draining.Store(true)
	c.draining.Add(1)
	go c.goAway(t, outer)
}

// goAway writes a GOAWAY to an idle HTTP/2 connection, then closes it after
// goAwayGrace if it is idle again. It runs on its own goroutine: the write
// could wait on a client that stopped reading, as long as the send timeout
// lets it.
//
// The GOAWAY goes in between the server's own frames only while the
// connection has no stream: ConnState waits on t.goAwayMu before a stream
// makes the connection active, so no response frame of a stream the client
// opened meanwhile can be split around it.
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
		// A stream started first: it is left alone, and the connection
		// is listed again when idle.
		t.goingAway.Store(false)
		c.undrain(t)
	case err != nil:
		t.closeRaw()
	default:
		c.closeIfIdleAfter(t, goAwayGrace)
	}
}

// closeIfIdleAfter closes t after d unless a stream made it active.
func (c *Controller) closeIfIdleAfter(t *trackedConn, d time.Duration) {
	time.AfterFunc(d, func() {
		if t.isIdle() {
			t.closeRaw()
		}
	})
}

// undrain takes t out of c.draining, once.
func (c *Controller) undrain(t *trackedConn) {
	if t.draining.CompareAndSwap(true, false) {
		c.draining.Add(-1)
	}
}

// goAwayFrame is an HTTP/2 GOAWAY with the last stream identifier 2^31-1 and
// NO_ERROR: RFC 9113 §6.8's first step of a graceful shutdown. The client
// opens no new stream on the connection and finishes the ones it has.
var goAwayFrame = [17]byte{
	0, 0, 8, // length
	0x7,        // type GOAWAY
	0,          // flags
	0, 0, 0, 0, // stream 0
	0x7f, 0xff, 0xff, 0xff, // last stream identifier
	0, 0, 0, 0, // NO_ERROR
}
