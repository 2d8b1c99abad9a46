package admission

import (
	"net"
	"net/netip"
	"sync/atomic"
)

// The admin listener's pool and shares: docs/design.md, admission table.
// Its connections are not counted against MaxConns, so that a box at its
// budget still answers its health checks and scrapes.
const (
	adminReserveDivisor = 8
	minAdminConns       = 8
	adminClientDivisor  = 8
	// A scrape beside a health check, or a request on a new connection
	// beside the closing one of the last.
	minAdminPerClient   = 2
	adminOutsideDivisor = 4
	minAdminOutside     = 4 // half the smallest pool
	adminPerOutsider    = 2
)

// adminPool counts the admin listener's connections: in all, those of
// peers not allowed /metrics (outside), and per client address.
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

// take counts a connection from ip (zero: by no address), trusted when it
// may read /metrics without the token, or reports false, counting nothing,
// when a share it would pass is full.
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
// to the admin pool and its shares; mayScrape reports whether a peer may
// read /metrics without the token. Wrap the raw listener. Its connections
// need no ConnState: they are never shed nor waited for, only refused.
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
