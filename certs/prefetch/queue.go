package prefetch

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/internal/clock"
)

// maxNames bounds the queue; names come from the routing document, so
// only a very large document reaches it. Beyond it the oldest names are
// left to on-demand issuance, so that a name the latest document adds is
// never kept out by older ones (newest first).
const maxNames = 10000

// entry is a queued name. Fields are guarded by Queue.mu.
type entry struct {
	Entry
	gen, seq int // document generation that added it, and position in it
	busy     int // looks in a row that found another edge working on it
	notYet   int // checks that found an edge without the name yet
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
	poll    time.Duration
	log     zerolog.Logger
	metrics *metrics
	// id names this queue in the reach verdicts it writes.
	id string

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
		poll:    orDur(opts.PollInterval, DefaultPollInterval),
		log:     opts.Log,
		id:      randomHex(16),
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
	q.prober.stored = q.metrics.checks.Inc
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
