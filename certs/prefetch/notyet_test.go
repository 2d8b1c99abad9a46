package prefetch

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/testsupport"
)

// laggingEdge is an edge of the fleet whose document does not name the
// checked host until named is set: it answers a check as the edge answers
// a host it has no route for (edge.Handler's 404 "no_route" body), and
// once named, as any edge of the fleet does.
func laggingEdge(t *testing.T, storage certmagic.Storage, named *atomic.Bool) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.Host)
		if err != nil {
			host = r.Host
		}
		if named.Load() && ServeReach(w, r, storage, host) {
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, noRouteAnswer+"\n")
	}))
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// startLaggingQueue starts a queue on clk whose checks reach a
// laggingEdge, with a minute's RetryBase and the poll interval given.
func startLaggingQueue(t *testing.T, clk clock.Clock, f *fakeCerts, named *atomic.Bool, poll time.Duration) *Queue {
	storage := newStorage(t)
	return startQueue(t, f, storage, Options{
		Clock: clk, RetryBase: time.Minute, PollInterval: poll,
		DialContext: dialTo(laggingEdge(t, storage, named)),
	})
}

// TestQueueEdgeWithoutTheNameYet: edges poll the document on their own
// clocks, so the edge a name's DNS leads to may name it up to one poll
// interval after the edge checking it (issue 30). Such a check is tried
// again after about one interval, a few times, before the name's minute of
// back-off; the name is ordered as soon as that edge names it.
func TestQueueEdgeWithoutTheNameYet(t *testing.T) {
	const poll = 5 * time.Second
	t.Run("the name is checked again about one poll interval later and ordered once the edge names it", func(t *testing.T) {
		clk, named := newFakeClock(), new(atomic.Bool)
		f := newFakeCerts("new.example.com")
		q := startLaggingQueue(t, clk, f, named, poll)
		q.Update([]string{"new.example.com"})
		testsupport.WaitFor(t, 10*time.Second, "a check finding the edge without the name", func() bool {
			return stateOf(q, "new.example.com") == Propagating
		})
		e := q.Status()[0]
		if d := e.Next.Sub(clk.Now()); d < poll+poll/10 || d >= poll+poll/2 {
			t.Errorf("next check in %v, want within [%v, %v): about one poll interval", d, poll+poll/10, poll+poll/2)
		}
		if e.Failures != 0 {
			t.Errorf("failures = %d, want 0: a document on its way is no failure", e.Failures)
		}
		named.Store(true) // the edge polls
		clk.Advance(e.Next.Sub(clk.Now()))
		if got := nextOrder(t, f); got != "new.example.com" {
			t.Fatalf("order = %q, want new.example.com", got)
		}
	})

	t.Run("after a few such checks the name backs off as unreachable", func(t *testing.T) {
		clk, named := newFakeClock(), new(atomic.Bool)
		f := newFakeCerts("new.example.com")
		q := startLaggingQueue(t, clk, f, named, poll)
		q.Update([]string{"new.example.com"})
		for i := range maxNotYet {
			testsupport.WaitFor(t, 10*time.Second, "a check finding the edge without the name", func() bool {
				q.mu.Lock()
				defer q.mu.Unlock()
				e := q.queue["new.example.com"]
				return e != nil && e.State == Propagating && e.notYet == i+1
			})
			clk.Advance(q.Status()[0].Next.Sub(clk.Now()))
		}
		testsupport.WaitFor(t, 10*time.Second, "the name backing off as unreachable", func() bool {
			return stateOf(q, "new.example.com") == Unreachable
		})
		if e := q.Status()[0]; e.Next.Sub(clk.Now()) != time.Minute || e.Failures != 1 {
			t.Errorf("after %d re-checks: next in %v with %d failures, want a minute and 1", maxNotYet, e.Next.Sub(clk.Now()), e.Failures)
		}
		if got := f.ordered(); len(got) != 0 {
			t.Errorf("orders = %q, want none", got)
		}
	})

	t.Run("a 404 that is not the edge's own answer is unreachable at once", func(t *testing.T) {
		clk := newFakeClock()
		dark := httptest.NewServer(http.NotFoundHandler())
		t.Cleanup(dark.Close)
		q := startQueue(t, newFakeCerts("new.example.com"), newStorage(t), Options{
			Clock: clk, RetryBase: time.Minute, PollInterval: poll,
			DialContext: dialTo(dark.Listener.Addr().String()),
		})
		q.Update([]string{"new.example.com"})
		testsupport.WaitFor(t, 10*time.Second, "the name unreachable", func() bool {
			return stateOf(q, "new.example.com") == Unreachable
		})
	})
}

// TestQueueNameRemovedDuringItsCheck: a name that leaves the document
// while its check is in flight is dropped, logged and counted as removed,
// not as unreachable with a retry nobody waits for (issue 30).
func TestQueueNameRemovedDuringItsCheck(t *testing.T) {
	storage := newStorage(t)
	var named atomic.Bool
	edge := laggingEdge(t, storage, &named)
	dialing := make(chan struct{})
	release := make(chan struct{})
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		close(dialing)
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return (&net.Dialer{}).DialContext(ctx, "tcp", edge)
	}
	var logs testsupport.SyncBuffer
	reg := prometheus.NewRegistry()
	f := newFakeCerts("gone.example.com")
	q := startQueue(t, f, storage, Options{DialContext: dial, Log: zerolog.New(&logs), Registerer: reg})
	q.Update([]string{"gone.example.com"})
	select {
	case <-dialing:
	case <-time.After(10 * time.Second):
		t.Fatal("no check started")
	}
	q.Update(nil)
	close(release)
	testsupport.WaitFor(t, 10*time.Second, "an empty queue", func() bool { return len(q.Status()) == 0 })
	turns := func(result string) float64 {
		v, _ := testsupport.MetricValue(t, reg, "scafo_edge_tls_prefetch_turns_total", testsupport.Labels{"result": result})
		return v
	}
	testsupport.WaitFor(t, 10*time.Second, "the turn counted", func() bool { return turns("removed") == 1 })
	for _, r := range []string{"unreachable", "propagating", "failed"} {
		if got := turns(r); got != 0 {
			t.Errorf("turns %s = %v, want 0", r, got)
		}
	}
	if got := logs.LogEntries("certificate prefetch: the name left the document (or needs no prefetch now); dropped"); len(got) != 1 || got[0]["name"] != "gone.example.com" {
		t.Errorf("removal logs = %v, want one for gone.example.com", got)
	}
	for _, msg := range []string{"certificate prefetch: unreachable", "certificate prefetch: propagating"} {
		if got := logs.LogEntries(msg); len(got) != 0 {
			t.Errorf("%q logged for a name no longer in the document: %v", msg, got)
		}
	}
	if got := f.ordered(); len(got) != 0 {
		t.Errorf("orders = %q, want none", got)
	}
}
