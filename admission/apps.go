package admission

import (
	"context"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// appTable holds each application's requests in flight to its upstreams and
// its queue; the share rule, after HAProxy's per-server maxconn and queue,
// is docs/design.md's (admission table). The map is copied on write: a
// request's lookup takes no lock, and new applications are rare.
type appTable struct {
	apps     atomic.Pointer[map[string]*appState]
	mu       sync.Mutex // serialises inserts and pruning
	budget   int64
	share    float64
	queueMax int
	timeout  time.Duration
	total    atomic.Int64 // in flight across applications
	level    atomic.Int64 // during an episode, fairLevel's; 0: none
	parties  []int64      // fairLevel's scratch: the monitor's alone
	queued   atomic.Int64
	m        *metrics
}

// appState is one application's load. A request within its share takes
// and gives back its slot with atomics alone: the lock guards the queue,
// which only requests past the share (and the releases that find them
// waiting) touch.
type appState struct {
	name     string
	inFlight atomic.Int64
	waiting  atomic.Int64 // len(queue), read without the lock
	idleAt   atomic.Int64 // when it last went to zero in flight, Unix ns; 0: never in flight
	retired  atomic.Bool  // pruned: a request that took a slot here takes it again on its successor
	shedding atomic.Int64 // requests shedHeld closed that are not released yet

	mu    sync.Mutex
	queue []*waiter // guarded by mu

	inFlightGauge, queuedGauge prometheus.Gauge
}

type waiter struct {
	ch      chan struct{}
	granted bool // under the app's mu
}

func (t *appTable) init(l Limits) {
	t.budget = int64(max(1, l.MaxConns/2))
	t.share = l.AppShare
	t.queueMax = int(max(16, t.budget/16))
	t.timeout = l.QueueTimeout
	empty := map[string]*appState{}
	t.apps.Store(&empty)
}

func (t *appTable) get(name string) *appState {
	if a := (*t.apps.Load())[name]; a != nil {
		return a
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := *t.apps.Load()
	if a := cur[name]; a != nil {
		return a
	}
	next := maps.Clone(cur)
	a := &appState{name: name, inFlightGauge: noGauge, queuedGauge: noGauge}
	if t.m != nil {
		a.inFlightGauge = t.m.appInFlight.WithLabelValues(name)
		a.queuedGauge = t.m.appQueued.WithLabelValues(name)
	}
	next[name] = a
	t.apps.Store(&next)
	return a
}

// noGauge is the gauges of an appTable without metrics (a test's).
var noGauge = prometheus.NewGauge(prometheus.GaugeOpts{Name: "unregistered"})

// limitAt is the share of an application holding inFlight while total
// are in flight across applications.
func (t *appTable) limitAt(inFlight, total int64) int64 {
	limit := max(1, int64(t.share*float64(t.budget-(total-inFlight))))
	if level := t.level.Load(); level > 0 {
		limit = min(limit, level)
	}
	return limit
}

// fairLevel splits capacity descriptors, max-min fair, between each
// application's requests in flight and, as one party more, the inUse
// descriptors that carry no request (docs/design.md, admission table). It
// returns the requests an application may hold at that level, or 0 when
// everyone's holdings fit or no other application had a request in flight
// in the last second.
func (t *appTable) fairLevel(capacity, inUse int64, now time.Time) int64 {
	parties := t.parties[:0]
	held, apps := int64(0), 0
	recently := now.Add(-time.Second).UnixNano()
	for _, a := range *t.apps.Load() {
		n := a.inFlight.Load() - a.shedding.Load()
		if n > 0 || a.idleAt.Load() >= recently {
			apps++
		}
		if n > 0 {
			parties = append(parties, 2*n)
			held += 2 * n
		}
	}
	parties = append(parties, max(0, inUse-held))
	t.parties = parties
	if apps < 2 || held+parties[len(parties)-1] <= capacity {
		return 0
	}
	slices.Sort(parties)
	left := capacity
	for i, p := range parties {
		if equal := left / int64(len(parties)-i); p > equal {
			return max(1, equal/2)
		}
		left -= p
	}
	return 0
}

// busy reports whether a's requests contend for slots: a's are waiting,
// or the request budget is past its high-water mark.
func (t *appTable) busy(a *appState) bool {
	return a.waiting.Load() > 0 || float64(t.total.Load()) >= highWater*float64(t.budget)
}

// tryTake takes a slot of a's if its share and the budget have one. Two
// applications taking their last slots at once can pass the budget by one
// each, for as long as the requests last: a few at most, never a flood.
func (t *appTable) tryTake(a *appState) bool {
	for {
		n, total := a.inFlight.Load(), t.total.Load()
		if total >= t.budget || n >= t.limitAt(n, total) {
			return false
		}
		if a.inFlight.CompareAndSwap(n, n+1) {
			t.total.Add(1)
			a.inFlightGauge.Inc()
			return true
		}
	}
}

// giveBack gives a's slot back, telling no waiter.
func (t *appTable) giveBack(a *appState) {
	if a.inFlight.Add(-1) == 0 {
		a.idleAt.Store(time.Now().UnixNano())
	}
	t.total.Add(-1)
	a.inFlightGauge.Dec()
}

// acquire takes a slot for a request of a's (got from get(name)), waiting
// in its queue for up to the queue timeout, and returns the state to
// release.
func (t *appTable) acquire(ctx context.Context, name string, a *appState) (*appState, Refusal) {
	for ; ; a = t.get(name) {
		if a.waiting.Load() == 0 && t.tryTake(a) {
			if a.retired.Load() { // pruned as it took the slot
				t.giveBack(a)
				continue
			}
			return a, Admitted
		}
		a.mu.Lock()
		if a.retired.Load() {
			a.mu.Unlock()
			continue
		}
		if len(a.queue) >= t.queueMax {
			a.mu.Unlock()
			return nil, RefusedAppQueueFull
		}
		w := &waiter{ch: make(chan struct{})}
		a.queue = append(a.queue, w)
		a.waiting.Add(1)
		t.queued.Add(1)
		a.queuedGauge.Inc()
		// Counted as waiting first, then tried again: a slot given back
		// in between, by a release that saw no one waiting, is taken here.
		t.grant(a)
		a.mu.Unlock()
		return t.wait(ctx, a, w)
	}
}

func (t *appTable) wait(ctx context.Context, a *appState, w *waiter) (*appState, Refusal) {
	timer := time.NewTimer(t.timeout)
	defer timer.Stop()
	why := RefusedAppQueueTimeout
	select {
	case <-w.ch:
		return a, Admitted
	case <-timer.C:
	case <-ctx.Done():
		why = RefusedCanceled
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if w.granted { // granted as it gave up: it has the slot
		return a, Admitted
	}
	a.queue = slices.DeleteFunc(a.queue, func(q *waiter) bool { return q == w })
	t.dequeued(a)
	return nil, why
}

func (t *appTable) dequeued(a *appState) {
	a.waiting.Add(-1)
	t.queued.Add(-1)
	a.queuedGauge.Dec()
}

// grant hands free slots to a's queue, first come first served; a.mu is
// held.
func (t *appTable) grant(a *appState) {
	for len(a.queue) > 0 && t.tryTake(a) {
		w := a.queue[0]
		a.queue[0] = nil
		a.queue = a.queue[1:]
		t.dequeued(a)
		w.granted = true
		close(w.ch)
	}
}

// release gives a's slot back, to its own queue first.
func (t *appTable) release(a *appState) {
	t.giveBack(a)
	// Given back first, then the waiters looked for (acquire does the
	// reverse), so that one of the two sees the other.
	if a.waiting.Load() > 0 {
		a.mu.Lock()
		t.grant(a)
		a.mu.Unlock()
	}
	t.grantAll() // a slot freed here widens every other application's share
}

func (t *appTable) grantAll() {
	if t.queued.Load() == 0 {
		return
	}
	for _, a := range *t.apps.Load() {
		if a.waiting.Load() == 0 {
			continue
		}
		a.mu.Lock()
		t.grant(a)
		a.mu.Unlock()
	}
}

// appIdleFor is how long an application with nothing in flight keeps its
// state (and metric series) before prune drops it.
const appIdleFor = 10 * time.Minute

func (t *appTable) prune() {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := *t.apps.Load()
	var next map[string]*appState
	now := time.Now()
	for name, a := range cur {
		if a.inFlight.Load() != 0 || a.waiting.Load() != 0 || now.Sub(time.Unix(0, a.idleAt.Load())) <= appIdleFor {
			continue
		}
		a.mu.Lock()
		// Retired first, then looked at again (acquire takes, then looks
		// at retired): a request that took a slot meanwhile keeps it.
		a.retired.Store(true)
		if a.inFlight.Load() != 0 || len(a.queue) != 0 {
			a.retired.Store(false)
			a.mu.Unlock()
			continue
		}
		a.mu.Unlock()
		if next == nil {
			next = maps.Clone(cur)
		}
		delete(next, name)
		if t.m != nil {
			t.m.appInFlight.DeleteLabelValues(name)
			t.m.appQueued.DeleteLabelValues(name)
		}
	}
	if next != nil {
		t.apps.Store(&next)
	}
}

func (t *appTable) loads() []AppLoad {
	var out []AppLoad
	for _, a := range *t.apps.Load() {
		n := a.inFlight.Load()
		out = append(out, AppLoad{Application: a.name, InFlight: int(n), Queued: int(a.waiting.Load()),
			Limit: int(t.limitAt(n, t.total.Load()))})
	}
	return out
}
