package admission

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

// heldServer serves on a listener of c's, with c's hooks, a handler that
// admits every request: to the application "held" under /hold, where it
// waits for the test's gate (or its client to go), and to "other"
// otherwise, where /wait waits too and anything else is answered at once.
// A request that waits holds an upstream leg, as a proxied one does.
func heldServer(t *testing.T, c *Controller, g *gate) string {
	t.Helper()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		app := "other"
		if strings.HasPrefix(r.URL.Path, "/hold") {
			app = "held"
		}
		k, why := c.Admit(r, app)
		if why != Admitted {
			http.Error(w, why.String(), http.StatusServiceUnavailable)
			return
		}
		defer k.Release()
		if r.URL.Path != "/" {
			// Its upstream leg, counted, closed when it ends.
			up, err := c.DialUpstream(func() (net.Conn, error) {
				a, b := net.Pipe()
				go func() { io.Copy(io.Discard, b); b.Close() }()
				return a, nil
			})
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			defer up.Close()
			g.entered <- struct{}{}
			select {
			case <-g.open:
			case <-r.Context().Done():
			}
		}
		fmt.Fprint(w, "ok")
	})
	ln := listen(t)
	srv := &http.Server{Handler: h, ConnState: c.ConnState, ConnContext: c.ConnContext, ErrorLog: log.New(io.Discard, "", 0)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(c.Listener(ln))
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return ln.Addr().String()
}

// During an episode of pressure an application may hold no more than its
// fair part of the descriptors under the low-water mark, and its requests
// held longest past it are shed, oldest first: they hold what everyone
// else's visitors are short of. The newer ones, and the other
// application's, are served.
func TestUnderPressureRequestsHeldPastTheirApplicationsFairPartAreShedOldestFirst(t *testing.T) {
	t.Parallel()
	// 60 descriptors, 48 under the low-water mark. Two descriptors a
	// request: "other" holds 2, "held" 40 and 14 connections carry none,
	// 56 in all. Max-min, "other" and the 14 keep theirs and "held" gets
	// the 32 left: 16 requests.
	const maxConns = 60
	clk := newFakeClock()
	c := newController(t, Options{Limits: testLimits(maxConns), Clock: clk})
	c.run(t)
	g := newGate(t)
	addr := heldServer(t, c.Controller, g)

	hold := func(n int, path string) []*h1Client {
		var out []*h1Client
		for range n {
			h := dialH1(t, addr)
			if err := h.send(path); err != nil {
				t.Fatal(err)
			}
			g.waitEntered(t)
			out = append(out, h)
		}
		return out
	}
	other := hold(1, "/wait")
	old := hold(4, "/hold")
	clk.Advance(time.Second)
	newer := hold(16, "/hold") // 20 in all, under 0.75 × (30 - 1) while nobody is short
	if got := c.app("held").InFlight; got != 20 {
		t.Fatalf("held in flight = %d, want 20", got)
	}
	clk.Advance(heldAge)

	// Idle connections take the box past the high-water mark (54).
	keepAliveClients(t, c, clk, addr, 14)
	c.waitPressure(t)
	testsupport.WaitFor(t, 10*time.Second, "the held requests past the fair part to be shed", func() bool {
		return c.shed(t, shedHeld) == 4
	})
	for i, h := range old {
		if err := closedByPeer(h.conn); err != nil {
			t.Errorf("held request %d of the 4 oldest: %v", i+1, err)
		}
	}
	// While the episode lasts, the application's limit is that part: the
	// requests shed do not come back through its queue.
	if got := c.app("held").Limit; got != 16 {
		t.Errorf("held's limit under pressure = %d, want its fair part 16", got)
	}
	if _, why := c.Admit(probe("192.0.2.7:1"), "held"); why != RefusedCanceled {
		t.Errorf("a new held request under pressure = %v, want it to wait (%v)", why, RefusedCanceled)
	}
	g.release()
	for i, h := range append(other, newer...) {
		if body, err := h.read(); err != nil || body != "ok" {
			t.Errorf("request %d within the shares = %q, %v; want ok", i+1, body, err)
		}
	}
	if got := c.shed(t, shedHeld); got != 4 {
		t.Errorf("scafo_edge_shed_total{reason=%q} = %v, want 4", shedHeld, got)
	}

	// Once the episode is over, the application's limit is its share again
	// and the plan keeps none of the connections it listed.
	for _, h := range append(other, newer...) {
		h.conn.Close()
	}
	c.waitCalm(t, clk)
	if got := c.app("held").Limit; got != 22 {
		t.Errorf("held's limit after the episode = %d, want its share 0.75 × 30 = 22", got)
	}
	c.shedMu.Lock()
	listed := len(c.plan.list) + len(c.plan.slow) + len(c.plan.held)
	c.shedMu.Unlock()
	if listed != 0 {
		t.Errorf("the plan still lists %d connections after the episode", listed)
	}
}

// fairLevel is max-min: the parties holding less than an equal part keep
// what they hold, and only the larger ones are held to what is left.
func TestFairLevel(t *testing.T) {
	tests := []struct {
		name     string
		capacity int64
		inFlight []int64 // by application; 0: its last request just ended, -1: never had one
		spare    int64   // descriptors that carry no request
		want     int64
	}{
		{"everything fits", 100, []int64{10, 20}, 30, 0},
		{"beside one just idle, as many as the connections carrying none: half each", 100, []int64{30, 0}, 60, 25},
		{"a held-request attack beside a NAT", 15200, []int64{7125, 10}, 5000, 5090},
		{"twenty small tenants do not halve the large one", 15200,
			[]int64{3000, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}, 17800, 4562},
		{"two large applications split what is left", 1000, []int64{400, 400}, 200, 200},
		{"one application alone takes nobody's room", 100, []int64{45}, 20, 0},
		{"beside one whose requests were all refused, it is alone", 100, []int64{45, -1}, 20, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var a appTable
			a.init(testLimits(int(tt.capacity)))
			held := int64(0)
			for i, n := range tt.inFlight {
				app := a.get(fmt.Sprint("app", i))
				switch {
				case n > 0:
					app.inFlight.Store(n)
					held += 2 * n
				case n == 0: // its last request just ended
					app.idleAt.Store(time.Now().UnixNano())
				}
			}
			if got := a.fairLevel(tt.capacity, held+tt.spare, time.Now()); got != tt.want {
				t.Errorf("fairLevel = %d, want %d", got, tt.want)
			}
			// An application at the level is within it: shedding takes it
			// no further.
			if tt.want > 0 {
				for i, n := range tt.inFlight {
					if n > tt.want {
						a.get(fmt.Sprint("app", i)).inFlight.Store(tt.want)
					}
				}
			}
		})
	}
}

// A connection hijacked after the plan listed its request (a WebSocket
// whose upgrade took a while) is a tunnel now: never shed as held.
func TestAConnectionHijackedSinceThePlanIsNotShedAsHeld(t *testing.T) {
	clk := newFakeClock()
	c := newController(t, Options{Limits: testLimits(40), Clock: clk})
	a, b := net.Pipe()
	defer b.Close()
	tc := &trackedConn{Conn: a, c: c.Controller}
	c.ConnState(tc, http.StateNew)
	c.ConnState(tc, http.StateActive)
	k, why := c.Admit(request("192.0.2.3:1").WithContext(c.ConnContext(context.Background(), tc)), "ws")
	if why != Admitted {
		t.Fatal(why)
	}
	defer k.Release()
	clk.Advance(heldAge + time.Second)
	c.shedMu.Lock()
	defer c.shedMu.Unlock()
	c.makePlan(clk.Now())
	if len(c.plan.held) != 1 {
		t.Fatalf("the plan lists %d held requests, want 1", len(c.plan.held))
	}
	c.ConnState(tc, http.StateHijacked)
	c.apps.level.Store(1) // and its application far past its part
	c.apps.get("ws").inFlight.Add(10)
	defer c.apps.get("ws").inFlight.Add(-10)
	c.shedHeld()
	if tc.closed.Load() || c.shed(t, shedHeld) != 0 {
		t.Errorf("a hijacked connection was shed as held (closed %v)", tc.closed.Load())
	}
}
