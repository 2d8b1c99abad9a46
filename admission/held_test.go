package admission

import (
	"fmt"
	"io"
	"log"
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

// Under contention an application may hold no more than an equal part of
// the request budget among the applications with requests in flight, and
// its requests held longest past that part are shed, oldest first: they
// hold what everyone else's visitors are short of. The newer ones, and
// the other application's, are served.
func TestUnderContentionRequestsHeldPastTheirApplicationsFairShareAreShedOldestFirst(t *testing.T) {
	t.Parallel()
	const maxConns = 40 // a request budget of 20; a fair share of 10 for two applications
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
	newer := hold(10, "/hold") // 14 in all: 0.75 × (20 - 1), its limit while nobody is short
	if got := c.app("held").InFlight; got != 14 {
		t.Fatalf("held in flight = %d, want 14", got)
	}
	clk.Advance(heldAge)

	// Idle connections take the box past the high-water mark (36).
	keepAliveClients(t, c, clk, addr, 21)
	c.waitPressure(t)
	testsupport.WaitFor(t, 10*time.Second, "the held requests past the fair share to be shed", func() bool {
		return c.shed(t, shedHeld) == 4
	})
	for i, h := range old {
		if err := closedByPeer(h.conn); err != nil {
			t.Errorf("held request %d of the 4 oldest: %v", i+1, err)
		}
	}
	// While it lasts, the application's limit is its fair share: the
	// requests shed do not come back through its queue.
	if got := c.app("held").Limit; got != 10 {
		t.Errorf("held's limit under contention = %d, want its fair share 10", got)
	}
	if _, why := c.Admit(probe("192.0.2.7:1"), "held"); why != RefusedCanceled {
		t.Errorf("a new held request under contention = %v, want it to wait (%v)", why, RefusedCanceled)
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
}
