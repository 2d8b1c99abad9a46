package admission

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// appTable holds each application's requests in flight to its upstreams and
// its queue. The map is copied on write: a request's lookup takes no lock,
// and new applications are rare.
//
// The share rule, after HAProxy's per-server maxconn and queue: the request
// budget is half the connection budget (a proxied request holds a client and
// an upstream descriptor), and an application may hold in flight share × what
// the other applications leave of it. Alone on the box it gets share of the
// whole budget; beside others it gets share of the rest, so some always
// remains for an application that has none in flight. Past its limit a
// request waits in a FIFO queue of at most queueMax for queueTimeout.
type appTable struct {
	apps     atomic.Pointer[map[string]*appState]
	mu       sync.Mutex // serialises inserts and pruning
	budget   int64
	share    float64
	queueMax int
	timeout  time.Duration
	total    atomic.Int64 // in flight across applications
	queued   atomic.Int64
	m        *metrics
}

type appState struct {
	name string
	mu   sync.Mutex
	// Guarded by mu.
	inFlight int
	queue    []*waiter
	retired  bool
	idleAt   time.Time // when it last went to zero in flight

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

// get returns name's state, creating it on first use.
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
	a := &appState{name: name, idleAt: time.Now()}
	if t.m != nil {
		a.inFlightGauge = t.m.appInFlight.WithLabelValues(name)
		a.queuedGauge = t.m.appQueued.WithLabelValues(name)
	}
	next[name] = a
	t.apps.Store(&next)
	return a
}

// limit is a's share now; a.mu is held.
func (t *appTable) limit(a *appState) int {
	others := t.total.Load() - int64(a.inFlight)
	return max(1, int(t.share*float64(t.budget-others)))
}

// fits reports whether a may start one more request; a.mu is held.
func (t *appTable) fits(a *appState) bool {
	return a.inFlight < t.limit(a) && t.total.Load() < t.budget
}

func (t *appTable) take(a *appState) {
	a.inFlight++
	t.total.Add(1)
	if a.inFlightGauge != nil {
		a.inFlightGauge.Inc()
	}
}

// acquire takes a slot for a request of name's, waiting in its queue for up
// to the queue timeout. It returns the state to release, or the refusal.
func (t *appTable) acquire(ctx context.Context, name string) (*appState, Refusal) {
	for {
		a := t.get(name)
		a.mu.Lock()
		if a.retired {
			a.mu.Unlock()
			continue
		}
		if len(a.queue) == 0 && t.fits(a) {
			t.take(a)
			a.mu.Unlock()
			return a, Admitted
		}
		if len(a.queue) >= t.queueMax {
			a.mu.Unlock()
			return nil, RefusedAppQueueFull
		}
		w := &waiter{ch: make(chan struct{})}
		a.queue = append(a.queue, w)
		t.queued.Add(1)
		if a.queuedGauge != nil {
			a.queuedGauge.Inc()
		}
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
	for i, q := range a.queue {
		if q == w {
			a.queue = append(a.queue[:i], a.queue[i+1:]...)
			break
		}
	}
	t.dequeued(a)
	return nil, why
}

func (t *appTable) dequeued(a *appState) {
	t.queued.Add(-1)
	if a.queuedGauge != nil {
		a.queuedGauge.Dec()
	}
}

// grant hands free slots to a's queue, first come first served; a.mu is
// held.
func (t *appTable) grant(a *appState) {
	for len(a.queue) > 0 && t.fits(a) {
		w := a.queue[0]
		a.queue[0] = nil
		a.queue = a.queue[1:]
		t.dequeued(a)
		t.take(a)
		w.granted = true
		close(w.ch)
	}
}

// release gives a's slot back, to its own queue first.
func (t *appTable) release(a *appState) {
	a.mu.Lock()
	a.inFlight--
	t.total.Add(-1)
	if a.inFlightGauge != nil {
		a.inFlightGauge.Dec()
	}
	if a.inFlight == 0 {
		a.idleAt = time.Now()
	}
	t.grant(a)
	a.mu.Unlock()
	if t.queued.Load() > 0 {
		// A slot freed here widens every other application's share.
		t.grantAll()
	}
}

// grantAll hands free slots to every application's queue.
func (t *appTable) grantAll() {
	if t.queued.Load() == 0 {
		return
	}
	for _, a := range *t.apps.Load() {
		a.mu.Lock()
		if len(a.queue) > 0 {
			t.grant(a)
		}
		a.mu.Unlock()
	}
}

// appIdleFor is how long an application with nothing in flight keeps its
// state (and metric series) before it is dropped.
const appIdleFor = 10 * time.Minute

// prune drops the applications idle for appIdleFor, and their series.
func (t *appTable) prune(m *metrics) {
	t.mu.Lock()
	defer t.mu.Unlock()
	cur := *t.apps.Load()
	var next map[string]*appState
	now := time.Now()
	for name, a := range cur {
		a.mu.Lock()
		if a.inFlight == 0 && len(a.queue) == 0 && now.Sub(a.idleAt) > appIdleFor {
			a.retired = true
			if next == nil {
				next = maps.Clone(cur)
			}
			delete(next, name)
			if m != nil {
				m.appInFlight.DeleteLabelValues(name)
				m.appQueued.DeleteLabelValues(name)
			}
		}
		a.mu.Unlock()
	}
	if next != nil {
		t.apps.Store(&next)
	}
}

func (t *appTable) loads() []AppLoad {
	var out []AppLoad
	for _, a := range *t.apps.Load() {
		a.mu.Lock()
		out = append(out, AppLoad{Application: a.name, InFlight: a.inFlight, Queued: len(a.queue), Limit: t.limit(a)})
		a.mu.Unlock()
	}
	return out
}
