package admission

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

// adminLimits are testLimits with an admin pool of 8: 2 connections for a
// peer allowed /metrics, 4 for all the others together, 2 each.
func adminLimits() Limits {
	l := testLimits(100)
	l.AdminConns = 8
	return l
}

// onlyFrom is a mayScrape that allows the given addresses alone.
func onlyFrom(allowed ...string) func(netip.Addr) bool {
	return func(a netip.Addr) bool {
		for _, s := range allowed {
			if a == netip.MustParseAddr(s) {
				return true
			}
		}
		return false
	}
}

// adminServed dials from ip and reports the connection once it is
// accepted; it fails the test if the connection is refused instead.
func adminServed(t *testing.T, conns <-chan net.Conn, from, addr, what string) net.Conn {
	t.Helper()
	dialFrom(t, from, addr)
	got := accepted(t, conns, what)
	if ip := remoteIP(got); ip != from {
		t.Fatalf("%s: accepted a connection from %s, want %s", what, ip, from)
	}
	return got
}

// adminRefused dials from ip and fails the test unless the edge closes the
// connection (after its hold).
func adminRefused(t *testing.T, from, addr, what string) {
	t.Helper()
	if err := closedByPeer(dialFrom(t, from, addr)); err != nil {
		t.Fatalf("%s: %v, want it refused", what, err)
	}
}

func TestAdminListenerHoldsEachPeerToItsShareOfThePool(t *testing.T) {
	t.Parallel()
	c := newController(t, Options{Limits: adminLimits()})
	c.run(t)
	ln := listen(t)
	conns := acceptLoop(t, c.AdminListener(ln, onlyFrom("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")))
	addr := ln.Addr().String()

	t.Run("a peer allowed metrics holds two connections, and a third is refused on an idle box", func(t *testing.T) {
		first := adminServed(t, conns, "127.0.0.1", addr, "the first connection of 127.0.0.1")
		adminServed(t, conns, "127.0.0.1", addr, "the second connection of 127.0.0.1")
		adminRefused(t, "127.0.0.1", addr, "the third connection of 127.0.0.1")
		if got := c.shed(t, "admin_conns"); got != 1 {
			t.Errorf("scafo_edge_shed_total{reason=admin_conns} = %v, want 1", got)
		}
		first.Close()
		adminServed(t, conns, "127.0.0.1", addr, "a connection of 127.0.0.1 once one of its two closed")
	})
	t.Run("the pool's connections are not the budget's", func(t *testing.T) {
		s := c.Snapshot()
		if s.AdminConns != 2 || s.ClientConns != 0 || s.MaxAdminConns != 8 || s.AdminConnsPerClient != 2 {
			t.Errorf("Snapshot = %d admin connections of %d (%d a peer), %d client ones; want 2 of 8 (2 a peer), 0",
				s.AdminConns, s.MaxAdminConns, s.AdminConnsPerClient, s.ClientConns)
		}
	})
	t.Run("allowed peers together fill the pool, and the next is refused", func(t *testing.T) {
		for _, ip := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
			for i := range 2 {
				adminServed(t, conns, ip, addr, fmt.Sprintf("connection %d of %s", i+1, ip))
			}
		}
		adminRefused(t, "127.0.0.5", addr, "a connection of 127.0.0.5 with the pool full")
		adminRefused(t, "127.0.0.30", addr, "a connection of 127.0.0.30, not allowed /metrics, with the pool full")
		if s := c.Snapshot(); s.AdminConns != 8 || c.admin.outside.Load() != 0 {
			t.Errorf("after refusals with the pool full: %d admin connections, %d from outside; want 8, 0", s.AdminConns, c.admin.outside.Load())
		}
	})
	if n := len(c.log.LogEntries("refusing new connections to the admin listener")); n != 1 {
		t.Errorf("the refusals were logged %d times, want once a minute:\n%s", n, c.log.String())
	}
}

func TestAdminListenerGivesPeersNotAllowedMetricsTwoConnectionsEachAndAQuarterInAll(t *testing.T) {
	t.Parallel()
	c := newController(t, Options{Limits: adminLimits()})
	c.run(t)
	ln := listen(t)
	conns := acceptLoop(t, c.AdminListener(ln, onlyFrom("127.0.0.1")))
	addr := ln.Addr().String()

	for i := range 2 {
		adminServed(t, conns, "127.0.0.20", addr, fmt.Sprintf("connection %d of 127.0.0.20, not allowed /metrics", i+1))
	}
	adminRefused(t, "127.0.0.20", addr, "a third connection of 127.0.0.20")
	adminServed(t, conns, "127.0.0.21", addr, "a connection of 127.0.0.21")
	other := adminServed(t, conns, "127.0.0.21", addr, "a second connection of 127.0.0.21")
	adminRefused(t, "127.0.0.22", addr, "a connection of 127.0.0.22, with four outside connections served")
	adminServed(t, conns, "127.0.0.1", addr, "a connection of 127.0.0.1, allowed /metrics, with the outside share full")
	other.Close()
	adminServed(t, conns, "127.0.0.22", addr, "a connection of 127.0.0.22 once one of 127.0.0.21's closed")
	if got := c.shed(t, "admin_conns"); got != 2 {
		t.Errorf("scafo_edge_shed_total{reason=admin_conns} = %v, want 2", got)
	}
}

func TestAdminListenerIsServedWithTheBudgetSpent(t *testing.T) {
	t.Parallel()
	l := adminLimits()
	l.MaxConns = 16
	c := newController(t, Options{Limits: l})
	c.run(t)
	release := holdUpstreams(t, c.Controller, l.MaxConns)
	defer release()
	ln := listen(t)
	conns := acceptLoop(t, c.AdminListener(ln, onlyFrom("127.0.0.1")))
	adminServed(t, conns, "127.0.0.1", ln.Addr().String(), "a health check with the budget spent")
	if s := c.Snapshot(); s.AcceptPaused || s.ClientConns != 0 {
		t.Errorf("Snapshot after an admin connection at the budget: accept paused %v, %d client connections; want neither", s.AcceptPaused, s.ClientConns)
	}
}

func TestAdminConnectionGivesItsPlaceBackOnce(t *testing.T) {
	t.Parallel()
	c := newController(t, Options{Limits: adminLimits()})
	ln := listen(t)
	conns := acceptLoop(t, c.AdminListener(ln, onlyFrom("127.0.0.1")))
	conn := adminServed(t, conns, "127.0.0.1", ln.Addr().String(), "a connection of 127.0.0.1")
	conn.Close()
	conn.Close()
	testsupport.WaitFor(t, 5*time.Second, "the pool to be empty", func() bool { return c.Snapshot().AdminConns == 0 })
	if n := c.admin.all.Load(); n != 0 {
		t.Errorf("admin connections after two closes of one = %d, want 0", n)
	}
}

func TestDeriveGivesTheAdminListenerAnEighthOfTheReserve(t *testing.T) {
	keepGoMemoryLimit(t)
	for _, tt := range []struct {
		descriptors uint64
		want        Limits
		wantAdmin   int
	}{
		{256, Limits{}, 8},
		{20000, Limits{}, 125},
		{1 << 20, Limits{}, 128},
		{20000, Limits{AdminConns: 3}, 3},
	} {
		t.Run(fmt.Sprintf("%d descriptors, %d asked", tt.descriptors, tt.want.AdminConns), func(t *testing.T) {
			sys := testSystem(env("GOMEMLIMIT", "off"), nil)
			sys.Descriptors = fixedDescriptors(tt.descriptors)
			l, f, err := Derive(tt.want, sys)
			if err != nil {
				t.Fatal(err)
			}
			if l.AdminConns != tt.wantAdmin {
				t.Errorf("AdminConns = %d with a reserve of %d, want %d", l.AdminConns, f.Reserved, tt.wantAdmin)
			}
		})
	}
}
