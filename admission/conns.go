package admission

import (
	"crypto/tls"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var errListenerClosed = net.ErrClosed

// Listener returns l counted against the budget: Accept waits (leaving
// connections in the kernel's backlog) while the budget is spent, and
// closes at once a connection from a client address that holds its share.
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
}

func (l *listener) Accept() (net.Conn, error) {
	for {
		if err := l.c.awaitRoom(l.done); err != nil {
			return nil, err
		}
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		var client *clientEntry
		if key, ok := l.c.clientOfPeer(conn.RemoteAddr()); ok {
			if client, ok = l.c.clients.addConn(key); !ok {
				conn.Close()
				l.c.m.refused(refusedClientConns)
				l.c.logRefusal(refusedClientConns)
				continue
			}
		}
		l.c.clientConns.Add(1)
		l.c.opened()
		return &trackedConn{Conn: conn, c: l.c, client: client}, nil
	}
}

func (l *listener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
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
	ip := ap.Addr().Unmap()
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

	// Guarded by c.idle.mu.
	outer     net.Conn // the server's connection over this one (a *tls.Conn, say)
	state     connState
	since     time.Time // when it became idle (or was accepted)
	goingAway bool      // sent a GOAWAY: close once idle
	prev      *trackedConn
	next      *trackedConn
	listed    bool

	// goAwayMu is held while a GOAWAY is written to the connection, and
	// waited on before it turns active (see goAway).
	goAwayMu sync.Mutex
	draining atomic.Bool // sent a GOAWAY, not closed yet
	arriving atomic.Bool // received bytes since it was listed idle
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
	err := t.Conn.Close()
	if t.closed.CompareAndSwap(false, true) {
		t.c.connClosed(t)
	}
	return err
}

func (c *Controller) connClosed(t *trackedConn) {
	if t.upstream {
		c.upstreamConns.Add(-1)
	} else {
		c.idle.remove(t, stateGone)
		c.undrain(t)
		c.clientConns.Add(-1)
		if t.client != nil {
			c.clients.releaseConn(t.client)
		}
	}
	c.released()
}

// TrackUpstream counts conn, a connection to an upstream, against the
// budget until it is closed. It never refuses one: a request admitted to its
// upstream is never cut for pressure.
func (c *Controller) TrackUpstream(conn net.Conn) net.Conn {
	if c == nil {
		return conn
	}
	c.upstreamConns.Add(1)
	c.opened()
	t := &trackedConn{Conn: conn, c: c, upstream: true}
	if sc, ok := conn.(syscall.Conn); ok {
		// The upstream pool peeks at idle connections through the
		// descriptor.
		return &trackedSyscallConn{trackedConn: t, sc: sc}
	}
	return t
}

type trackedSyscallConn struct {
	*trackedConn
	sc syscall.Conn
}

func (t *trackedSyscallConn) SyscallConn() (syscall.RawConn, error) { return t.sc.SyscallConn() }

// ConnState is the hook for http.Server.ConnState: it keeps the list of idle
// connections, oldest first, that pressure sheds. A connection not from
// c.Listener is ignored.
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
		c.idle.push(t, conn, stateNew, c.clock.Now())
	case http.StateIdle:
		if c.idle.push(t, conn, stateIdle, c.clock.Now()) {
			// Told to go away, the client opens no stream on it again.
			// Its last stream's final frames may still be on their way
			// out of the server's buffer: close it a little later.
			c.closeIfIdleAfter(t, goAwayGrace)
		}
	case http.StateActive:
		if c.idle.remove(t, stateActive) {
			// A GOAWAY may be on its way out: the stream's first
			// frame waits for it.
			t.waitGoAwayWritten()
		}
	case http.StateHijacked, http.StateClosed:
		c.idle.remove(t, stateGone)
	}
}

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

// shedOldest closes the connection idle the longest, if it has been idle at
// least age, and reports whether it shed one. An HTTP/2 connection is sent
// a GOAWAY instead and closed after goAwayGrace if still idle; until then
// it counts in c.draining.
func (c *Controller) shedOldest(now time.Time, age time.Duration) bool {
	t, outer, h2 := c.idle.popOldest(now, age)
	if t == nil {
		return false
	}
	c.m.shed.WithLabelValues(shedIdle).Inc()
	c.shedIdle.Add(1)
	if !h2 {
		t.closeRaw()
		return true
	}
	t.draining.Store(true)
	c.draining.Add(1)
	go c.goAway(t, outer)
	return true
}

// waitGoAwayWritten returns once no GOAWAY is being written to t. It is a
// barrier, not a critical section: taking goAwayMu waits out a goAway that
// holds it, and there is nothing to guard once it is ours.
func (t *trackedConn) waitGoAwayWritten() {
	t.goAwayMu.Lock()
	//lint:ignore SA2001 an empty critical section is the barrier itself
	t.goAwayMu.Unlock()
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
	idle := c.idle.isIdle(t)
	var err error
	if idle {
		_, err = outer.Write(goAwayFrame[:])
	}
	t.goAwayMu.Unlock()
	switch {
	case !idle:
		// A stream started first: it is left alone, and the connection
		// is listed again when idle.
		c.idle.cancelGoAway(t)
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
		if c.idle.isIdle(t) {
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

// idleList holds the idle client connections, oldest first.
type idleList struct {
	mu         sync.Mutex
	head, tail *trackedConn
	n          int
}

func (l *idleList) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// push appends t as idle since now (moving it to the back if listed) and
// reports whether it was told to go away.
func (l *idleList) push(t *trackedConn, outer net.Conn, st connState, now time.Time) (goingAway bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t.state == stateGone {
		return false
	}
	t.outer, t.state, t.since = outer, st, now
	t.arriving.Store(false)
	if t.goingAway {
		return true
	}
	if t.listed {
		l.unlink(t)
	}
	t.prev, t.next, t.listed = l.tail, nil, true
	if l.tail != nil {
		l.tail.next = t
	} else {
		l.head = t
	}
	l.tail = t
	l.n++
	return false
}

// remove unlists t, now in state st, and reports whether it was told to go
// away.
func (l *idleList) remove(t *trackedConn, st connState) (goingAway bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if t.state != stateGone {
		t.state = st
	}
	if t.listed {
		l.unlink(t)
	}
	return t.goingAway
}

// cancelGoAway forgets that t was to be told to go away: it turned active
// before the GOAWAY was written.
func (l *idleList) cancelGoAway(t *trackedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t.goingAway = false
}

func (l *idleList) isIdle(t *trackedConn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return t.state == stateIdle
}

func (l *idleList) unlink(t *trackedConn) {
	if t.prev != nil {
		t.prev.next = t.next
	} else {
		l.head = t.next
	}
	if t.next != nil {
		t.next.prev = t.prev
	} else {
		l.tail = t.prev
	}
	t.prev, t.next, t.listed = nil, nil, false
	l.n--
}

// popOldest unlists the connection idle the longest if it has been idle at
// least age; h2 reports that it speaks HTTP/2 (and is to be sent a GOAWAY,
// so it is marked going away).
func (l *idleList) popOldest(now time.Time, age time.Duration) (t *trackedConn, outer net.Conn, h2 bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		t = l.head
		if t == nil || now.Sub(t.since) < age {
			return nil, nil, false
		}
		l.unlink(t)
		outer = t.outer
		// Only a connection past its handshake can be asked its protocol
		// without waiting on the handshake's lock.
		if tc, ok := outer.(*tls.Conn); ok && t.state == stateIdle && tc.ConnectionState().NegotiatedProtocol == "h2" {
			// A GOAWAY is graceful whatever arrives meanwhile (a PING,
			// a stream its client opened first).
			t.goingAway = true
			return t, outer, true
		}
		if !t.arriving.Load() {
			return t, outer, false
		}
		// A handshake or a request is on its way: not idle, and not
		// listed again until its server says it is.
	}
}
