package admission

import (
	"net"
	"net/netip"
	"sync/atomic"
)

// The admin listener's connections (health checks, scrapes, the status
// page) are the edge's own work, not traffic: they are not counted against
// MaxConns, so that a box at its budget still answers its health checks
// and scrapes. Uncounted, though, a flood of them spends the descriptors
// the reserve keeps for edge.db, the routing poll and certificate storage,
// and then the public listeners' accepts and upstream dials fail too. So
// they get a pool of their own out of the reserve (Limits.AdminConns) and,
// within it, these shares, which always bind: the pool is small, and the
// peers it is for need a connection or two each.
//
//   - A peer the admin listener lets read /metrics without the token
//     (loopback, --admin-allow, --trusted-proxies: the caller's
//     mayScrape) may hold an eighth of it, at least 2; such peers
//     together, the whole pool.
//   - Any other peer may only ask /healthz and /readyz, or bring the
//     ingress token: it may hold adminPerOutsider connections, and all of
//     them together a quarter of the pool. A health checker needs no
//     more, and a flood from the internet cannot crowd out the fleet's
//     own checks and scrapes.
//
// A connection past a share is refused as one past a client address's
// share is: held a second, unread, then closed (refused.go), counted as
// scafo_edge_shed_total{reason="admin_conns"}.
const (
	// adminReserveDivisor: the admin pool is an eighth of the reserve (8
	// connections at the smallest reserve of 64, 128 at the largest):
	// half the reserve is the overdraft, a quarter the refused
	// connections' hold, and the rest is the edge's own files and
	// sockets, of which the admin pool takes half.
	adminReserveDivisor = 8
	minAdminConns       = 8
	// adminClientDivisor: one peer allowed /metrics may hold an eighth of
	// the pool, at least 2 (a scrape beside a health check, or a request
	// on a new connection beside the closing one of the last).
	adminClientDivisor = 8
	minAdminPerClient  = 2
	// adminOutsideDivisor: peers not allowed /metrics hold at most a
	// quarter of the pool together (at least 4: half the smallest pool).
	adminOutsideDivisor = 4
	minAdminOutside     = 4
	// adminPerOutsider is two, not one: a checker that asks again at
	// once, on a new connection, may find the last one not closed yet on
	// the edge's side, whose close trails the response it read.
	adminPerOutsider = 2
)

// adminPool counts the admin listener's connections: in all, those of
// peers outside the ones allowed /metrics, and per client address.
type adminPool struct {
	all, outside       atomic.Int64
	maxAll, maxOutside int64
	perClient          uint32
	clients            clientTable
}

func (p *adminPool) init(l Limits, c *Controller) {
	p.maxAll = int64(l.AdminConns)
	p.maxOutside = int64(max(l.AdminConns/adminOutsideDivisor, minAdminOutside))
	p.perClient = uint32(max(l.AdminConns/adminClientDivisor, minAdminPerClient))
	p.clients.init(Limits{MaxConns: l.AdminConns, ConnsPerClient: int(p.perClient)}, c.clock.Now)
}

// take counts a connection from ip (zero: no address known, so counted
// by no address), trusted when it may read /metrics without the token, or
// reports false, counting nothing, when a share it would pass is full.
func (p *adminPool) take(ip netip.Addr, trusted bool) (*clientEntry, bool) {
	if !trusted && !addBelow(&p.outside, p.maxOutside) {
		return nil, false
	}
	if !addBelow(&p.all, p.maxAll) {
		if !trusted {
			p.outside.Add(-1)
		}
		return nil, false
	}
	if !ip.IsValid() {
		return nil, true
	}
	share := p.perClient
	if !trusted {
		share = adminPerOutsider
	}
	e, ok := p.clients.take(clientKey(ip), connUnit, share, true)
	if !ok {
		p.undo(nil, trusted)
		return nil, false
	}
	return e, true
}

// undo gives back a connection take counted.
func (p *adminPool) undo(e *clientEntry, trusted bool) {
	if e != nil {
		p.clients.releaseConn(e)
	}
	if !trusted {
		p.outside.Add(-1)
	}
	p.all.Add(-1)
}

// addBelow adds one to n unless it is at limit already, and reports
// whether it did.
func addBelow(n *atomic.Int64, limit int64) bool {
	for {
		v := n.Load()
		if v >= limit {
			return false
		}
		if n.CompareAndSwap(v, v+1) {
			return true
		}
	}
}

// AdminListener returns l, the admin listener, with its connections kept
// to the admin pool and its shares (above); mayScrape reports whether a
// peer may read /metrics without the token. Wrap the raw listener: the
// peer it counts is the one that connected. Its connections need no
// ConnState: they are never shed, only refused.
func (c *Controller) AdminListener(l net.Listener, mayScrape func(netip.Addr) bool) net.Listener {
	if c == nil {
		return l
	}
	return &adminListener{Listener: l, c: c, mayScrape: mayScrape}
}

type adminListener struct {
	net.Listener
	c         *Controller
	mayScrape func(netip.Addr) bool
}

// Accept returns the next connection within its shares, refusing the
// others as they come: the listener never waits, so a health check within
// its share is answered at once whatever a flood does.
func (l *adminListener) Accept() (net.Conn, error) {
	for {
		conn, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := peerIP(conn.RemoteAddr())
		trusted := ip.IsValid() && l.mayScrape(ip)
		e, ok := l.c.admin.take(ip, trusted)
		if !ok {
			l.c.refuseConn(conn, refusedAdminConns)
			continue
		}
		return &adminConn{Conn: conn, pool: &l.c.admin, client: e, trusted: trusted}, nil
	}
}

// peerIP is a connection's peer address, unmapped and without a zone; the
// zero Addr when it is not an IP address.
func peerIP(a net.Addr) netip.Addr {
	if t, ok := a.(*net.TCPAddr); ok {
		return t.AddrPort().Addr().Unmap().WithZone("")
	}
	return netip.Addr{}
}

// adminConn is a connection of the admin pool; closing it gives its place
// back, once.
type adminConn struct {
	net.Conn
	pool    *adminPool
	client  *clientEntry
	trusted bool
	closed  atomic.Bool
}

// NetConn returns the connection underneath, as tls.Conn's does.
func (a *adminConn) NetConn() net.Conn { return a.Conn }

func (a *adminConn) Close() error {
	err := a.Conn.Close()
	if a.closed.CompareAndSwap(false, true) {
		a.pool.undo(a.client, a.trusted)
	}
	return err
}
