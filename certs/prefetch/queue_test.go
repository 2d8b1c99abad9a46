package prefetch

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"go.uber.org/goleak"

	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/testsupport"
)

func TestMain(m *testing.M) {
	// certmagic's FileStorage, the tests' shared store, keeps a lock file
	// fresh from a goroutine that notices the unlock only at its next
	// five-second tick.
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/caddyserver/certmagic.keepLockfileFresh"))
}

// fakeCerts is certificate management as far as the queue sees it: a
// set of certifiable names, a set of held ones (shared between queues
// when they share one fakeCerts, as a fleet shares its store), and a log
// of orders. Obtain waits on gate when it is not nil.
type fakeCerts struct {
	mu        sync.Mutex
	allowed   map[string]bool
	held      map[string]bool
	orders    []string
	gate      chan struct{}
	obtaining chan string
	// until holds names back as on-demand issuance's back-off does.
	until map[string]time.Time
}

func newFakeCerts(names ...string) *fakeCerts {
	f := &fakeCerts{allowed: map[string]bool{}, held: map[string]bool{}, obtaining: make(chan string, 100), until: map[string]time.Time{}}
	for _, n := range names {
		f.allowed[n] = true
	}
	return f
}

func (f *fakeCerts) certs(storage certmagic.Storage) Certs {
	return Certs{
		Certifiable: func(name string) bool {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.allowed[name]
		},
		HeldBack: func(name string) time.Time {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.until[name]
		},
		Held: func(_ context.Context, name string) bool {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.held[name]
		},
		Obtain: func(ctx context.Context, name string) error {
			f.mu.Lock()
			f.orders = append(f.orders, name)
			gate := f.gate
			f.mu.Unlock()
			f.obtaining <- name
			if gate != nil {
				select {
				case <-gate:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			f.mu.Lock()
			f.held[name] = true
			f.mu.Unlock()
			return nil
		},
		Storage: storage,
	}
}

func (f *fakeCerts) ordered() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.orders)
}

// startQueue starts a queue whose reachability checks reach an edge on
// storage, stopped when t ends.
func startQueue(t *testing.T, f *fakeCerts, storage certmagic.Storage, opts Options) *Queue {
	t.Helper()
	if opts.DialContext == nil {
		opts.DialContext = dialTo(edgeServer(t, storage))
	}
	if opts.LookupNetIP == nil {
		opts.LookupNetIP = oneAddress
	}
	q, err := New(f.certs(storage), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(q.Stop)
	return q
}

func nextOrder(t *testing.T, f *fakeCerts) string {
	t.Helper()
	select {
	case n := <-f.obtaining:
		return n
	case <-time.After(10 * time.Second):
		t.Fatal("no order placed")
		return ""
	}
}

func TestQueueOrder(t *testing.T) {
	t.Run("the latest document's names go first, in document order", func(t *testing.T) {
		f := newFakeCerts("a.test", "b.test", "c.test", "d.test")
		f.gate = make(chan struct{})
		q := startQueue(t, f, newStorage(t), Options{Workers: 1})
		q.Update([]string{"a.test"})
		nextOrder(t, f)
		q.Update([]string{"a.test", "b.test", "c.test"})
		q.Update([]string{"a.test", "b.test", "c.test", "d.test"})
		for range 3 {
			f.gate <- struct{}{}
			nextOrder(t, f)
		}
		close(f.gate)
		if got, want := f.ordered(), []string{"a.test", "d.test", "b.test", "c.test"}; !slices.Equal(got, want) {
			t.Errorf("orders = %q, want %q", got, want)
		}
		testsupport.WaitFor(t, 10*time.Second, "an empty queue", func() bool { return len(q.Status()) == 0 })
	})

	t.Run("a name that leaves the document before its turn is never ordered", func(t *testing.T) {
		f := newFakeCerts("a.test", "b.test")
		f.gate = make(chan struct{})
		q := startQueue(t, f, newStorage(t), Options{Workers: 1})
		q.Update([]string{"a.test", "b.test"})
		nextOrder(t, f)
		q.Update([]string{"a.test"})
		close(f.gate)
		testsupport.WaitFor(t, 10*time.Second, "an empty queue", func() bool { return len(q.Status()) == 0 })
		if got := f.ordered(); !slices.Equal(got, []string{"a.test"}) {
			t.Errorf("orders = %q, want only a.test", got)
		}
	})

	t.Run("held and uncertifiable names are not ordered", func(t *testing.T) {
		f := newFakeCerts("held.test", "new.test")
		f.held["held.test"] = true
		q := startQueue(t, f, newStorage(t), Options{})
		q.Update([]string{"held.test", "*.wild.test", "stranger.test", "new.test"})
		testsupport.WaitFor(t, 10*time.Second, "an empty queue", func() bool { return len(q.Status()) == 0 })
		if got := f.ordered(); !slices.Equal(got, []string{"new.test"}) {
			t.Errorf("orders = %q, want only new.test", got)
		}
	})

	t.Run("a full queue keeps the first names of a large document and makes room for newer ones", func(t *testing.T) {
		names := make([]string, maxNames+1)
		for i := range names {
			names[i] = fmt.Sprintf("n%05d.test", i)
		}
		f := newFakeCerts(append(names, "new.test")...)
		f.gate = make(chan struct{}) // never opened: the first name stays at work
		q := startQueue(t, f, newStorage(t), Options{Workers: 1})
		q.Update(names)
		if got := nextOrder(t, f); got != names[0] {
			t.Fatalf("first order = %q, want %q", got, names[0])
		}
		if got := len(q.Status()); got != maxNames {
			t.Fatalf("queue holds %d names, want %d", got, maxNames)
		}
		if got := stateOf(q, names[maxNames]); got != "" {
			t.Fatalf("the name past the bound is %q, want not queued", got)
		}
		q.Update(append(names, "new.test"))
		st := q.Status()
		if len(st) != maxNames || st[0].Name != "new.test" {
			t.Fatalf("queue after a newer name = %d names, first %q; want %d, new.test first", len(st), st[0].Name, maxNames)
		}
		if got := stateOf(q, names[maxNames-1]); got != "" {
			t.Errorf("the oldest name %s is %q, want dropped for the newer one", names[maxNames-1], got)
		}
		if got := stateOf(q, names[0]); got != Working {
			t.Errorf("the name at work is %q, want still working", got)
		}
	})

	t.Run("a name back in the document after leaving it is queued again", func(t *testing.T) {
		f := newFakeCerts("a.test")
		q := startQueue(t, f, newStorage(t), Options{DialContext: dialTo(testsupport.ClosedAddr(t)), RetryBase: time.Hour})
		q.Update([]string{"a.test"})
		testsupport.WaitFor(t, 10*time.Second, "a.test unreachable", func() bool { return stateOf(q, "a.test") == Unreachable })
		q.Update(nil)
		if st := q.Status(); len(st) != 0 {
			t.Fatalf("status after the name left = %+v, want empty", st)
		}
		q.Update([]string{"a.test"})
		if got := stateOf(q, "a.test"); got == "" {
			t.Fatal("a.test not queued again")
		}
	})
}

func stateOf(q *Queue, name string) State {
	for _, e := range q.Status() {
		if e.Name == name {
			return e.State
		}
	}
	return ""
}

func TestQueueBackOff(t *testing.T) {
	clk := newFakeClock()
	f := newFakeCerts("dark.test")
	dark := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(dark.Close)
	q := startQueue(t, f, newStorage(t), Options{
		Clock: clk, RetryBase: time.Minute, RetryMax: 4 * time.Minute,
		DialContext: dialTo(dark.Listener.Addr().String()),
	})
	q.Update([]string{"dark.test"})
	for i, want := range []time.Duration{time.Minute, 2 * time.Minute, 4 * time.Minute, 4 * time.Minute} {
		testsupport.WaitFor(t, 10*time.Second, "a failed check", func() bool {
			st := q.Status()
			return len(st) == 1 && st[0].Failures == i+1 && st[0].State == Unreachable
		})
		e := q.Status()[0]
		if got := e.Next.Sub(clk.Now()); got != want {
			t.Errorf("after failure %d the next check is in %v, want %v", i+1, got, want)
		}
		clk.Advance(want)
	}
	if got := f.ordered(); len(got) != 0 {
		t.Errorf("orders for an unreachable name: %q", got)
	}
}

// TestQueueWaitsOutOnDemandBackOff: a name on-demand issuance holds back
// after a failed issuance stays queued and is ordered only once the
// back-off ends, however short the queue's own.
func TestQueueWaitsOutOnDemandBackOff(t *testing.T) {
	clk := newFakeClock()
	f := newFakeCerts("a.test")
	until := clk.Now().Add(time.Hour)
	f.until["a.test"] = until
	q := startQueue(t, f, newStorage(t), Options{Clock: clk, RetryBase: time.Millisecond})
	q.Update([]string{"a.test"})
	testsupport.WaitFor(t, 10*time.Second, "a.test waiting out the back-off", func() bool {
		st := q.Status()
		return len(st) == 1 && st[0].State == Failed && !st[0].Next.Before(until) && st[0].Error != ""
	})
	if got := f.ordered(); len(got) != 0 {
		t.Fatalf("orders during the back-off: %q", got)
	}
	clk.Advance(time.Hour)
	if got := nextOrder(t, f); got != "a.test" {
		t.Errorf("order after the back-off = %q, want a.test", got)
	}
}

func TestQueueBudget(t *testing.T) {
	clk := newFakeClock()
	f := newFakeCerts("a.test", "b.test", "c.test")
	q := startQueue(t, f, newStorage(t), Options{PerHour: 1, Clock: clk})
	q.Update([]string{"a.test", "b.test", "c.test"})
	testsupport.WaitFor(t, 10*time.Second, "one order and two names held back by the budget", func() bool {
		return len(f.ordered()) == 1 && stateOf(q, "b.test") == Budget && stateOf(q, "c.test") == Budget
	})
	if got := f.ordered(); !slices.Equal(got, []string{"a.test"}) {
		t.Fatalf("orders = %q, want only a.test", got)
	}
	clk.Advance(time.Hour)
	testsupport.WaitFor(t, 10*time.Second, "a second order an hour later", func() bool { return len(f.ordered()) == 2 })
	if stateOf(q, "c.test") != Budget {
		t.Errorf("c.test is %q, want still held back by the budget", stateOf(q, "c.test"))
	}
}

// TestQueueDomainBudgetRecorded: the registered domain's week counts the
// orders recorded in storage, so neither a restart nor another edge of
// the fleet starts it over (Let's Encrypt counts across accounts).
func TestQueueDomainBudgetRecorded(t *testing.T) {
	heldForAWeek := func(q *Queue, name string) func() bool {
		return func() bool {
			st := q.Status()
			return len(st) == 1 && st[0].Name == name && st[0].State == Budget && st[0].Next.After(time.Now().Add(6*24*time.Hour))
		}
	}
	for _, tc := range []struct {
		name    string
		restart bool
	}{
		{"a restarted edge counts the orders it placed before", true},
		{"a second edge on the same store counts the first one's orders", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storage := newStorage(t)
			f := newFakeCerts("a.example.com", "b.example.com", "c.example.org")
			first := startQueue(t, f, storage, Options{PerDomainPerWeek: 1})
			first.Update([]string{"a.example.com"})
			testsupport.WaitFor(t, 10*time.Second, "a.example.com ordered", func() bool { return len(first.Status()) == 0 })
			if tc.restart {
				first.Stop()
			}
			second := startQueue(t, f, storage, Options{PerDomainPerWeek: 1})
			second.Update([]string{"a.example.com", "b.example.com", "c.example.org"})
			testsupport.WaitFor(t, 10*time.Second, "b.example.com held back for a week, c.example.org ordered", heldForAWeek(second, "b.example.com"))
			if got, want := f.ordered(), []string{"a.example.com", "c.example.org"}; !slices.Equal(got, want) {
				t.Errorf("orders = %q, want %q", got, want)
			}
		})
	}
}

// TestQueueFleet runs five queues on one storage and one set of held
// certificates, as five edges on the fleet store: one order per name.
func TestQueueFleet(t *testing.T) {
	storage := newStorage(t)
	names := []string{"a.test", "b.test", "c.test", "d.test"}
	f := newFakeCerts(names...)
	edge := edgeServer(t, storage)
	qs := make([]*Queue, 5)
	for i := range qs {
		qs[i] = startQueue(t, f, storage, Options{BusyRetry: 10 * time.Millisecond, DialContext: dialTo(edge)})
	}
	var wg sync.WaitGroup
	for _, q := range qs {
		wg.Go(func() { q.Update(names) })
	}
	wg.Wait()
	for _, q := range qs {
		testsupport.WaitFor(t, 10*time.Second, "every queue to empty", func() bool { return len(q.Status()) == 0 })
	}
	got := f.ordered()
	slices.Sort(got)
	if !slices.Equal(got, names) {
		t.Errorf("orders = %q, want one per name %q", got, names)
	}
}

// newFakeClock returns a clock that moves only when a test advances it.
func newFakeClock() *clock.Fake {
	return clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
}
