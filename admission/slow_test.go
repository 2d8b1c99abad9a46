package admission

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/testsupport"
)

// slowHeaders is the start of a request whose headers never end, as a
// slowloris sends it.
const slowHeaders = "GET / HTTP/1.1\r\nHost: app.example\r\nX-Slow: a"

// arrivingFirst counts the connections on their first request whose bytes
// have begun to arrive.
func (tc *testController) arrivingFirst() int {
	n := 0
	tc.conns.each(func(t *trackedConn, _ net.Conn) {
		if connState(t.state.Load()) == stateNew && t.arriving.Load() {
			n++
		}
	})
	return n
}

// arriving reports whether the edge has read the first bytes of conn, a
// client's connection, which is on its first request.
func (tc *testController) arriving(conn net.Conn) bool {
	found := false
	tc.conns.each(func(t *trackedConn, _ net.Conn) {
		found = found || t.RemoteAddr().String() == conn.LocalAddr().String() && connState(t.state.Load()) == stateNew && t.arriving.Load()
	})
	return found
}

// slowFrom opens a connection from the loopback address from that sends
// the start of its first request's headers and no more, and waits for the
// edge to have read them; the clock moves a millisecond after, so that
// connections opened one after the other are oldest first.
func slowFrom(t *testing.T, c *testController, clk interface{ Advance(time.Duration) }, from, addr string) net.Conn {
	t.Helper()
	conn := dialFrom(t, from, addr)
	if _, err := io.WriteString(conn, slowHeaders); err != nil {
		t.Fatalf("the first bytes of a connection of %s: %v", from, err)
	}
	testsupport.WaitFor(t, 10*time.Second, "the edge to read a slow connection's first bytes", func() bool {
		return c.arriving(conn)
	})
	clk.Advance(time.Millisecond)
	return conn
}

// finish sends the end of a slow connection's headers and reads the answer.
func finish(conn net.Conn) error {
	if _, err := io.WriteString(conn, "\r\n\r\n"); err != nil {
		return err
	}
	h := &h1Client{conn: conn, br: bufio.NewReader(conn)}
	_, err := h.read()
	return err
}

// servedController starts a running controller of l on the fake clock it
// returns, and a server counted by it, on a PlainListener if plain (its
// first heads awaited outside the server); addr is where it listens.
func servedController(t *testing.T, l Limits, plain ...bool) (c *testController, clk *clock.Fake, addr string) {
	t.Helper()
	clk = newFakeClock()
	c = newController(t, Options{Limits: l, Clock: clk})
	c.run(t)
	ln := listen(t)
	if len(plain) > 0 && plain[0] {
		serveOn(t, c.Controller, c.PlainListener(ln, time.Hour, false), newGate(t).handler())
	} else {
		serve(t, c.Controller, ln, newGate(t).handler(), nil)
	}
	return c, clk, ln.Addr().String()
}

// At the budget, a connection still on its first request after slowAge is
// room for a new one, one for each connection accepted: those of addresses
// at or past their share first, down to under it, each oldest first; then
// the others oldest first; never a visitor's fresh one.
// On a plain listener the slow ones wait outside the server (heads.go),
// and make room alike.
func TestAtTheBudgetSlowFirstRequestsMakeRoomAddressesAtTheirShareFirstOldestFirst(t *testing.T) {
	t.Parallel()
	for _, plain := range []bool{false, true} {
		t.Run(fmt.Sprintf("plain=%v", plain), func(t *testing.T) {
			t.Parallel()
			const maxConns = 6
			l := testLimits(maxConns)
			l.ConnsPerClient = 2
			c, clk, addr := servedController(t, l, plain)
			slowFirstRequestsMakeRoom(t, c, clk, addr)
		})
	}
}

func slowFirstRequestsMakeRoom(t *testing.T, c *testController, clk *clock.Fake, addr string) {

	conns := map[string]net.Conn{}
	conns["B1"] = slowFrom(t, c, clk, "127.0.0.3", addr) // the oldest, of an address under its share
	for i := range 4 {                                   // two past the share of 2
		conns[fmt.Sprintf("A%d", i+1)] = slowFrom(t, c, clk, "127.0.0.2", addr)
	}
	clk.Advance(2 * slowAge)
	conns["V"] = slowFrom(t, c, clk, "127.0.0.4", addr) // a visitor's, its request on its way

	// A down to under its share, oldest first; then the oldest of the
	// rest, B1 (before A4). Accept makes room as soon as it is called at
	// the budget: each is closed before the new connection that takes its
	// place arrives.
	for i, want := range []string{"A1", "A2", "A3", "B1", "A4"} {
		next := dialH1At(t, fmt.Sprintf("127.0.1.%d", i+1), addr)
		if _, err := next.get("/"); err != nil {
			t.Fatalf("new connection %d at the budget: %v", i+1, err)
		}
		if err := closedByPeer(conns[want]); err != nil {
			t.Fatalf("new connection %d at the budget: %s, the next slow one, %v", i+1, want, err)
		}
	}
	if got := c.shed(t, "slow_headers"); got != 5 {
		t.Errorf("scafo_edge_shed_total{reason=slow_headers} = %v, want 5", got)
	}
	// Only the visitor's connection and the new ones are left, all
	// younger than any age that makes them room: the next waits.
	last := dialH1At(t, "127.0.1.100", addr)
	testsupport.WaitFor(t, 10*time.Second, "Accept to wait for room", func() bool { return c.Snapshot().AcceptPaused })
	if err := finish(conns["V"]); err != nil {
		t.Errorf("the visitor's request, arriving while the budget was spent: %v, want it answered", err)
	}
	conns["V"].Close()
	if _, err := last.get("/"); err != nil {
		t.Errorf("the connection that waited for room: %v", err)
	}
}

// dialH1At is dialH1 from the loopback address from.
func dialH1At(t *testing.T, from, addr string) *h1Client {
	t.Helper()
	conn := dialFrom(t, from, addr)
	return &h1Client{conn: conn, br: bufio.NewReader(conn)}
}

// A slowloris reconnects as soon as one of its connections is closed: at
// the budget, slow first requests are closed for room no faster than
// slowShed allows, and Accept waits for the next one meanwhile.
func TestAtTheBudgetSlowFirstRequestsAreClosedNoFasterThanTheirRate(t *testing.T) {
	t.Parallel()
	const maxConns = 24
	c, clk, addr := servedController(t, testLimits(maxConns))
	for range maxConns {
		slowFrom(t, c, clk, "127.0.0.2", addr)
	}
	clk.Advance(2 * slowAge)
	burst := c.slowShed.Burst()
	if burst >= maxConns {
		t.Fatalf("burst %d: the test needs fewer than %d", burst, maxConns)
	}
	for i := range burst {
		h := dialH1At(t, "127.0.0.3", addr)
		if _, err := h.get("/"); err != nil {
			t.Fatalf("new connection %d of a burst of %d: %v", i+1, burst, err)
		}
	}
	next := dialH1At(t, "127.0.0.3", addr)
	testsupport.WaitFor(t, 10*time.Second, "Accept to wait for the rate", func() bool { return c.Snapshot().AcceptPaused })
	if got := c.shed(t, "slow_headers"); int(got) != burst {
		t.Errorf("scafo_edge_shed_total{reason=slow_headers} = %v, want the burst, %d", got, burst)
	}
	clk.Advance(time.Duration(float64(time.Second) / float64(c.slowShed.Limit())))
	if _, err := next.get("/"); err != nil {
		t.Errorf("the connection past the burst, once the rate allows: %v", err)
	}
	if got := c.shed(t, "slow_headers"); int(got) != burst+1 {
		t.Errorf("scafo_edge_shed_total{reason=slow_headers} = %v, want %d", got, burst+1)
	}
}

// Under pressure short of the budget, slow first requests are left to
// --read-header-timeout: closed in bulk, a slowloris's connections would
// all come back at once. Silent connections, idle, are closed meanwhile.
func TestUnderPressureSlowFirstRequestsAreNotClosedInBulk(t *testing.T) {
	t.Parallel()
	c, clk, conns := silentConnections(t)
	slow := conns[:shedHigh/2]
	for i, conn := range slow {
		if _, err := io.WriteString(conn, slowHeaders); err != nil {
			t.Fatalf("connection %d: %v", i+1, err)
		}
	}
	testsupport.WaitFor(t, 10*time.Second, "the edge to read every slow connection's first bytes", func() bool {
		return c.arrivingFirst() == len(slow)
	})
	c.waitPressure(t)
	clk.Advance(pressureIdleTimeout + time.Second)
	// The oldest silent ones go, down to under the low-water mark.
	for i, conn := range conns[len(slow) : len(slow)+shedHigh-shedLow+1] {
		if err := closedByPeer(conn); err != nil {
			t.Errorf("silent connection %d, idle under pressure: %v", i+1, err)
		}
	}
	for i, conn := range slow {
		if err := finish(conn); err != nil {
			t.Errorf("slow connection %d, its headers arriving for %v under pressure: %v, want it answered", i+1, pressureIdleTimeout+time.Second, err)
		}
	}
	if got := c.shed(t, "slow_headers"); got != 0 {
		t.Errorf("scafo_edge_shed_total{reason=slow_headers} = %v, want 0 short of the budget", got)
	}
}

// An office's NAT on an idle box: many keep-alive connections from one
// address, past its share, some slow to send their first request, are all
// served and none is closed.
func TestOnAnIdleBoxANATsConnectionsAreUntouched(t *testing.T) {
	t.Parallel()
	const maxConns, nat = 40, 24 // under the high-water mark, 36
	l := testLimits(maxConns)
	l.ConnsPerClient = 2
	c, clk, addr := servedController(t, l)
	var conns []net.Conn
	for range nat {
		conns = append(conns, slowFrom(t, c, clk, "127.0.0.2", addr))
	}
	clk.Advance(pressureIdleTimeout + time.Second)
	for round := range 3 {
		for i, conn := range conns {
			var err error
			if round == 0 {
				err = finish(conn)
			} else {
				_, err = (&h1Client{conn: conn, br: bufio.NewReader(conn)}).get("/")
			}
			if err != nil {
				t.Fatalf("round %d, connection %d of the NAT: %v", round+1, i+1, err)
			}
		}
		clk.Advance(pressureIdleTimeout + time.Second)
	}
	if s := c.Snapshot(); s.Pressure || s.SharesBind || s.ClientConns != nat {
		t.Errorf("Snapshot = pressure %v, shares bind %v, %d connections; want neither, %d", s.Pressure, s.SharesBind, s.ClientConns, nat)
	}
	for _, r := range []string{"idle_closed", "slow_headers", "client_conns"} {
		if got := c.shed(t, r); got != 0 {
			t.Errorf("scafo_edge_shed_total{reason=%s} = %v, want 0 on an idle box", r, got)
		}
	}
}

// A request at the budget takes room for its upstream leg from an idle
// connection, or the overdraft, but not from a slow first request: the
// slowloris would reconnect into the room before the leg is dialed.
func TestAtTheBudgetARequestDoesNotCloseASlowFirstRequest(t *testing.T) {
	t.Parallel()
	const maxConns = 4
	clk := newFakeClock()
	l := testLimits(maxConns)
	l.Overdraft = 2
	c := newController(t, Options{Limits: l, Clock: clk})
	ln := listen(t)
	cl := c.Listener(ln)
	t.Cleanup(func() { cl.Close() })
	var clients []net.Conn
	for range maxConns {
		client := dialFrom(t, "127.0.0.2", ln.Addr().String())
		conn, err := cl.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		c.ConnState(conn, http.StateNew)
		if _, err := io.WriteString(client, slowHeaders); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(conn, make([]byte, len(slowHeaders))); err != nil {
			t.Fatal(err)
		}
		clients = append(clients, client)
		clk.Advance(time.Millisecond)
	}
	clk.Advance(2 * slowAge)
	c.shedMu.Lock()
	c.makePlan(clk.Now())
	slow := len(c.plan.slow)
	c.shedMu.Unlock()
	if slow != maxConns {
		t.Fatalf("%d slow first requests in the plan, want %d", slow, maxConns)
	}
	k, why := c.Admit(request("192.0.2.1:1"), "app")
	if why != Admitted {
		t.Fatalf("a request at the budget, within the overdraft = %v, want admitted", why)
	}
	k.Release()
	if got := c.shed(t, "slow_headers"); got != 0 {
		t.Errorf("scafo_edge_shed_total{reason=slow_headers} = %v, want 0: a request closes none", got)
	}
	if s := c.Snapshot(); s.ClientConns != maxConns {
		t.Errorf("Snapshot = %d connections, want all %d slow ones still open", s.ClientConns, maxConns)
	}
	// An Accept at the budget does close one.
	if ok, _, _ := c.makeRoom(nil); !ok {
		t.Error("makeRoom at the budget with slow first requests: no room, want one closed")
	}
	if err := closedByPeer(clients[0]); err != nil {
		t.Errorf("the oldest slow first request, after makeRoom: %v", err)
	}
}

// monitoredConns is a controller of maxConns connections driven by hand
// (step), and a listener counted by it whose connections are accepted one
// at a time (open).
type monitoredConns struct {
	*testController
	clk *clock.Fake
	cl  net.Listener
	ln  net.Listener
}

func newMonitoredConns(t *testing.T, maxConns int) *monitoredConns {
	t.Helper()
	clk := newFakeClock()
	c := newController(t, Options{Limits: testLimits(maxConns), Clock: clk})
	ln := listen(t)
	cl := c.Listener(ln)
	t.Cleanup(func() { cl.Close() })
	return &monitoredConns{testController: c, clk: clk, cl: cl, ln: ln}
}

// open accepts a connection that sends first (nothing: an idle one) and
// returns its client's end once the server has read it.
func (m *monitoredConns) open(t *testing.T, first string) net.Conn {
	t.Helper()
	client := dialFrom(t, "127.0.0.2", m.ln.Addr().String())
	t.Cleanup(func() { client.Close() })
	conn, err := m.cl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	m.ConnState(conn, http.StateNew)
	if first != "" {
		if _, err := io.WriteString(client, first); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(conn, make([]byte, len(first))); err != nil {
			t.Fatal(err)
		}
	}
	return client
}

// planMade returns the wall time the plan was made at.
func (m *monitoredConns) planMade() time.Time {
	m.shedMu.Lock()
	defer m.shedMu.Unlock()
	return m.plan.built
}

// tick moves both clocks a monitor tick on, the fake one and the wall
// time the plan was made at, and runs the monitor once.
func (m *monitoredConns) tick() {
	m.shedMu.Lock()
	m.plan.built = m.plan.built.Add(-tick)
	m.shedMu.Unlock()
	m.clk.Advance(tick)
	m.step()
}

// Under pressure, with nothing idle to close (a slowloris at the budget),
// the monitor walks the connections for a plan once a monitorPlanEvery,
// not at each of its ticks: under 19,000 trickling connections the walk
// was a fifth of the edge's CPU.
func TestTheMonitorRemakesAPlanWithNothingToShedOnceASecond(t *testing.T) {
	t.Parallel()
	const maxConns = 4
	m := newMonitoredConns(t, maxConns)
	for range maxConns {
		m.open(t, slowHeaders)
	}
	m.clk.Advance(2 * slowAge)
	m.step()
	first := m.planMade()
	if first.IsZero() {
		t.Fatal("no plan made under pressure")
	}
	if s := m.Snapshot(); !s.Pressure || s.ClientConns != maxConns {
		t.Fatalf("Snapshot = pressure %v, %d connections; want pressure, all %d slow ones open", s.Pressure, s.ClientConns, maxConns)
	}
	for i := 1; time.Duration(i)*tick < monitorPlanEvery; i++ {
		m.tick()
		if got, want := m.planMade(), first.Add(-time.Duration(i)*tick); !got.Equal(want) {
			t.Fatalf("tick %d, %v after the plan: plan remade, want it kept for %v", i, time.Duration(i)*tick, monitorPlanEvery)
		}
	}
	m.tick()
	if got := m.planMade(); !got.After(first) {
		t.Errorf("%v after the plan: not remade, want a new one", monitorPlanEvery)
	}
}

// Under pressure, idle connections that arrive after a plan that found
// many are closed at the monitor's next tick, not a second later: arriving
// faster than one plan a second closes them, they would take the box to
// the budget, where slow first requests would be closed for room.
func TestTheMonitorClosesIdleArrivalsAtItsNextTick(t *testing.T) {
	t.Parallel()
	const maxConns = 8 // low water at 6.4
	m := newMonitoredConns(t, maxConns)
	for range 6 {
		m.open(t, slowHeaders)
	}
	m.open(t, "")
	m.open(t, "")
	m.clk.Advance(2 * slowAge)
	// At the budget: the idle two go, the slow ones stay.
	m.step()
	if s := m.Snapshot(); !s.Pressure || s.ClientConns != 6 {
		t.Fatalf("Snapshot after the first tick = pressure %v, %d connections; want pressure, the 6 slow ones", s.Pressure, s.ClientConns)
	}
	// Two more arrive and go idle: at the budget again.
	late := []net.Conn{m.open(t, ""), m.open(t, "")}
	m.clk.Advance(minIdleAge)
	m.tick()
	for i, conn := range late {
		if err := closedByPeer(conn); err != nil {
			t.Errorf("idle connection %d, arrived after the plan, a tick later: %v", i+1, err)
		}
	}
	if got := m.shed(t, "slow_headers"); got != 0 {
		t.Errorf("scafo_edge_shed_total{reason=slow_headers} = %v, want 0", got)
	}
}
