package admission

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

// With MaxConns 40 the request budget is 20 and one application alone may
// hold 15 (0.75 of it); its queue holds 16.
const (
	appMaxConns = 40
	appAlone    = 15
	appQueueMax = 16
)

// holder holds tickets for the test and releases what is left when it ends.
type holder struct{ tickets []Ticket }

func newHolder(t *testing.T) *holder {
	h := &holder{}
	t.Cleanup(h.releaseAll)
	return h
}

// take admits n requests of app from remote at once, failing the test if
// one is not.
func (h *holder) take(t *testing.T, c *testController, app, remote string, n int) {
	t.Helper()
	for i := range n {
		k, why := c.Admit(probe(remote), app)
		if why != Admitted {
			t.Fatalf("%s request %d = %v, want admitted at once", app, i+1, why)
		}
		h.tickets = append(h.tickets, k)
	}
}

// releaseOne releases the oldest ticket held.
func (h *holder) releaseOne() {
	h.tickets[0].Release()
	h.tickets = h.tickets[1:]
}

func (h *holder) releaseAll() {
	for len(h.tickets) > 0 {
		h.releaseOne()
	}
}

// admissible counts how many more requests of app are admitted at once,
// holding them.
func (h *holder) admissible(t *testing.T, c *testController, app, remote string) int {
	t.Helper()
	for n := range 100 {
		k, why := c.Admit(probe(remote), app)
		if why != Admitted {
			if why != RefusedCanceled {
				t.Fatalf("%s request past its share = %v, want it queued (and so given up as cancelled)", app, why)
			}
			return n
		}
		h.tickets = append(h.tickets, k)
	}
	t.Fatalf("%s was admitted 100 requests at once, with a request budget of %d", app, appMaxConns/2)
	return 0
}

func (tc *testController) appGauge(t *testing.T, name, app string) float64 {
	t.Helper()
	return tc.metric(t, name, testsupport.Labels{"application": app})
}

// waitQueued waits until app has n requests waiting.
func (tc *testController) waitQueued(t *testing.T, app string, n int) {
	t.Helper()
	testsupport.WaitFor(t, 10*time.Second, fmt.Sprintf("%d requests of %s to wait", n, app), func() bool {
		return tc.app(app).Queued == n
	})
}

func TestAnApplicationMayHoldItsShareOfWhatTheOtherApplicationsLeave(t *testing.T) {
	cases := []struct {
		name      string
		others    int // what another application holds first
		wantLimit int // share × (budget − others)
	}{
		{"alone it may hold three quarters of the whole request budget", 0, appAlone},
		{"beside one holding 4 of 20 it may hold three quarters of 16", 4, 12},
		{"beside one holding 8 of 20 it may hold three quarters of 12", 8, 9},
		{"beside one holding its whole share it may still hold some", appAlone, 3},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newController(t, Options{Limits: testLimits(appMaxConns)})
			h := newHolder(t)
			h.take(t, c, "other", "192.0.2.1:1", tt.others)
			if got := h.admissible(t, c, "app", "192.0.2.2:1"); got != tt.wantLimit {
				t.Errorf("app was admitted %d at once, want %d", got, tt.wantLimit)
			}
			if got := c.app("app"); got.InFlight != tt.wantLimit || got.Limit != tt.wantLimit {
				t.Errorf("Snapshot's app = %+v, want %d in flight at its limit %d", got, tt.wantLimit, tt.wantLimit)
			}
			if got := c.appGauge(t, "scafo_edge_app_in_flight", "app"); got != float64(tt.wantLimit) {
				t.Errorf("scafo_edge_app_in_flight{application=app} = %v, want %d", got, tt.wantLimit)
			}
			// There is always room for a third application to start.
			h.take(t, c, "third", "192.0.2.3:1", 1)
		})
	}
}

func TestRequestsPastTheShareWaitInOrderAndAreGrantedAsSlotsFree(t *testing.T) {
	t.Parallel()
	c := newController(t, Options{Limits: testLimits(appMaxConns)})
	h := newHolder(t)
	h.take(t, c, "app", "192.0.2.1:1", appAlone)
	var waiters []<-chan admitted
	for i := range 3 {
		waiters = append(waiters, admitAsync(c.Controller, request(fmt.Sprintf("192.0.2.%d:1", 10+i)), "app"))
		c.waitQueued(t, "app", i+1)
	}
	if got := c.appGauge(t, "scafo_edge_app_queued", "app"); got != 3 {
		t.Errorf("scafo_edge_app_queued{application=app} = %v with three waiting, want 3", got)
	}
	for i, w := range waiters {
		h.releaseOne()
		a := receive(t, w, fmt.Sprintf("waiter %d after a slot freed", i+1))
		if a.why != Admitted {
			t.Fatalf("waiter %d = %v, want admitted once a slot freed", i+1, a.why)
		}
		h.tickets = append(h.tickets, a.ticket)
		for j, later := range waiters[i+1:] {
			if a, ok := returnedNow(later); ok {
				t.Fatalf("waiter %d returned %v before its turn (after waiter %d)", i+j+2, a.why, i+1)
			}
		}
		if got := c.app("app"); got.InFlight != appAlone || got.Queued != 2-i {
			t.Errorf("after waiter %d: %+v, want %d in flight and %d queued", i+1, got, appAlone, 2-i)
		}
	}
	if got := c.appGauge(t, "scafo_edge_app_queued", "app"); got != 0 {
		t.Errorf("scafo_edge_app_queued{application=app} = %v once every waiter was granted, want 0", got)
	}
	h.releaseAll()
	if got := c.app("app"); got.InFlight != 0 || got.Queued != 0 {
		t.Errorf("after every request ended: %+v, want nothing in flight or queued", got)
	}
	if got := c.appGauge(t, "scafo_edge_app_in_flight", "app"); got != 0 {
		t.Errorf("scafo_edge_app_in_flight{application=app} = %v after every request ended, want 0", got)
	}
	c.clients.sweep()
	if n := c.Snapshot().Clients; n != 0 {
		t.Errorf("Clients = %d after every request ended and a sweep, want 0", n)
	}
}

func TestARequestThatWaitsTheWholeQueueTimeoutIsRefused(t *testing.T) {
	t.Parallel()
	l := testLimits(appMaxConns)
	l.QueueTimeout = 50 * time.Millisecond
	c := newController(t, Options{Limits: l})
	h := newHolder(t)
	h.take(t, c, "app", "192.0.2.1:1", appAlone)
	if _, why := c.Admit(request("192.0.2.2:1"), "app"); why != RefusedAppQueueTimeout {
		t.Fatalf("Admit past the share with no slot freeing = %v, want %v", why, RefusedAppQueueTimeout)
	}
	if got := c.shed(t, "app_queue_timeout"); got != 1 {
		t.Errorf("scafo_edge_shed_total{reason=app_queue_timeout} = %v, want 1", got)
	}
	if got := c.app("app"); got.Queued != 0 || got.InFlight != appAlone {
		t.Errorf("after the timeout: %+v, want nothing queued and %d in flight", got, appAlone)
	}
	if got := c.appGauge(t, "scafo_edge_app_queued", "app"); got != 0 {
		t.Errorf("scafo_edge_app_queued{application=app} = %v after the timeout, want 0", got)
	}
	c.clients.sweep()
	if n := c.Snapshot().Clients; n != 1 {
		t.Errorf("Clients = %d after a sweep, want only the address holding requests (the refused one's request given back)", n)
	}
	if n := len(c.log.LogEntries("for a whole queue timeout")); n != 1 {
		t.Errorf("queue timeouts logged %d times, want once:\n%s", n, c.log.String())
	}
}

func TestARequestFindingItsApplicationsQueueFullIsRefusedAtOnce(t *testing.T) {
	t.Parallel()
	c := newController(t, Options{Limits: testLimits(appMaxConns)})
	h := newHolder(t)
	h.take(t, c, "app", "192.0.2.1:1", appAlone)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var waiters []<-chan admitted
	for i := range appQueueMax {
		waiters = append(waiters, admitAsync(c.Controller, request("192.0.2.2:1").WithContext(ctx), "app"))
		c.waitQueued(t, "app", i+1)
	}
	// The queue timeout is a minute: only a full queue answers at once.
	if _, why := c.Admit(request("192.0.2.3:1"), "app"); why != RefusedAppQueueFull {
		t.Fatalf("Admit with the queue full = %v, want %v", why, RefusedAppQueueFull)
	}
	if got := c.shed(t, "app_queue_full"); got != 1 {
		t.Errorf("scafo_edge_shed_total{reason=app_queue_full} = %v, want 1", got)
	}
	cancel()
	for i, w := range waiters {
		if a := receive(t, w, fmt.Sprintf("waiter %d after its client left", i+1)); a.why != RefusedCanceled {
			t.Errorf("waiter %d whose client left = %v, want %v", i+1, a.why, RefusedCanceled)
		}
	}
	if got := c.app("app"); got.Queued != 0 {
		t.Errorf("after the clients left: %+v, want nothing queued", got)
	}
	c.clients.sweep()
	if n := c.Snapshot().Clients; n != 1 {
		t.Errorf("Clients = %d after a sweep, want only the address holding requests", n)
	}
	for _, r := range []string{"app_queue_timeout", "client_canceled"} {
		if got := c.shed(t, r); got != 0 {
			t.Errorf("scafo_edge_shed_total{reason=%s} = %v, want 0: a client that leaves is not shed", r, got)
		}
	}
}

func TestAnApplicationWithinItsShareIsNeverQueuedBehindASaturatedOne(t *testing.T) {
	t.Parallel()
	c := newController(t, Options{Limits: testLimits(appMaxConns)})
	busy := newHolder(t)
	busy.take(t, c, "busy", "192.0.2.1:1", appAlone)
	var waiters []<-chan admitted
	for i := range 5 {
		waiters = append(waiters, admitAsync(c.Controller, request("192.0.2.1:1"), "busy"))
		c.waitQueued(t, "busy", i+1)
	}
	// The quiet application's share beside it is 0.75 × (20 − 15) = 3.
	quiet := newHolder(t)
	if got := quiet.admissible(t, c, "quiet", "192.0.2.2:1"); got != 3 {
		t.Errorf("quiet was admitted %d at once beside a saturated application, want its share 3", got)
	}
	quiet.releaseAll()
	for i := range 200 {
		k, why := c.Admit(probe("192.0.2.2:1"), "quiet")
		if why != Admitted {
			t.Fatalf("quiet request %d, one at a time = %v, want admitted at once", i+1, why)
		}
		k.Release()
	}
	for i, w := range waiters {
		if a, ok := returnedNow(w); ok {
			t.Errorf("busy waiter %d returned %v while busy held its share", i+1, a.why)
		}
	}
	// Releasing busy's slots grants its waiters in turn.
	for i, w := range waiters {
		busy.releaseOne()
		a := receive(t, w, fmt.Sprintf("busy waiter %d", i+1))
		if a.why != Admitted {
			t.Fatalf("busy waiter %d = %v, want admitted", i+1, a.why)
		}
		busy.tickets = append(busy.tickets, a.ticket)
	}
}

func TestASlotAnotherApplicationFreesWidensTheShareOfAWaitingOne(t *testing.T) {
	t.Parallel()
	c := newController(t, Options{Limits: testLimits(appMaxConns)})
	other := newHolder(t)
	other.take(t, c, "other", "192.0.2.1:1", 4)
	h := newHolder(t)
	if got := h.admissible(t, c, "app", "192.0.2.2:1"); got != 12 {
		t.Fatalf("app was admitted %d beside 4, want 12", got)
	}
	w := admitAsync(c.Controller, request("192.0.2.2:1"), "app")
	c.waitQueued(t, "app", 1)
	// 0.75 × (20 − 3) = 12.75: still 12.
	other.releaseOne()
	if a, ok := returnedNow(w); ok {
		t.Fatalf("waiter returned %v with its share still 12", a.why)
	}
	// 0.75 × (20 − 2) = 13.5: room for a thirteenth.
	other.releaseOne()
	a := receive(t, w, "the waiter after another application freed a slot")
	if a.why != Admitted {
		t.Fatalf("waiter = %v, want admitted", a.why)
	}
	h.tickets = append(h.tickets, a.ticket)
}

func TestConcurrentRequestsGiveEverySlotBack(t *testing.T) {
	t.Parallel()
	l := testLimits(appMaxConns)
	l.RequestsPerClient = 4
	l.QueueTimeout = 20 * time.Millisecond
	c := newController(t, Options{Limits: l})
	apps := []string{"a", "b", "c"}
	done := make(chan map[Refusal]int)
	for g := range 12 {
		go func() {
			seen := map[Refusal]int{}
			for i := range 200 {
				k, why := c.Admit(request(fmt.Sprintf("192.0.2.%d:1", g%3)), apps[(g+i)%len(apps)])
				seen[why]++
				k.Release()
			}
			done <- seen
		}()
	}
	total := map[Refusal]int{}
	for range 12 {
		for why, n := range <-done {
			total[why] += n
		}
	}
	if total[Admitted] == 0 {
		t.Errorf("no request was admitted: %v", total)
	}
	c.clients.sweep()
	s := c.Snapshot()
	if s.Clients != 0 {
		t.Errorf("Clients = %d once every request ended, want 0", s.Clients)
	}
	for _, a := range s.Apps {
		if a.InFlight != 0 || a.Queued != 0 {
			t.Errorf("%+v once every request ended, want nothing in flight or queued", a)
		}
	}
}
