package prefetch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"time"
)

// verdictKeyPrefix is where the fleet's reachability verdicts live in the
// certificate storage, one record per name. ServeReach never reads them:
// it reads 32-hex tokens under reachKeyPrefix only.
const verdictKeyPrefix = "scafo-edge/reach-verdict/"

// verdict is what a name's last turn under the fleet lock found, when it
// found the name not ready (propagating, unreachable, or an order that
// failed), and until when that holds. An edge that later finds the name
// due adopts the verdict instead of checking again; the record is its own
// time-to-live: past Next (Until for the edges that did not write it), a
// verdict is due and the next edge to take the lock checks again and
// replaces it.
type verdict struct {
	// Result is the turn's result: propagating, unreachable or failed.
	Result string `json:"result"`
	// Error is the check's or order's failure, for the status page.
	Error string `json:"error"`
	// Checked is when the turn found it; Next when it is due again.
	Checked time.Time `json:"checked"`
	Next    time.Time `json:"next"`
	// By names the queue that wrote it (random, one per process).
	By string `json:"by"`
	// Failures and NotYet carry the writer's counts of failures and of
	// checks that found an edge without the name, so that whichever edge
	// checks next goes on with the same back-off and the same bound.
	Failures int `json:"failures"`
	NotYet   int `json:"not_yet"`
}

// verdictResults are the results a verdict records.
var verdictResults = map[string]bool{"propagating": true, "unreachable": true, "failed": true}

func verdictKey(name string) string { return verdictKeyPrefix + name }

// dueFor returns when v stops holding for the queue id. A propagating
// verdict says the checker's view of the fleet works and an edge's
// document lags: its writer checks again at Next, and the others look
// BusyRetry after it, by when it has usually stored the certificate or a
// new verdict (the check may not work from every edge: one behind a NAT
// without hairpinning cannot reach its own public address). Any other
// verdict is due for every edge at Next: after a back-off the lock goes
// to whichever edge asks first.
func (q *Queue) dueFor(v verdict) time.Time {
	if v.Result == "propagating" && v.By != q.id {
		return v.Next.Add(q.busy)
	}
	return v.Next
}

// readVerdict returns name's verdict; false when there is none, it cannot
// be read or decoded (the edge then checks, as without one).
func (q *Queue) readVerdict(ctx context.Context, name string) (verdict, bool) {
	b, err := q.certs.Storage.Load(ctx, verdictKey(name))
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) && ctx.Err() == nil {
			q.log.Debug().Err(err).Str("name", name).Msg("certificate prefetch: reach verdict not read")
		}
		return verdict{}, false
	}
	var v verdict
	if json.Unmarshal(b, &v) != nil || !verdictResults[v.Result] || v.Next.IsZero() {
		return verdict{}, false
	}
	return v, true
}

// adopt returns the outcome of a turn that finds name's verdict v still
// holding: the verdict's result, due again when it stops holding (at most
// RetryMax away, whatever the writer's clock said), with the writer's
// counts taken on so that this edge, should it check next, backs off as
// the writer would have. false: v is due.
func (q *Queue) adopt(name string, v verdict) (outcome, bool) {
	d := q.dueFor(v).Sub(q.clock.Now())
	if d <= 0 {
		return outcome{}, false
	}
	q.mu.Lock()
	if e := q.queue[name]; e != nil {
		e.Failures = max(e.Failures, v.Failures)
		e.notYet = max(e.notYet, v.NotYet)
		e.busy = 0
	}
	q.mu.Unlock()
	msg := v.Error
	if v.By != q.id {
		msg += " (checked by another edge of this fleet)"
	}
	return outcome{result: v.Result, retry: min(d, q.max), err: errors.New(msg), adopted: true}, true
}

// recordVerdict leaves what the lock holder's turn found for the other
// edges: a verdict when the name is not ready (a check that failed as
// propagating or unreachable, or a failed order), nothing otherwise; and
// deletes the verdict seen under the lock once the name is obtained. A
// result that depends on this edge (no IPv6 route, its budget, its
// storage failing) is no verdict for the others: they check themselves.
func (q *Queue) recordVerdict(ctx context.Context, name string, o outcome, seen bool) {
	if ctx.Err() != nil {
		return
	}
	key := verdictKey(name)
	if o.result == "obtained" {
		if seen {
			if err := q.certs.Storage.Delete(ctx, key); err != nil && !errors.Is(err, fs.ErrNotExist) {
				q.log.Debug().Err(err).Str("name", name).Msg("certificate prefetch: reach verdict not deleted")
			}
		}
		return
	}
	if o.retry <= 0 || !(o.result == "propagating" || o.result == "unreachable" || (o.result == "failed" && o.ordered)) {
		return
	}
	now := q.clock.Now()
	v := verdict{Result: o.result, Checked: now, Next: now.Add(o.retry), By: q.id}
	if o.err != nil {
		v.Error = o.err.Error()
	}
	q.mu.Lock()
	if e := q.queue[name]; e != nil {
		v.Failures, v.NotYet = e.Failures, e.notYet
	}
	q.mu.Unlock()
	b, err := json.Marshal(v)
	if err == nil {
		err = q.certs.Storage.Store(ctx, key, b)
	}
	if err != nil {
		// The other edges then check for themselves, as before verdicts.
		q.log.Warn().Err(fmt.Errorf("store reach verdict: %w", err)).Str("name", name).Msg("certificate prefetch: reach verdict not recorded")
	}
}
