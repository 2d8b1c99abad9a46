package prefetch

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/scafo/scafo-edge/internal/backoff"
)

// outcome is what one turn did with a name.
type outcome struct {
	result string        // metric label: one of results
	retry  time.Duration // >0: the name stays queued and comes back then
	err    error
	// ordered: the turn placed an order, which failed; the CA counted it,
	// so the turn counts as failed whatever becomes of the name.
	ordered bool
	// adopted: the turn took another turn's verdict (verdict.go) rather
	// than checking; that turn's edge logged what it found.
	adopted bool
}

// work takes one turn of name and files its outcome.
func (q *Queue) work(name string) {
	defer q.wg.Done()
	o := q.turn(q.ctx, name)
	q.mu.Lock()
	q.running--
	e := q.queue[name]
	during := ""
	switch {
	case e == nil:
	case q.ctx.Err() != nil:
		e.State = Waiting
	case o.retry == 0:
		delete(q.queue, name)
	case !q.present[name]:
		// The name left the document while its turn was at work (its
		// check in flight, mostly): it is dropped, and its turn counts as
		// removed, not as what the check found with a retry nobody waits
		// for.
		delete(q.queue, name)
		if !o.ordered {
			during, o.result = o.result, "removed"
		}
	default:
		now := q.clock.Now()
		e.Next = now.Add(o.retry)
		switch o.result {
		case "elsewhere":
			e.State = Elsewhere
		case "propagating":
			e.State = Propagating
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
		q.logOutcome(name, o, during)
	}
	q.Kick()
}

// logOutcome logs what a turn did with name when it is news to the
// operator: a failure and when it is tried again, or the name's removal.
// during is what the turn had found when the name left the document while
// it was at work.
func (q *Queue) logOutcome(name string, o outcome, during string) {
	switch o.result {
	case "removed":
		ev := q.log.Info().Str("name", name)
		if during != "" {
			ev = ev.Str("during", during).AnErr("check", o.err)
		}
		ev.Msg("certificate prefetch: the name left the document (or needs no prefetch now); dropped")
	case "propagating", "unreachable", "no_ipv6", "failed":
		if o.adopted {
			q.log.Debug().Err(o.err).Str("name", name).Dur("retry_in", o.retry).Msg("certificate prefetch: " + o.result + " (reach verdict)")
			return
		}
		q.log.Info().Err(o.err).Str("name", name).Dur("retry_in", o.retry).Msg("certificate prefetch: " + o.result)
	}
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
	if q.locker == nil {
		return q.checkAndOrder(ctx, name, &spent)
	}
	// One check a name for the fleet: the edge holding the name's lock
	// checks it and leaves its verdict; the others adopt the verdict until
	// it is due instead of checking again.
	if v, ok := q.readVerdict(ctx, name); ok {
		if o, ok := q.adopt(name, v); ok {
			return o
		}
	}
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
	// The holder before us may have stored it, or left a verdict since
	// the look above.
	if q.certs.Held(ctx, name) {
		return outcome{result: "held"}
	}
	v, seen := q.readVerdict(ctx, name)
	if seen {
		if o, ok := q.adopt(name, v); ok {
			return o
		}
	}
	o := q.checkAndOrder(ctx, name, &spent)
	q.recordVerdict(ctx, name, o, seen)
	return o
}

// checkAndOrder checks that name reaches the fleet and, if it still needs
// a certificate, orders it, setting *spent when the order spends the
// name's share of the budget. In the fleet the caller holds the name's
// lock.
func (q *Queue) checkAndOrder(ctx context.Context, name string, spent *bool) outcome {
	if err := q.prober.check(ctx, name); err != nil {
		if ctx.Err() != nil {
			return outcome{result: "removed"}
		}
		if errors.Is(err, errNotYet) {
			if d, ok := q.notYetRetry(name); ok {
				return outcome{result: "propagating", retry: d, err: err}
			}
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
	*spent = true
	if err := recordOrder(ctx, q.certs.Storage, name, start); err != nil {
		// The order is within this edge's budget; only the fleet's view
		// and the next restart's miss it.
		q.log.Warn().Err(err).Str("name", name).Msg("certificate prefetch: order not recorded")
	}
	if err := q.certs.Obtain(ctx, name); err != nil {
		if ctx.Err() != nil {
			return outcome{result: "removed"}
		}
		o := q.failed(name, "failed", fmt.Errorf("obtain: %w", err))
		o.ordered = true
		return o
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
	return outcome{result: result, retry: d, err: err}
}

// maxNotYet bounds the checks of a name, past its first, that run about
// one poll interval apart because an edge of this fleet did not name it
// yet. A document reaches every edge within an interval, so the first
// such re-check usually passes; one still failing after maxNotYet has
// another cause (an edge that cannot fetch the document, one of another
// fleet), which the name's RetryBase back-off then waits out.
const maxNotYet = 3

// notYetRetry returns when to check name again after a check found an
// edge of this fleet without it: between 1.1 and 1.5 poll intervals, past
// the poll of an edge up to one interval behind the one checking, jittered
// so the fleet's edges do not check in step; false once the name has had
// maxNotYet such re-checks.
func (q *Queue) notYetRetry(name string) (time.Duration, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	e := q.queue[name]
	if e == nil || e.notYet >= maxNotYet {
		return 0, false
	}
	e.notYet++
	return q.poll + q.poll/10 + rand.N(q.poll*2/5), true
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
