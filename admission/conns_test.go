package admission

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/testsupport"
)

func remoteIP(c net.Conn) string {
	return c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap().String()
}

func TestAClientAddressPastItsShareOfConnectionsIsClosedAtOnceOnlyUnderPressure(t *testing.T) {
	t.Parallel()
	l := testLimits(20) // pressure from 18 connections, over under 16
	l.ConnsPerClient = 2
	c := newController(t, Options{Limits: l})
	c.run(t)
	ln := listen(t)
	conns := acceptLoop(t, c.Listener(ln))
	addr := ln.Addr().String()

	// On an idle box a share binds nobody: a NAT's address may hold more.
	var nat []net.Conn
	for i := range 4 {
		dialFrom(t, "127.0.0.1", addr)
		nat = append(nat, accepted(t, conns, fmt.Sprintf("connection %d of 127.0.0.1 on an idle box", i+1)))
	}
	if got := c.shed(t, "client_conns"); got != 0 {
		t.Errorf("scafo_edge_shed_total{reason=client_conns} = %v on an idle box, want 0", got)
	}

	// Under pressure the address past its share is refused new
	// connections; one within its share is not.
	release := holdUpstreams(t, c.Controller, 14)
	if s := c.Snapshot(); !s.SharesBind {
		t.Fatalf("Snapshot at %d of %d connections: shares do not bind", s.ClientConns+s.UpstreamConns, l.MaxConns)
	}
	for i := range 2 {
		extra := dialFrom(t, "127.0.0.1", addr)
		if err := closedByPeer(extra); err != nil {
			t.Fatalf("connection %d of 127.0.0.1, past its share of 2 under pressure: %v", i+5, err)
		}
	}
	dialFrom(t, "127.0.0.2", addr)
	if got := accepted(t, conns, "a connection of 127.0.0.2"); remoteIP(got) != "127.0.0.2" {
		t.Fatalf("the next connection accepted is from %s, want 127.0.0.2 (one past its share was handed over)", remoteIP(got))
	}
	if got := c.shed(t, "client_conns"); got != 2 {
		t.Errorf("scafo_edge_shed_total{reason=client_conns} = %v, want 2", got)
	}
	if n := len(c.log.LogEntries("holds its share of connections")); n != 1 {
		t.Errorf("closed connections logged %d times, want once a minute:\n%s", n, c.log.String())
	}
	if s := c.Snapshot(); s.ClientConns != 5 || s.Clients != 2 {
		t.Errorf("Snapshot = %d connections of %d addresses, want 5 of 2", s.ClientConns, s.Clients)
	}

	// Down to its share, it is still refused while the pressure lasts.
	nat[0].Close()
	nat[1].Close()
	if err := closedByPeer(dialFrom(t, "127.0.0.1", addr)); err != nil {
		t.Fatalf("a connection of 127.0.0.1 at its share, under pressure: %v", err)
	}
	// Once the pressure is over, it may pass its share again.
	release()
	testsupport.WaitFor(t, 10*time.Second, "the shares to stop binding", func() bool { return !c.Snapshot().SharesBind })
	dialFrom(t, "127.0.0.1", addr)
	if got := accepted(t, conns, "a connection of 127.0.0.1 past its share once the pressure is over"); remoteIP(got) != "127.0.0.1" {
		t.Fatalf("accepted a connection from %s, want 127.0.0.1", remoteIP(got))
	}
}

// holdUpstreams counts n connections to an upstream (pipes) against c's
// budget until release is called or the test ends: a test's way to put the
// box under pressure.
func holdUpstreams(t testing.TB, c *Controller, n int) (release func()) {
	t.Helper()
	var held []net.Conn
	for range n {
		a, b := net.Pipe()
		held = append(held, trackUpstream(t, c, a), b)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			for _, conn := range held {
				conn.Close()
			}
		})
	}
	t.Cleanup(release)
	return release
}

func TestAProxysConnectionsCountAgainstTheBudgetButNotAsOneClients(t *testing.T) {
	t.Parallel()
	l := testLimits(100)
	l.ConnsPerClient = 1
	c := newController(t, Options{Limits: l, Proxies: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
	ln := listen(t)
	conns := acceptLoop(t, c.Listener(ln))
	for range 3 {
		dialFrom(t, "127.0.0.1", ln.Addr().String())
		accepted(t, conns, "a connection from the proxy")
	}
	if s := c.Snapshot(); s.ClientConns != 3 || s.Clients != 0 {
		t.Errorf("Snapshot = %d connections of %d addresses, want 3 counted against the budget, none per address", s.ClientConns, s.Clients)
	}
}

func TestAtTheConnectionBudgetTheListenerStopsAcceptingUntilAConnectionCloses(t *testing.T) {
	cases := []struct {
		name string
		// hold takes the budget's last descriptor and returns what gives it
		// back.
		hold func(t *testing.T, c *testController, addr string, conns <-chan net.Conn) io.Closer
	}{
		{
			name: "a client connection closing",
			hold: func(t *testing.T, c *testController, addr string, conns <-chan net.Conn) io.Closer {
				dialFrom(t, "127.0.0.1", addr)
				return accepted(t, conns, "a client connection")
			},
		},
		{
			name: "an upstream connection closing",
			hold: func(t *testing.T, c *testController, _ string, _ <-chan net.Conn) io.Closer {
				up := listen(t)
				return trackUpstream(t, c.Controller, dialFrom(t, "127.0.0.1", up.Addr().String()))
			},
		},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newController(t, Options{Limits: testLimits(2)})
			ln := listen(t)
			conns := acceptLoop(t, c.Listener(ln))
			addr := ln.Addr().String()
			// The budget is spent before the accept loop asks for more: an
			// Accept already parked in the kernel's accept when an upstream
			// connection takes the last descriptor takes one connection more.
			last := tt.hold(t, c, addr, conns)
			dialFrom(t, "127.0.0.1", addr)
			accepted(t, conns, "the other client connection")

			// The kernel completes the handshake; the edge does not accept.
			waiting := dialFrom(t, "127.0.0.1", addr)
			testsupport.WaitFor(t, 10*time.Second, "the listener to stop accepting", func() bool { return c.Snapshot().AcceptPaused })
			select {
			case got := <-conns:
				t.Fatalf("accepted a connection from %s past the budget", got.RemoteAddr())
			default:
			}
			if got := c.metric(t, "scafo_edge_accept_pauses_total", nil); got != 1 {
				t.Errorf("scafo_edge_accept_pauses_total = %v, want 1", got)
			}
			if got := c.metric(t, "scafo_edge_conns_limit", nil); got != 2 {
				t.Errorf("scafo_edge_conns_limit = %v, want 2", got)
			}

			last.Close()
			got := accepted(t, conns, "the waiting connection once one closed")
			if got.RemoteAddr().String() != waiting.LocalAddr().String() {
				t.Errorf("accepted %s, want the waiting %s", got.RemoteAddr(), waiting.LocalAddr())
			}
		})
	}
}

// budgetSpent returns a controller (on clk) whose budget of 2 is spent by
// two accepted connections, and its listener with an Accept holding a third
// and waiting for room; the connection it returns is closed and its error
// arrives on the channel returned.
func budgetSpent(t *testing.T, clk *clock.Fake) (*testController, net.Listener, []net.Conn, <-chan error) {
	t.Helper()
	c := newController(t, Options{Limits: testLimits(2), Clock: clk})
	ln := listen(t)
	cl := c.Listener(ln)
	t.Cleanup(func() { cl.Close() })
	var held []net.Conn
	for range 2 {
		dialFrom(t, "127.0.0.1", ln.Addr().String())
		conn, err := cl.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		held = append(held, conn)
	}
	errc := make(chan error, 1)
	go func() {
		conn, err := cl.Accept()
		if conn != nil {
			conn.Close()
		}
		errc <- err
	}()
	dialFrom(t, "127.0.0.1", ln.Addr().String())
	testsupport.WaitFor(t, 10*time.Second, "Accept to wait for room", func() bool { return c.Snapshot().AcceptPaused })
	return c, cl, held, errc
}

// An upgrade closes the listener to hand its socket on: a connection the
// edge already accepted is served, not dropped, even past the budget.
func TestClosingTheListenerReturnsTheConnectionAnAcceptHeldWaitingForRoom(t *testing.T) {
	t.Parallel()
	_, cl, _, errc := budgetSpent(t, newFakeClock())
	cl.Close()
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("Accept after Close = %v, want the connection it held", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Accept still waits for room 10s after its listener closed")
	}
}

func TestAnAcceptEndedByItsListenerClosingLeavesNoPauseBehind(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	c, cl, held, errc := budgetSpent(t, clk)
	c.run(t)
	testsupport.WaitFor(t, 10*time.Second, "an episode of pressure to start", func() bool { return c.Snapshot().Pressure })
	cl.Close()
	select {
	case <-errc:
	case <-time.After(10 * time.Second):
		t.Fatal("Accept still waits for room 10s after its listener closed")
	}
	for _, conn := range held {
		conn.Close()
	}
	if s := c.Snapshot(); s.AcceptPaused {
		t.Errorf("Snapshot().AcceptPaused = true with no Accept waiting (its listener closed)")
	}
	// With no connection left, the episode ends once calm for long enough
	// (calmFor of the controller's clock, moved on here).
	ended := testsupport.Poll(3*time.Second, func() bool {
		clk.Advance(100 * time.Millisecond)
		return !c.Snapshot().Pressure
	})
	if !ended {
		t.Errorf("pressure still on after every connection closed and far more than calmFor of the controller's clk: %+v", c.Snapshot())
	}
}

func TestClosingATrackedConnectionTwiceGivesItsDescriptorBackOnce(t *testing.T) {
	t.Parallel()
	c := newController(t, Options{Limits: testLimits(100)})
	ln := listen(t)
	conns := acceptLoop(t, c.Listener(ln))
	for range 2 {
		dialFrom(t, "127.0.0.1", ln.Addr().String())
	}
	a := accepted(t, conns, "first connection")
	accepted(t, conns, "second connection")
	a.Close()
	a.Close()
	if s := c.Snapshot(); s.ClientConns != 1 || s.Clients != 1 {
		t.Errorf("Snapshot = %d connections of %d addresses after one closed twice, want 1 of 1", s.ClientConns, s.Clients)
	}
	if got := c.metric(t, "scafo_edge_conns", testsupport.Labels{"kind": "client"}); got != 1 {
		t.Errorf("scafo_edge_conns{kind=client} = %v, want 1", got)
	}
}

func TestAnUpstreamConnectionIsCountedUntilItCloses(t *testing.T) {
	up := listen(t)
	cases := []struct {
		name        string
		dial        func(t *testing.T) net.Conn
		wantSyscall bool
	}{
		{
			name:        "a TCP connection keeps its descriptor reachable for the pool's peek",
			dial:        func(t *testing.T) net.Conn { return dialFrom(t, "127.0.0.1", up.Addr().String()) },
			wantSyscall: true,
		},
		{
			name: "a connection without a descriptor stays without one",
			dial: func(t *testing.T) net.Conn {
				a, b := net.Pipe()
				t.Cleanup(func() { b.Close() })
				go io.Copy(io.Discard, b)
				return a
			},
		},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			// A budget of 1: upstream connections go past it, into the
			// overdraft.
			l := testLimits(1)
			l.Overdraft = 2
			c := newController(t, Options{Limits: l})
			var tracked []net.Conn
			for range 3 {
				tracked = append(tracked, trackUpstream(t, c.Controller, tt.dial(t)))
			}
			if s := c.Snapshot(); s.UpstreamConns != 3 || s.ClientConns != 0 {
				t.Errorf("Snapshot = %d upstream, %d client connections; want 3 and 0", s.UpstreamConns, s.ClientConns)
			}
			if got := c.metric(t, "scafo_edge_conns", testsupport.Labels{"kind": "upstream"}); got != 3 {
				t.Errorf("scafo_edge_conns{kind=upstream} = %v, want 3", got)
			}
			sc, ok := tracked[0].(syscall.Conn)
			if ok != tt.wantSyscall {
				t.Fatalf("tracked connection is a syscall.Conn: %v, want %v", ok, tt.wantSyscall)
			}
			if ok {
				rc, err := sc.SyscallConn()
				if err != nil {
					t.Fatal(err)
				}
				var fd uintptr
				if err := rc.Control(func(f uintptr) { fd = f }); err != nil || fd == 0 {
					t.Errorf("Control = fd %d, %v; want the connection's descriptor", fd, err)
				}
			}
			if _, err := tracked[0].Write([]byte("ping")); err != nil {
				t.Errorf("write through the tracked connection: %v", err)
			}
			for _, conn := range tracked {
				conn.Close()
				conn.Close()
			}
			if s := c.Snapshot(); s.UpstreamConns != 0 {
				t.Errorf("Snapshot = %d upstream connections once all closed (twice), want 0", s.UpstreamConns)
			}
		})
	}
}

func TestConnStateIgnoresAConnectionTheListenerDidNotCount(t *testing.T) {
	c := newController(t, Options{Limits: testLimits(100)})
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	for _, st := range []http.ConnState{http.StateNew, http.StateActive, http.StateIdle, http.StateClosed} {
		c.ConnState(a, st)
	}
	if s := c.Snapshot(); s.IdleConns != 0 || s.ClientConns != 0 {
		t.Errorf("Snapshot = %d idle of %d connections, want nothing counted", s.IdleConns, s.ClientConns)
	}
}

// closeHookConn runs onClose, once, when it is first closed, before the
// connection goes.
type closeHookConn struct {
	net.Conn
	closed  atomic.Bool
	onClose func()
}

func (h *closeHookConn) Close() error {
	if h.closed.CompareAndSwap(false, true) {
		h.onClose()
	}
	return h.Conn.Close()
}

// Shedding closes a connection and counts at once what that freed: the
// server's goroutine, woken by the close, closes it too, and must not be
// the one that gives the descriptor back later, or the shedder, still
// counting it, closes one more than needed.
func TestTheCloseThatClosesAConnectionGivesItsDescriptorBack(t *testing.T) {
	t.Parallel()
	c := newController(t, Options{Limits: testLimits(20)})
	ln := c.Listener(listen(t))
	dialFrom(t, "127.0.0.1", ln.Addr().String())
	conn, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	tc := conn.(*trackedConn)
	var inServersClose int64
	tc.Conn = &closeHookConn{Conn: tc.Conn, onClose: func() {
		// The server's goroutine sees its read fail and closes the
		// connection too, before the shedder's Close returns.
		done := make(chan struct{})
		go func() {
			defer close(done)
			tc.Close()
		}()
		<-done
		inServersClose = c.clientConns.Load()
	}}
	conn.Close()
	if got := c.clientConns.Load(); got != 0 {
		t.Errorf("client connections counted after Close returned = %d, want 0", got)
	}
	if inServersClose != 1 {
		t.Errorf("client connections counted when the server's own Close returned, the shedder's still running = %d, want 1: the shedder's Close gives it back", inServersClose)
	}
}

// Requests admitted together dial together: past the budget and its
// overdraft a dial is not made, whatever Admit saw, and the refusal names
// EMFILE so that the upstream is not blamed; a dial that fails gives its
// descriptor back.
func TestAnUpstreamDialPastTheOverdraftIsNotMade(t *testing.T) {
	l := testLimits(2)
	l.Overdraft = 1
	c := newController(t, Options{Limits: l})
	for range 3 {
		trackUpstream(t, c.Controller, pipeEnd(t))
	}
	dialled := false
	_, err := c.DialUpstream(func() (net.Conn, error) { dialled = true; return pipeEnd(t), nil })
	if !errors.Is(err, ErrNoDescriptor) || !errors.Is(err, syscall.EMFILE) || dialled {
		t.Fatalf("a fourth dial past a budget of 2 and an overdraft of 1: err %v, dialled %v; want ErrNoDescriptor (EMFILE), not dialled", err, dialled)
	}
	if got := c.Snapshot().UpstreamConns; got != 3 {
		t.Errorf("upstream connections counted after the refusal = %d, want 3", got)
	}
	if got := c.shed(t, "budget"); got != 1 {
		t.Errorf("scafo_edge_shed_total{reason=budget} = %v, want 1", got)
	}

	c2 := newController(t, Options{Limits: l})
	refused := errors.New("connection refused")
	if _, err := c2.DialUpstream(func() (net.Conn, error) { return nil, refused }); !errors.Is(err, refused) {
		t.Fatalf("a failed dial: err %v, want the dial's", err)
	}
	if got := c2.Snapshot().UpstreamConns; got != 0 {
		t.Errorf("upstream connections counted after a failed dial = %d, want 0", got)
	}
}

// pipeEnd is one end of a pipe whose other end reads and discards.
func pipeEnd(t *testing.T) net.Conn {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	go io.Copy(io.Discard, b)
	return a
}

// At the limit a dial first frees a descriptor as Admit would, closing
// the idle pooled upstream connections, and is made if that freed one.
func TestAnUpstreamDialAtTheLimitClosesIdleUpstreamsFirst(t *testing.T) {
	l := testLimits(2)
	l.Overdraft = 1
	var idle []net.Conn
	c := newController(t, Options{Limits: l, CloseIdleUpstreams: func(time.Duration) {
		for _, conn := range idle {
			conn.Close()
		}
		idle = nil
	}})
	for range 3 {
		idle = append(idle, trackUpstream(t, c.Controller, pipeEnd(t)))
	}
	if _, err := c.DialUpstream(func() (net.Conn, error) { return pipeEnd(t), nil }); err != nil {
		t.Fatalf("a dial at the limit with idle upstream connections to close: %v", err)
	}
	if got := c.Snapshot().UpstreamConns; got != 1 {
		t.Errorf("upstream connections counted = %d, want the new one only", got)
	}
}
