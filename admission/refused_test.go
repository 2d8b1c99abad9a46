package admission

import (
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

// At the budget a slowloris's addresses each hold their share. Once a
// visitor has taken the room of one of their slow first requests, the
// address it was of reconnects at once: that connection must not take the
// room of another address's slow first request (whose reconnection would
// take the next, a close and an accept at a time, serving nobody), nor of
// a visitor's idle connection. It is refused instead.
func TestAtTheBudgetASlowlorisReconnectionTakesNoOtherAddressesRoom(t *testing.T) {
	t.Parallel()
	l := testLimits(6)
	l.ConnsPerClient = 3
	c, clk, addr := servedController(t, l)
	conns := map[string]net.Conn{}
	for _, name := range []string{"A1", "B1", "A2", "B2", "A3", "B3"} {
		from := map[byte]string{'A': "127.0.0.2", 'B': "127.0.0.3"}[name[0]]
		conns[name] = slowFrom(t, c, clk, from, addr)
	}
	clk.Advance(2 * slowAge)

	// At its share, an address is refused outright.
	past := dialFrom(t, "127.0.0.2", addr)
	testsupport.WaitFor(t, 10*time.Second, "the connection past the share to be refused", func() bool {
		return c.shed(t, "client_conns") == 1
	})
	// A visitor takes the room of the oldest slow first request.
	visitor := dialH1At(t, "127.0.0.4", addr)
	if _, err := visitor.get("/"); err != nil {
		t.Fatalf("a visitor at the budget: %v", err)
	}
	if err := closedByPeer(conns["A1"]); err != nil {
		t.Fatalf("A1, the oldest slow first request, once a visitor came: %v", err)
	}
	clk.Advance(minIdleAge) // the visitor's connection is idle long enough to shed

	again := dialFrom(t, "127.0.0.2", addr)
	testsupport.WaitFor(t, 10*time.Second, "the slowloris's reconnection to be refused", func() bool {
		return c.shed(t, "client_slow_headers") == 1
	})
	if got := c.shed(t, "slow_headers"); got != 1 {
		t.Errorf("scafo_edge_shed_total{reason=slow_headers} = %v, want 1 (the visitor's room only)", got)
	}
	if got := c.arrivingFirst(); got != 5 {
		t.Errorf("%d slow first requests left, want A2, A3 and B1 to B3", got)
	}
	if _, err := visitor.get("/"); err != nil {
		t.Errorf("the visitor's idle connection after the slowloris reconnected: %v", err)
	}
	if s := c.Snapshot(); s.AcceptPaused {
		t.Error("Snapshot().AcceptPaused after the reconnection was refused, want false: it waits for nothing")
	}

	clk.Advance(refuseHold)
	for name, conn := range map[string]net.Conn{"past its share": past, "the reconnection": again} {
		if err := closedByPeer(conn); err != nil {
			t.Errorf("the refused connection (%s) once its hold is over: %v", name, err)
		}
	}
}

// A connection refused for its address's share stays open until its hold
// is over, on the controller's clock, and is closed then: a client that
// reconnects at once is accepted once a hold, not once a round trip.
func TestARefusedConnectionIsHeldUntilItsHoldIsOverThenClosed(t *testing.T) {
	t.Parallel()
	l := testLimits(2)
	l.ConnsPerClient = 1
	c, clk, addr := servedController(t, l)
	for _, from := range []string{"127.0.0.2", "127.0.0.3"} {
		slowFrom(t, c, clk, from, addr)
	}

	past := dialFrom(t, "127.0.0.2", addr)
	testsupport.WaitFor(t, 10*time.Second, "the connection past the share to be held", func() bool {
		return c.refused.len() == 1
	})
	if _, err := io.WriteString(past, slowHeaders); err != nil {
		t.Fatalf("writing to the held connection: %v", err)
	}
	// Moved on to just short of the hold, the monitor's ticks close
	// nothing; the next refusal finds this one still held.
	clk.Advance(refuseHold - time.Millisecond)
	second := dialFrom(t, "127.0.0.3", addr)
	testsupport.WaitFor(t, 10*time.Second, "the second refused connection to be held", func() bool {
		return c.refused.len() == 2
	})
	if got := c.shed(t, "client_conns"); got != 2 {
		t.Errorf("scafo_edge_shed_total{reason=client_conns} = %v, want 2", got)
	}

	clk.Advance(time.Millisecond)
	if err := closedByPeer(past); err != nil {
		t.Errorf("the first refused connection once its hold is over: %v", err)
	}
	if got := c.refused.len(); got != 1 {
		t.Errorf("%d connections held once the first hold is over, want the second only", got)
	}
	clk.Advance(refuseHold)
	if err := closedByPeer(second); err != nil {
		t.Errorf("the second refused connection once its hold is over: %v", err)
	}
}

// countingConn is a connection that only counts its closes.
type countingConn struct {
	net.Conn
	closes atomic.Int32
}

func (c *countingConn) Close() error { c.closes.Add(1); return nil }

func TestRefusedHoldIsBoundedAndClosesInOrder(t *testing.T) {
	t.Parallel()
	start := time.Unix(1_000_000, 0)
	h := refusedHold{max: 16}
	conns := make([]*countingConn, 40)
	for i := range conns {
		conns[i] = &countingConn{}
	}
	// Sixteen held, one a millisecond; the seventeenth closed at once.
	for i := range 17 {
		h.hold(conns[i], start.Add(time.Duration(i)*time.Millisecond))
	}
	if got := h.len(); got != 16 {
		t.Fatalf("held %d, want the bound, 16", got)
	}
	for i, c := range conns[:17] {
		if want := int32(0); i == 16 {
			want = 1
			if got := c.closes.Load(); got != want {
				t.Errorf("the connection past the bound closed %d times, want once, at once", got)
			}
		} else if got := c.closes.Load(); got != want {
			t.Errorf("held connection %d closed %d times before its hold is over", i, got)
		}
	}

	// The first ten holds end: exactly those close, and ten more fit.
	h.release(start.Add(refuseHold + 9*time.Millisecond))
	for i, c := range conns[:16] {
		want := int32(0)
		if i < 10 {
			want = 1
		}
		if got := c.closes.Load(); got != want {
			t.Errorf("connection %d closed %d times once the first ten holds are over, want %d", i, got, want)
		}
	}
	later := start.Add(refuseHold + 9*time.Millisecond)
	for i := 17; i < 27; i++ {
		h.hold(conns[i], later)
	}
	if got := h.len(); got != 16 {
		t.Fatalf("held %d after ten more, want 16", got)
	}
	h.hold(conns[27], later)
	if got := conns[27].closes.Load(); got != 1 {
		t.Errorf("a connection past the bound again closed %d times, want once", got)
	}

	h.releaseAll()
	for i, c := range conns[:28] {
		if got := c.closes.Load(); got != 1 {
			t.Errorf("connection %d closed %d times after releaseAll, want once", i, got)
		}
	}
	if got := h.len(); got != 0 {
		t.Errorf("held %d after releaseAll, want 0", got)
	}
}

// At the budget a request most likely reuses an idle upstream connection:
// closing them all to make it room would have it, and every request after
// it, dial again. They are closed only past the overdraft, before the
// request is refused.
func TestAtTheBudgetARequestClosesIdleUpstreamsOnlyPastTheOverdraft(t *testing.T) {
	t.Parallel()
	l := testLimits(2)
	l.Overdraft = 2
	var closes []time.Duration
	var mu sync.Mutex
	c := newController(t, Options{Limits: l, CloseIdleUpstreams: func(idleFor time.Duration) {
		mu.Lock()
		closes = append(closes, idleFor)
		mu.Unlock()
	}})
	closed := func() []time.Duration {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(closes)
	}
	holdUpstreams(t, c.Controller, 2) // the budget

	k, why := c.Admit(request("192.0.2.1:1"), "app")
	if why != Admitted {
		t.Fatalf("a request at the budget, within the overdraft = %v, want admitted", why)
	}
	k.Release()
	if got := closed(); len(got) != 0 {
		t.Errorf("idle upstream connections closed %v for a request within the overdraft, want never", got)
	}

	holdUpstreams(t, c.Controller, 2) // and the overdraft
	if _, why := c.Admit(request("192.0.2.1:1"), "app"); why != RefusedBudget {
		t.Errorf("a request past the overdraft = %v, want %v", why, RefusedBudget)
	}
	if got := closed(); !slices.Equal(got, []time.Duration{0}) {
		t.Errorf("idle upstream connections closed %v past the overdraft, want every one once ([0])", got)
	}
}

// Under pressure the monitor gives back the upstream connections idle for a
// while, once a tick, not those the traffic of the moment reuses.
func TestUnderPressureTheMonitorClosesOnlyUpstreamsIdleForAWhile(t *testing.T) {
	t.Parallel()
	calls := make(chan time.Duration, 64)
	c := newController(t, Options{Limits: testLimits(10), CloseIdleUpstreams: func(idleFor time.Duration) {
		select {
		case calls <- idleFor:
		default:
		}
	}})
	holdUpstreams(t, c.Controller, 10)
	c.run(t)
	select {
	case got := <-calls:
		if got != upstreamIdleUnderPressure {
			t.Errorf("the monitor closed the upstreams idle for %v, want %v", got, upstreamIdleUnderPressure)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("under pressure, the monitor closed no idle upstream connection within 10s")
	}
}

// A visitor with one slow handshake or request of its own is no
// slowloris: at the budget its next connection still takes the room of
// the oldest slow first request.
func TestAtTheBudgetAVisitorWithOneSlowFirstRequestStillGetsRoom(t *testing.T) {
	t.Parallel()
	c, clk, addr := servedController(t, testLimits(4))
	var attack []net.Conn
	for range 3 {
		attack = append(attack, slowFrom(t, c, clk, "127.0.0.2", addr))
	}
	slowFrom(t, c, clk, "127.0.0.4", addr) // the visitor's slow one
	clk.Advance(2 * slowAge)

	next := dialH1At(t, "127.0.0.4", addr)
	if _, err := next.get("/"); err != nil {
		t.Fatalf("the visitor's next connection at the budget: %v", err)
	}
	if err := closedByPeer(attack[0]); err != nil {
		t.Errorf("the oldest slow first request, once the visitor's connection came: %v", err)
	}
	if got := c.shed(t, "client_slow_headers"); got != 0 {
		t.Errorf("scafo_edge_shed_total{reason=client_slow_headers} = %v, want 0", got)
	}
}
