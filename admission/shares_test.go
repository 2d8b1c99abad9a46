package admission

import (
	"bufio"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

// idleFrom opens one HTTP/1.1 keep-alive connection from the loopback
// address from, does one request on it and waits for it to be idle; the
// clock moves a millisecond after, so that connections opened one after
// the other are idle oldest first.
func idleFrom(t *testing.T, c *testController, clk interface{ Advance(time.Duration) }, from, addr string) *h1Client {
	t.Helper()
	before := c.Snapshot().IdleConns
	conn := dialFrom(t, from, addr)
	h := &h1Client{conn: conn, br: bufio.NewReader(conn)}
	if _, err := h.get("/"); err != nil {
		t.Fatalf("request on a connection of %s: %v", from, err)
	}
	c.waitIdle(t, before+1)
	clk.Advance(time.Millisecond)
	return h
}

func TestUnderPressureTheAddressesFurthestPastTheirShareLoseTheirIdleConnectionsFirst(t *testing.T) {
	// A budget of 20, a share of 2. Idle, oldest first: C1 C2 D1 (at or
	// under their share), then B1..B5 (3 past), then A1..A8 (6 past).
	// Upstream connections then push the count over: shedding goes to just
	// under the low-water mark of 16.
	cases := []struct {
		name      string
		upstreams int
		wantShed  []string
	}{
		{
			// 20 to 15: five go. A is furthest past (6, 5, 4 past after
			// each); at 3 past each, B's oldest has been idle longer
			// than A's next; then A is furthest again.
			name: "fewer than the addresses past their share hold", upstreams: 4,
			wantShed: []string{"A1", "A2", "A3", "B1", "A4"},
		},
		{
			// 25 to 15: ten go. A and B down to their share (nine), then
			// the oldest of the rest: C's first.
			name: "more than the addresses past their share hold", upstreams: 9,
			wantShed: []string{"A1", "A2", "A3", "A4", "A5", "A6", "B1", "B2", "B3", "C1"},
		},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := newFakeClock()
			l := testLimits(shedMaxConns)
			l.ConnsPerClient = 2
			l.Overdraft = 10 // the upstreams held below pass the budget, as requests' may
			c := newController(t, Options{Limits: l, Clock: clk})
			c.run(t)
			ln := listen(t)
			serve(t, c.Controller, ln, newGate(t).handler(), nil)
			addr := ln.Addr().String()

			conns := map[string]*h1Client{}
			var order []string
			open := func(name, from string, n int) {
				for i := range n {
					id := fmt.Sprintf("%s%d", name, i+1)
					conns[id] = idleFrom(t, c, clk, from, addr)
					order = append(order, id)
				}
			}
			open("C", "127.0.0.3", 2)
			open("D", "127.0.0.4", 1)
			open("B", "127.0.0.2", 5)
			open("A", "127.0.0.1", 8)
			if s := c.Snapshot(); s.Pressure || s.SharesBind {
				t.Fatalf("Snapshot with %d idle connections of %d: pressure %v, shares bind %v; want neither on an idle box", s.IdleConns, shedMaxConns, s.Pressure, s.SharesBind)
			}

			clk.Advance(time.Second) // every one old enough to shed
			holdUpstreams(t, c.Controller, tt.upstreams)
			want := len(order) - len(tt.wantShed)
			testsupport.WaitFor(t, 10*time.Second, fmt.Sprintf("%d idle connections shed", len(tt.wantShed)), func() bool {
				return int(c.Snapshot().ClientConns) == want
			})
			shed := map[string]bool{}
			for _, id := range tt.wantShed {
				shed[id] = true
			}
			for _, id := range order {
				h := conns[id]
				if shed[id] {
					if err := closedByPeer(h.conn); err != nil {
						t.Errorf("%s, to be shed: %v", id, err)
					}
					continue
				}
				if _, err := h.get("/"); err != nil {
					t.Errorf("%s, to be kept: %v", id, err)
				}
			}
			if got := c.shed(t, "idle_closed"); int(got) != len(tt.wantShed) {
				t.Errorf("scafo_edge_shed_total{reason=idle_closed} = %v, want %d", got, len(tt.wantShed))
			}
		})
	}
}

func TestAClientAddressPastItsShareOfRequestsIsRefusedOnceItsApplicationIsContended(t *testing.T) {
	l := testLimits(20) // a request budget of 10; one application alone may hold 7
	l.RequestsPerClient = 3
	c := newController(t, Options{Limits: l})
	var held []Ticket
	defer func() {
		for _, k := range held {
			k.Release()
		}
	}()
	// Alone, one address may take what its application may hold.
	for i := range 7 {
		k, why := c.Admit(request(fmt.Sprintf("192.0.2.7:%d", 1000+i)), "app")
		if why != Admitted {
			t.Fatalf("request %d of the address with nobody else short = %v, want admitted", i+1, why)
		}
		held = append(held, k)
	}
	// Another address's request waits for a slot: now someone is short.
	waiting := admitAsync(c.Controller, request("192.0.2.8:1"), "app")
	c.waitQueued(t, "app", 1)
	if _, why := c.Admit(request("192.0.2.7:2000"), "app"); why != RefusedClientRequests {
		t.Errorf("a request of the address past its share, its application contended = %v, want %v", why, RefusedClientRequests)
	}
	// Within its share, another address queues rather than being refused.
	third := admitAsync(c.Controller, request("192.0.2.9:1"), "app")
	c.waitQueued(t, "app", 2)
	if a, done := returnedNow(third); done {
		t.Fatalf("a request of an address within its share returned %v at once, want it queued", a.why)
	}
	// Slots freed by the address past its share go to the others, in
	// order.
	held[0].Release()
	held[1].Release()
	held = held[2:]
	for _, ch := range []<-chan admitted{waiting, third} {
		a := receive(t, ch, "a queued request once slots freed")
		if a.why != Admitted {
			t.Errorf("a queued request = %v, want admitted", a.why)
		}
		held = append(held, a.ticket)
	}
}

func TestUnderMemoryPressureAnAddressPastItsShareLosesItsIdleConnectionsDownToIt(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	l := testLimits(100) // connections far from the high-water mark
	l.ConnsPerClient = 2
	l.MemoryLimit = 1000
	var inUse atomic.Int64
	c := newController(t, Options{Limits: l, Clock: clk, MemoryInUse: inUse.Load})
	c.run(t)
	ln := listen(t)
	serve(t, c.Controller, ln, newGate(t).handler(), nil)
	addr := ln.Addr().String()

	var a, b []*h1Client
	for range 2 {
		b = append(b, idleFrom(t, c, clk, "127.0.0.2", addr))
	}
	for range 5 {
		a = append(a, idleFrom(t, c, clk, "127.0.0.1", addr))
	}
	clk.Advance(time.Second)
	inUse.Store(900) // past 75 % of the limit
	testsupport.WaitFor(t, 10*time.Second, "the address past its share down to it", func() bool { return c.Snapshot().ClientConns == 4 })
	for i, h := range a {
		if i < 3 {
			if err := closedByPeer(h.conn); err != nil {
				t.Errorf("connection %d of the address past its share (of the 3 oldest): %v", i+1, err)
			}
			continue
		}
		if _, err := h.get("/"); err != nil {
			t.Errorf("connection %d of the address past its share, within it: %v", i+1, err)
		}
	}
	for i, h := range b {
		if _, err := h.get("/"); err != nil {
			t.Errorf("connection %d of the address within its share: %v", i+1, err)
		}
	}
}
