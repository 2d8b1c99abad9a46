package prefetch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/scafo/scafo-edge/internal/backoff"
	"github.com/scafo/scafo-edge/internal/clock"
)

// Defaults for zero Options fields.
const (
	DefaultPerHour          = 20
	DefaultPerDomainPerWeek = 10
	DefaultWorkers          = 2
	DefaultRetryBase        = time.Minute
	DefaultRetryMax         = time.Hour
	// An order usually completes within seconds (1.3 s from document to
	// certificate against Pebble, a few more against Let's Encrypt), so an
	// edge that lost the fleet lock looks again soon rather than listing
	// the name as "elsewhere" long after the certificate is stored; a look
	// costs a storage read and a try-lock, and the wait doubles while the
	// holder works.
	DefaultBusyRetry    = 5 * time.Second
	DefaultReachTimeout = 10 * time.Second
)

// maxNames bounds the queue; names come from the routing document, so
// only a very large document reaches it. Beyond it the oldest names are
// left to on-demand issuance, so that a name the latest document adds is
// never kept out by older ones (newest first).
const maxNames = 10000

// Certs is what the queue asks of certificate management. All are
// required and must be safe for concurrent use.
type Certs struct {
	// Certifiable reports whether on-demand issuance would approve name,
	// a back-off after a failed issuance aside (HeldBack), and no wildcard
	// certificate covers it. Asked at the name's turn, and again just
	// before ordering.
	Certifiable func(name string) bool
	// HeldBack returns until when on-demand issuance holds name back after
	// a failed issuance; the zero time when it does not. The queue keeps
	// such a name and orders nothing for it before then. Nil: never.
	HeldBack func(name string) time.Time
	// Held reports whether a certificate for name is held in memory or in
	// storage.
	Held func(ctx context.Context, name string) bool
	// Obtain orders a certificate for name, stores it and loads it into
	// memory. It is called at most once per name at a time on an edge.
	Obtain func(ctx context.Context, name string) error
	// Storage keeps reachability tokens, the record of orders placed (for
	// the per-domain budget) and the fleet's prefetch locks. It should be
	// a certmagic.TryLocker; without one, edges sharing it do not split
	// the work (each still checks storage before ordering).
	Storage certmagic.Storage
}

// Options tunes a Queue. The zero value uses the defaults above.
type Options struct {
	// PerHour is the order budget: a bucket of PerHour orders, refilled at
	// PerHour an hour, so at most twice PerHour in any hour and PerHour an
	// hour sustained. Zero means DefaultPerHour.
	PerHour int
	// PerDomainPerWeek bounds orders per registered domain in any seven
	// days, counting those recorded in Certs.Storage: this edge's before a
	// restart, and every edge's in the fleet store. Zero means
	// DefaultPerDomainPerWeek.
	PerDomainPerWeek int
	// Workers bounds the names worked on at once (reachability checks and
	// orders). Zero means DefaultWorkers.
	Workers int
	// RetryBase and RetryMax shape the back-off of a name that does not
	// reach the fleet, or whose order failed: RetryBase, doubling with
	// each failure in a row, at most RetryMax. Zero means the defaults.
	RetryBase, RetryMax time.Duration
	// BusyRetry is how long an edge waits before looking again at a name
	// another edge of the fleet is working on. Zero means DefaultBusyRetry.
	BusyRetry time.Duration
	// ReachTimeout bounds one reachability check. Zero means
	// DefaultReachTimeout.
	ReachTimeout time.Duration
	// LookupNetIP resolves a name for its reachability check: every A and
	// AAAA record ("ip"), as net.Resolver.LookupNetIP. Nil means the system
	// resolver, and no look-up of a special-use name (such as one under
	// .test), which no public CA validates.
	LookupNetIP func(ctx context.Context, network, host string) ([]netip.Addr, error)
	// DialContext connects a reachability check to "<address>:80", for
	// each address LookupNetIP returned. Nil means a net.Dialer that
	// connects to public addresses only: a name leading to a loopback or
	// private address does not reach the fleet as a public CA sees it.
	// Tests point both at loopback.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// Clock is the queue's time for turns, back-offs and the budget, and
	// what it waits on between turns. Nil means the wall clock.
	Clock clock.Clock
	// Log receives the queue's decisions; the zero value logs nothing.
	Log zerolog.Logger
	// Registerer receives the queue's metrics; nil registers none.
	Registerer prometheus.Registerer
}

// State is where a name stands in the queue.
type State string

const (
	// Waiting: the name's turn has not come (workers busy, or newer names first).
	Waiting State = "waiting"
	// Working: the name is being checked or ordered.
	Working State = "working"
	// Budget: the order budget holds the name back.
	Budget State = "budget"
	// Unreachable: the name did not reach the fleet at one of its addresses;
	// it is checked again at Next.
	Unreachable State = "unreachable"
	// NoIPv6: the name reached the fleet at its IPv4 addresses, but it
	// publishes an AAAA record and this box has no IPv6 route to check
	// that the CA's IPv6 validation would reach the fleet too; it is
	// checked again at Next, never ordered blindly.
	NoIPv6 State = "no_ipv6"
	// Failed: the order failed; it is tried again at Next, once on-demand
	// issuance's back-off for it has ended too.
	Failed State = "failed"
	// Elsewhere: another edge of the fleet is working on the name.
	Elsewhere State = "elsewhere"
)

// Entry describes one queued name, for the status page.
type Entry struct {
	Name  string
	State State
	// Added is when the document added the name.
	Added time.Time
	// Next is the earliest time of the name's next turn.
	Next time.Time
	// Failures counts failed checks or orders in a row.
	Failures int
	// Error is the last check's or order's failure, if any.
	Error string
}

// entry is a queued name. Fields are guarded by Queue.mu.
type entry struct {
	Entry
	gen, seq int // document generation that added it, and position in it
	busy     int // looks in a row that found another edge working on it
	// noIPv6Told: the NoIPv6 warning was logged, once for the name.
	noIPv6Told bool
}

// Queue prefetches certificates for names the routing document adds. Its
// methods are safe for concurrent use.
type Queue struct {
	certs   Certs
	locker  certmagic.TryLocker // nil: no fleet split
	prober  *prober
	budget  *budget
	clock   clock.Clock
	workers int
	base    time.Duration
	max     time.Duration
	busy    time.Duration
	log     zerolog.Logger
	metrics *metrics

	ctx    context.Context
	cancel context.CancelFunc
	kick   chan struct{}
	done   chan struct{}
	wg     sync.WaitGroup

	mu      sync.Mutex
	present map[string]bool   // the latest document's names
	queue   map[string]*entry // names waiting for a certificate
	gen     int
	running int
}

// New starts a Queue; Stop ends it. The first Update's names are all new.
func New(c Certs, opts Options) (*Queue, error) {
	if c.Certifiable == nil || c.Held == nil || c.Obtain == nil || c.Storage == nil {
		return nil, errors.New("prefetch: Certifiable, Held, Obtain and Storage are required")
	}
	clk := clock.OrReal(opts.Clock)
	q := &Queue{
		certs:   c,
		prober:  newProber(c.Storage, opts.LookupNetIP, opts.DialContext, orDur(opts.ReachTimeout, DefaultReachTimeout)),
		budget:  newBudget(orInt(opts.PerHour, DefaultPerHour), orInt(opts.PerDomainPerWeek, DefaultPerDomainPerWeek), clk.Now()),
		clock:   clk,
		workers: orInt(opts.Workers, DefaultWorkers),
		base:    orDur(opts.RetryBase, DefaultRetryBase),
		max:     max(orDur(opts.RetryMax, DefaultRetryMax), orDur(opts.RetryBase, DefaultRetryBase)),
		busy:    orDur(opts.BusyRetry, DefaultBusyRetry),
		log:     opts.Log,
		kick:    make(chan struct{}, 1),
		done:    make(chan struct{}),
		present: map[string]bool{},
		queue:   map[string]*entry{},
	}
	q.locker, _ = c.Storage.(certmagic.TryLocker)
	var err error
	if q.metrics, err = newMetrics(opts.Registerer, q); err != nil {
		return nil, err
	}
	q.ctx, q.cancel = context.WithCancel(context.Background())
	go q.run()
	return q, nil
}

func orInt(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

func orDur(v, def time.Duration) time.Duration {
	if v > 0 {
		return v
	}
	return def
}

// Stop ends the queue: no new turns, work in progress is cancelled and
// waited for.
func (q *Queue) Stop() {
	q.cancel()
	<-q.done
	q.wg.Wait()
}

// Kick makes the queue look at its names now.
func (q *Queue) Kick() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// Update hands the queue the live document's names (route hosts and API
// hosts, in document order), after the document is live. Certifiable names
// not in the previous document are queued, ahead of those queued before;
// queued names no longer in the document are dropped, and so are the
// oldest beyond maxNames.
func (q *Queue) Update(names []string) {
	// Certifiable is the caller's code: asked without the lock, and only
	// for names new to the queue (present is replaced, never modified).
	q.mu.Lock()
	prev := q.present
	q.mu.Unlock()
	certifiable := make([]bool, len(names))
	for i, n := range names {
		certifiable[i] = !prev[n] && q.certs.Certifiable(n)
	}
	q.mu.Lock()
	q.gen++
	next := make(map[string]bool, len(names))
	now := q.clock.Now()
	added, dropped := 0, 0
	for i, n := range names {
		if next[n] {
			continue
		}
		next[n] = true
		if !certifiable[i] || q.present[n] || q.queue[n] != nil {
			continue
		}
		if added == maxNames {
			// Behind maxNames newer names: it would be trimmed below.
			dropped++
			continue
		}
		added++
		q.queue[n] = &entry{Entry: Entry{Name: n, State: Waiting, Added: now, Next: now}, gen: q.gen, seq: i}
	}
	for n, e := range q.queue {
		// A name at work notices at its next check (Certifiable).
		if !next[n] && e.State != Working {
			delete(q.queue, n)
			q.metrics.result("removed")
		}
	}
	dropped += q.trimLocked()
	q.present = next
	q.mu.Unlock()
	if dropped > 0 {
		q.log.Warn().Int("names", dropped).Int("queue", maxNames).Msg("certificate prefetch: queue full; its oldest names are left to on-demand issuance")
	}
	q.Kick()
}

// trimLocked drops the oldest queued names beyond maxNames, except those
// at work, and returns how many it dropped.
func (q *Queue) trimLocked() int {
	over := len(q.queue) - maxNames
	if over <= 0 {
		return 0
	}
	es := q.sortedLocked()
	n := 0
	for i := len(es) - 1; i >= 0 && n < over; i-- {
		if es[i].State != Working {
			delete(q.queue, es[i].Name)
			n++
		}
	}
	return n
}

// Status lists the queued names, newest first.
func (q *Queue) Status() []Entry {
	q.mu.Lock()
	defer q.mu.Unlock()
	es := q.sortedLocked()
	out := make([]Entry, len(es))
	for i, e := range es {
		out[i] = e.Entry
	}
	return out
}

// sortedLocked returns the queued entries newest first: later documents'
// names before earlier ones', document order within one.
func (q *Queue) sortedLocked() []*entry {
	es := make([]*entry, 0, len(q.queue))
	for _, e := range q.queue {
		es = append(es, e)
	}
	slices.SortFunc(es, func(a, b *entry) int {
		if a.gen != b.gen {
			return b.gen - a.gen
		}
		return a.seq - b.seq
	})
	return es
}

// run gives names their turns until Stop.
func (q *Queue) run() {
	defer close(q.done)
	timer := q.clock.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		wake := q.schedule()
		timer.Reset(wake)
		select {
		case <-q.ctx.Done():
			return
		case <-q.kick:
		case <-timer.C():
		}
	}
}

// schedule starts work on the names whose turn has come, newest first, up
// to the free workers, and returns how long until the next turn is due.
func (q *Queue) schedule() time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.clock.Now()
	wake := time.Hour
	for _, e := range q.sortedLocked() {
		if e.State == Working {
			continue
		}
		if d := e.Next.Sub(now); d > 0 {
			wake = min(wake, d)
			continue
		}
		if q.running >= q.workers {
			// Woken again when a worker finishes.
			continue
		}
		if d := q.budget.take(e.Name, now); d > 0 {
			q.holdLocked(e, now, d)
			wake = min(wake, d)
			continue
		}
		e.State = Working
		q.running++
		q.wg.Add(1)
		go q.work(e.Name)
	}
	return wake
}

// holdLocked puts e in the Budget state until now+d, counting the wait
// once per hold.
func (q *Queue) holdLocked(e *entry, now time.Time, d time.Duration) {
	if e.State != Budget {
		q.metrics.budgetWaits.Inc()
		q.log.Info().Str("name", e.Name).Dur("wait", d).Msg("certificate prefetch: budget spent; name waits")
	}
	e.State, e.Next = Budget, now.Add(d)
}

// outcome is what one turn did with a name.
type outcome struct {
	result string        // metric label: obtained, held, removed, elsewhere, unreachable, failed, backoff, budget
	retry  time.Duration // >0: the name stays queued and comes back then
	err    error
}

// work takes one turn of name and files its outcome.
func (q *Queue) work(name string) {
	defer q.wg.Done()
	o := q.turn(q.ctx, name)
	q.mu.Lock()
	q.running--
	e := q.queue[name]
	switch {
	case e == nil:
	case q.ctx.Err() != nil:
		e.State = Waiting
	case o.retry == 0 || !q.present[name]:
		delete(q.queue, name)
	default:
		now := q.clock.Now()
		e.Next = now.Add(o.retry)
		switch o.result {
		case "elsewhere":
			e.State = Elsewhere
		case "unreachable":
			e.State = Unreachable
		case "no_ipv6":
			e.State = NoIPv6
		case "budget":
			// Orders recorded by other edges, or before a restart, fill
			// the registered domain's week.
			q.holdLocked(e, now, o.retry)
		default:
			e.State = Failed
		}
		if o.err != nil {
			e.Error = o.err.Error()
		}
	}
	q.mu.Unlock()
	if q.ctx.Err() == nil {
		q.metrics.result(o.result)
	}
	q.Kick()
}

// turn checks name and orders its certificate if it still needs one. The
// name holds a share of the budget, spent only by an order.
func (q *Queue) turn(ctx context.Context, name string) outcome {
	spent := false
	defer func() {
		if !spent {
			q.budget.giveBack(name)
		}
	}()
	if !q.wanted(name) {
		return outcome{result: "removed"}
	}
	if o, ok := q.heldBack(name); ok {
		return o
	}
	if q.certs.Held(ctx, name) {
		return outcome{result: "held"}
	}
	if q.locker != nil {
		lock := "prefetch_" + name
		ok, err := q.locker.TryLock(ctx, lock)
		if err != nil {
			return q.failed(name, "failed", fmt.Errorf("try lock: %w", err))
		}
		if !ok {
			return outcome{result: "elsewhere", retry: q.busyRetry(name)}
		}
		defer func() {
			if err := q.certs.Storage.Unlock(context.WithoutCancel(ctx), lock); err != nil {
				q.log.Warn().Err(err).Str("name", name).Msg("certificate prefetch: unlock")
			}
		}()
		// The holder before us may have stored it.
		if q.certs.Held(ctx, name) {
			return outcome{result: "held"}
		}
	}
	if err := q.prober.check(ctx, name); err != nil {
		if ctx.Err() != nil {
			return outcome{result: "removed"}
		}
		res := "unreachable"
		switch {
		case errors.Is(err, ErrNoIPv6):
			res = "no_ipv6"
		case !errors.Is(err, ErrUnreachable):
			res = "failed"
		}
		return q.failed(name, res, err)
	}
	// The check took a while: the name may have left the document, or a
	// visitor's failed issuance may hold it back.
	if !q.wanted(name) {
		return outcome{result: "removed"}
	}
	if o, ok := q.heldBack(name); ok {
		return o
	}
	start := q.clock.Now()
	recorded, err := recordedOrders(ctx, q.certs.Storage, name, start)
	if err != nil {
		if ctx.Err() != nil {
			return outcome{result: "removed"}
		}
		return q.failed(name, "failed", err)
	}
	if d := q.budget.admit(name, recorded, start); d > 0 {
		return outcome{result: "budget", retry: d}
	}
	q.budget.spend(name, start)
	spent = true
	if err := recordOrder(ctx, q.certs.Storage, name, start); err != nil {
		// The order is within this edge's budget; only the fleet's view
		// and the next restart's miss it.
		q.log.Warn().Err(err).Str("name", name).Msg("certificate prefetch: order not recorded")
	}
	if err := q.certs.Obtain(ctx, name); err != nil {
		if ctx.Err() != nil {
			return outcome{result: "removed"}
		}
		return q.failed(name, "failed", fmt.Errorf("obtain: %w", err))
	}
	q.log.Info().Str("name", name).Dur("took", q.clock.Now().Sub(start)).Msg("certificate prefetched")
	return outcome{result: "obtained"}
}

// wanted reports whether name is still in the document and certifiable.
func (q *Queue) wanted(name string) bool {
	q.mu.Lock()
	present := q.present[name]
	q.mu.Unlock()
	return present && q.certs.Certifiable(name)
}

// heldBack returns the outcome of a turn that finds on-demand issuance
// holding name back after a failed issuance: the name stays queued until
// the back-off ends, since an order before then is one on-demand issuance
// would refuse.
func (q *Queue) heldBack(name string) (outcome, bool) {
	d := q.heldBackFor(name)
	if d <= 0 {
		return outcome{}, false
	}
	return outcome{result: "backoff", retry: d, err: fmt.Errorf("on-demand issuance holds the name back for %v after a failed issuance", d.Round(time.Second))}, true
}

// heldBackFor returns how long on-demand issuance still holds name back.
func (q *Queue) heldBackFor(name string) time.Duration {
	if q.certs.HeldBack == nil {
		return 0
	}
	until := q.certs.HeldBack(name)
	if until.IsZero() {
		return 0
	}
	return until.Sub(q.clock.Now())
}

// failed counts a failure for name and returns its back-off: RetryBase,
// doubled for each failure in a row, at most RetryMax, and no shorter than
// on-demand issuance's back-off for it (a failed order starts one).
func (q *Queue) failed(name, result string, err error) outcome {
	q.mu.Lock()
	n, tell := 1, false
	if e := q.queue[name]; e != nil {
		e.Failures++
		e.busy = 0
		n = e.Failures
		if result == "no_ipv6" && !e.noIPv6Told {
			e.noIPv6Told, tell = true, true
		}
	}
	q.mu.Unlock()
	d := max(backoff.Doubling(q.base, q.max, n), q.heldBackFor(name))
	if tell {
		// Once per name: the operator's remedy (IPv6 for the box, or the
		// AAAA record removed) does not change from one retry to the next.
		q.log.Warn().Err(err).Str("name", name).Msg("certificate prefetch: the name has an AAAA record and this box has no IPv6 route to check it; no order until it can be checked (a visitor still gets a certificate on demand)")
	}
	q.log.Info().Err(err).Str("name", name).Dur("retry_in", d).Msg("certificate prefetch: " + result)
	return outcome{result: result, retry: d, err: err}
}

// busyRetry returns when to look again at a name another edge holds:
// BusyRetry, doubling with each look in a row, at most RetryMax.
func (q *Queue) busyRetry(name string) time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 1
	if e := q.queue[name]; e != nil {
		e.busy++
		n = e.busy
	}
	return backoff.Doubling(q.busy, q.max, n)
}
