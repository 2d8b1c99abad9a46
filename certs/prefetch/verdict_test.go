package prefetch

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

// checksOf returns the reachability checks the queues registered on regs
// ran, in all.
func checksOf(t *testing.T, regs []*prometheus.Registry) int {
	t.Helper()
	n := 0
	for _, reg := range regs {
		v, _ := testsupport.MetricValue(t, reg, "scafo_edge_tls_prefetch_reach_checks_total", nil)
		n += int(v)
	}
	return n
}

// TestQueueFleetVerdict: edges on one store check a name once between
// them (issue 47). The edge holding the name's lock checks it and leaves
// its verdict; the others take the verdict instead of checking until it
// is due.
func TestQueueFleetVerdict(t *testing.T) {
	const busy = time.Second
	t.Run("a name that does not reach the fleet costs one check per back-off", func(t *testing.T) {
		clk, storage := newFakeClock(), newStorage(t)
		var asked atomic.Int32
		dark := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			asked.Add(1)
			http.NotFound(w, r)
		}))
		t.Cleanup(dark.Close)
		f := newFakeCerts("dark.test")
		qs := make([]*Queue, 3)
		regs := make([]*prometheus.Registry, len(qs))
		for i := range qs {
			regs[i] = prometheus.NewRegistry()
			qs[i] = startQueue(t, f, storage, Options{
				Clock: clk, RetryBase: time.Minute, BusyRetry: busy, Registerer: regs[i],
				DialContext: dialTo(dark.Listener.Addr().String()),
			})
		}
		// settled waits until every queue lists the name unreachable
		// after failures, moving the clock to the next look of a queue
		// that found the lock held (seconds, never the name's back-off).
		settled := func(failures int) {
			t.Helper()
			testsupport.WaitFor(t, 10*time.Second, "every queue listing the name unreachable", func() bool {
				all := true
				for _, q := range qs {
					st := q.Status()
					if len(st) != 1 {
						return false
					}
					if d := st[0].Next.Sub(clk.Now()); st[0].State == Elsewhere && d > 0 {
						clk.Advance(d)
					}
					all = all && st[0].State == Unreachable && st[0].Failures == failures
				}
				return all
			})
		}
		for _, q := range qs {
			q.Update([]string{"dark.test"})
		}
		settled(1)
		if got, n := checksOf(t, regs), asked.Load(); got != 1 || n != 1 {
			t.Fatalf("checks = %d (%d requests), want 1 for the fleet", got, n)
		}
		for _, q := range qs {
			if d := q.Status()[0].Next.Sub(clk.Now()); d <= 0 || d > time.Minute {
				t.Errorf("next look in %v, want within the minute's back-off", d)
			}
		}
		clk.Advance(time.Minute)
		settled(2)
		if got := checksOf(t, regs); got != 2 {
			t.Errorf("checks after the back-off = %d, want 2 in all", got)
		}
		for _, q := range qs {
			if d := q.Status()[0].Next.Sub(clk.Now()); d <= time.Minute || d > 2*time.Minute {
				t.Errorf("after the second check: next look in %v, want the back-off doubled for every edge", d)
			}
		}
		if got := f.ordered(); len(got) != 0 {
			t.Errorf("orders = %q, want none", got)
		}
	})

	t.Run("while an edge's document lags, the edge that checked checks again and the others wait for it", func(t *testing.T) {
		const poll = 5 * time.Second
		clk, storage, named := newFakeClock(), newStorage(t), new(atomic.Bool)
		lagging := laggingEdge(t, storage, named)
		f := newFakeCerts("new.test")
		qs := make([]*Queue, 3)
		regs := make([]*prometheus.Registry, len(qs))
		for i := range qs {
			regs[i] = prometheus.NewRegistry()
			qs[i] = startQueue(t, f, storage, Options{
				Clock: clk, RetryBase: time.Minute, BusyRetry: busy, PollInterval: poll, Registerer: regs[i],
				DialContext: dialTo(lagging),
			})
		}
		qs[0].Update([]string{"new.test"})
		testsupport.WaitFor(t, 10*time.Second, "the first edge's check finding an edge without the name", func() bool {
			return stateOf(qs[0], "new.test") == Propagating
		})
		first := qs[0].Status()[0].Next
		for _, q := range qs[1:] {
			q.Update([]string{"new.test"})
		}
		testsupport.WaitFor(t, 10*time.Second, "the others taking its verdict", func() bool {
			return stateOf(qs[1], "new.test") == Propagating && stateOf(qs[2], "new.test") == Propagating
		})
		if got := checksOf(t, regs); got != 1 {
			t.Fatalf("checks = %d, want 1: the others wait for the first edge's", got)
		}
		for _, q := range qs[1:] {
			if e := q.Status()[0]; !e.Next.After(first) {
				t.Errorf("another edge looks again at %v, want after the checking edge's %v", e.Next, first)
			}
		}
		named.Store(true) // the lagging edge polls
		clk.Advance(first.Sub(clk.Now()))
		if got := nextOrder(t, f); got != "new.test" {
			t.Fatalf("order = %q, want new.test", got)
		}
		testsupport.WaitFor(t, 10*time.Second, "the checking edge's queue empty", func() bool { return len(qs[0].Status()) == 0 })
		clk.Advance(busy)
		for _, q := range qs[1:] {
			testsupport.WaitFor(t, 10*time.Second, "every queue empty", func() bool { return len(q.Status()) == 0 })
		}
		if got := checksOf(t, regs); got != 2 {
			t.Errorf("checks = %d, want 2: one, and one more after the lagging document", got)
		}
		if got := f.ordered(); len(got) != 1 {
			t.Errorf("orders = %q, want one", got)
		}
		if _, err := storage.Load(t.Context(), verdictKey("new.test")); err == nil {
			t.Errorf("the verdict outlived the name's certificate")
		}
	})
}
