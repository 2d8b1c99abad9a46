package backhaul

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/scafo/scafo-edge/internal/backoff"
	"github.com/scafo/scafo-edge/node"
)

// UpstreamHealth is the passive health of one upstream, for the status page.
type UpstreamHealth struct {
	Node    string
	Address string
	// Failures counts consecutive connect failures; a connection that
	// succeeds resets it.
	Failures int
	// EjectedUntil is when the upstream is tried again ahead of the others;
	// zero or past means it is not ejected.
	EjectedUntil time.Time
}

// Health returns the passive health of every upstream forwarded to within
// the last hour or so (older entries are forgotten as new upstreams appear),
// sorted by address then node.
func (p *Proxy) Health() []UpstreamHealth {
	m := *p.health.hosts.Load()
	out := make([]UpstreamHealth, 0, len(m))
	for u, h := range m {
		uh := UpstreamHealth{Node: u.Node, Address: u.Address, Failures: int(h.failures.Load())}
		if until := h.ejectedUntil.Load(); until != 0 {
			uh.EjectedUntil = time.Unix(0, until)
		}
		out = append(out, uh)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Address != out[j].Address {
			return out[i].Address < out[j].Address
		}
		return out[i].Node < out[j].Node
	})
	return out
}

// hostState is the passive health of one upstream. Its fields are atomics so
// the request path reads them without a lock.
type hostState struct {
	failures     atomic.Int32
	ejectedUntil atomic.Int64 // unix nanoseconds; 0: never ejected
	lastUsed     atomic.Int64 // unix nanoseconds, coarse (see touch)
}

// health maps each upstream to its state. The map is copied on write and read
// with one atomic load, so the request path takes no lock and allocates
// nothing; writes happen only when an upstream is first seen.
type health struct {
	base, max time.Duration

	mu        sync.Mutex // serialises writers of hosts
	hosts     atomic.Pointer[map[node.Upstream]*hostState]
	lastSweep time.Time // guarded by mu
}

// Entries unused this long are forgotten, so that upstream addresses that
// come and go with deploys do not accumulate for the life of the process.
const (
	forgetAfter   = time.Hour
	sweepInterval = time.Minute
	touchEvery    = int64(time.Minute)
)

func (h *health) init(base, max time.Duration) {
	h.base, h.max = base, max
	m := map[node.Upstream]*hostState{}
	h.hosts.Store(&m)
}

// state returns u's state, creating it on first sight.
func (h *health) state(u node.Upstream, now time.Time) *hostState {
	if s, ok := (*h.hosts.Load())[u]; ok {
		s.touch(now)
		return s
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	old := *h.hosts.Load()
	if s, ok := old[u]; ok {
		return s
	}
	sweep := now.Sub(h.lastSweep) >= sweepInterval
	next := make(map[node.Upstream]*hostState, len(old)+1)
	for k, v := range old {
		if sweep && now.UnixNano()-v.lastUsed.Load() > int64(forgetAfter) {
			continue
		}
		next[k] = v
	}
	if sweep {
		h.lastSweep = now
	}
	s := &hostState{}
	s.lastUsed.Store(now.UnixNano())
	next[u] = s
	h.hosts.Store(&next)
	return s
}

// touch records use, writing at most once a minute so that a hot upstream's
// cache line is not written on every request.
func (s *hostState) touch(now time.Time) {
	n := now.UnixNano()
	if n-s.lastUsed.Load() > touchEvery {
		s.lastUsed.Store(n)
	}
}

// ejected reports whether the upstream should be skipped at now.
func (s *hostState) ejected(now time.Time) bool {
	until := s.ejectedUntil.Load()
	return until != 0 && now.UnixNano() < until
}

// connectFailed records a connect failure and ejects the upstream for a
// period that doubles with each consecutive failure. It returns the
// consecutive failure count and the ejection period.
func (h *health) connectFailed(s *hostState, now time.Time) (int32, time.Duration) {
	n := s.failures.Add(1)
	d := backoff.Doubling(h.base, h.max, int(n))
	s.ejectedUntil.Store(now.Add(d).UnixNano())
	return n, d
}

// connected records that a connection succeeded and returns the number of
// consecutive failures it ended (0 when the upstream was healthy).
func (h *health) connected(s *hostState) int32 {
	if s.failures.Load() == 0 {
		return 0 // the common case: no write to a shared cache line
	}
	n := s.failures.Swap(0)
	s.ejectedUntil.Store(0)
	return n
}

// ejectedCount counts upstreams ejected at now, for the gauge.
func (h *health) ejectedCount(now time.Time) int {
	n := 0
	for _, s := range *h.hosts.Load() {
		if s.ejected(now) {
			n++
		}
	}
	return n
}
