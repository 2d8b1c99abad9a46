package certs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.uber.org/zap/zapcore"

	"github.com/scafo/scafo-edge/certs/internal/stamps"
	"github.com/scafo/scafo-edge/internal/clock"
)

// Let's Encrypt refuses a name for the rest of the hour once an account
// has had FailedValidationLimit failed validations (invalid
// authorizations) for it within an hour ("Authorization Failures per
// Hostname per Account"). The edge counts them as the CA does, per name
// over a sliding hour, whichever path spent them (prefetch, on demand,
// renewal) and, through the certificate storage, whichever edge of the
// fleet; and it starts no issuance that could take a name to
// FailedValidationLimit-1, so one failure it could not count (an edge that
// died before recording it) still leaves the name below the CA's limit.
const (
	FailedValidationLimit  = 5
	failedValidationBudget = FailedValidationLimit - 1
	failedValidationWindow = time.Hour
)

// failedValidationsPrefix is where failed validations are recorded in the
// certificate storage, one key per failure under the name.
const failedValidationsPrefix = "scafo-edge/failed-validations/"

// maxValidationNames bounds the names whose counts are kept in memory (for
// metrics and the status page); names come from the routing document.
const maxValidationNames = 10000

// errValidationBudget refuses an issuance that could spend the name's last
// failed validations of the hour.
var errValidationBudget = errors.New("too many failed validations for this name in the last hour")

// ValidationCount is a name's failed validations in the last hour, as
// this edge last counted them, for the status page.
type ValidationCount struct {
	Name string
	// Failed counts the invalid authorizations of the last hour, every
	// edge's that recorded them in the shared storage.
	Failed int
	// HeldUntil is when enough of them leave the hour for an issuance to
	// start again; zero when none is held back.
	HeldUntil time.Time
}

// validations counts failed validations per name and holds back issuances
// that could go past the budget. Safe for concurrent use.
type validations struct {
	storage certmagic.Storage
	clock   clock.Clock

	// log and unread (set by the Manager before any issuance) hear of
	// count reads that failed.
	log    zerolog.Logger
	unread prometheus.Counter

	mu    sync.Mutex
	names map[string]*nameFailures
	// readErr is the cause of the last failed count read, "" while reads
	// work: each cause is logged once, and so is the recovery.
	readErr string
	// swept is when expired records were last swept from the storage.
	swept time.Time
}

// nameFailures is what an edge knows of one name's failed validations.
type nameFailures struct {
	// counted are the failures of the last hour as last counted: every
	// edge's, from storage, unless this edge's own are more.
	counted []time.Time
	// own are this edge's own: the count when storage cannot be read, or
	// their record could not be written.
	own []time.Time
	// held is until when no issuance of the name that may spend heldCost
	// or more starts.
	held     time.Time
	heldCost int
	// reserved are the failed validations this edge's issuances in flight
	// may still spend, by certificate name: certmagic locks an issuance per
	// certificate name, and "*.<base>" and "<base>" share one identifier,
	// so both could otherwise start on the same count and together pass
	// the budget.
	reserved map[string]int
}

// inFlight returns the failed validations nf's issuances in flight may
// still spend.
func (nf *nameFailures) inFlight() int {
	n := 0
	for _, c := range nf.reserved {
		n += c
	}
	return n
}

// idle reports whether nf holds nothing worth keeping at now.
func (nf *nameFailures) idle(now time.Time) bool {
	return len(within(nf.counted, now)) == 0 && len(within(nf.own, now)) == 0 && !now.Before(nf.held) && len(nf.reserved) == 0
}

func newValidations(storage certmagic.Storage, clk clock.Clock) *validations {
	return &validations{storage: storage, clock: clock.OrReal(clk), names: map[string]*nameFailures{}}
}

// failed records one failed validation of name, in memory and in storage.
func (v *validations) failed(ctx context.Context, name string) error {
	now := v.clock.Now()
	v.mu.Lock()
	nf := v.entryLocked(name, now)
	nf.own = append(nf.own, now)
	nf.counted = append(nf.counted, now)
	v.mu.Unlock()
	return stamps.Record(ctx, v.storage, failedValidationsPrefix+name, now, nil)
}

// admit returns nil when an issuance of the certificate cert, whose
// authorization's identifier is ident ("*.b" and "b" both "b"), that may
// spend cost failed validations keeps ident within the budget, counting the
// last hour's failures in storage (every edge's) and in memory (this
// edge's), and what this edge's other issuances of ident in flight may
// still spend; the cost is then reserved until release(cert). Otherwise it
// returns an error wrapping errValidationBudget, and when the failures
// alone are too many ident is held back until enough leave the hour.
//
// While ident is held back for a cost as large, admit answers from memory:
// failures only join the hour, never leave it before their time, so a hold
// counted from storage stands until it ends, and certmagic's retries during
// it cost no storage read.
func (v *validations) admit(ctx context.Context, ident, cert string, cost int) error {
	now := v.clock.Now()
	v.mu.Lock()
	nf := v.entryLocked(ident, now)
	// certmagic holds cert's issuance lock for a whole attempt, so a new
	// one means the last has ended, though it may have said nothing (an
	// error before the order, or our own refusal): its reservation goes.
	delete(nf.reserved, cert)
	if now.Before(nf.held) && cost >= nf.heldCost {
		n, held := len(nf.counted), nf.held
		v.mu.Unlock()
		return budgetError(n, cost, held)
	}
	sweep := !now.Before(v.swept.Add(failedValidationWindow))
	if sweep {
		v.swept = now
	}
	v.mu.Unlock()
	if sweep {
		v.sweep(ctx, now)
	}

	stored, err := stamps.Since(ctx, v.storage, failedValidationsPrefix+ident, now, failedValidationWindow, FailedValidationLimit*4)
	v.noteRead(ident, err)
	v.mu.Lock()
	defer v.mu.Unlock()
	nf = v.entryLocked(ident, now)
	nf.counted = nf.own
	if err == nil && len(stored) > len(nf.own) {
		// Other edges' failures are in storage; this edge's own are in
		// both, or only in memory when their record failed.
		nf.counted = stored
	}
	n := len(nf.counted)
	if n+cost > failedValidationBudget {
		// Free once the failures beyond budget-cost have left the hour (an
		// hour from now if the cost alone is over budget).
		nf.held, nf.heldCost = now.Add(failedValidationWindow), cost
		if over := min(n+cost-failedValidationBudget, n); over > 0 {
			nf.held = slices.SortedFunc(slices.Values(nf.counted), time.Time.Compare)[over-1].Add(failedValidationWindow)
		}
		return budgetError(n, cost, nf.held)
	}
	nf.held = time.Time{}
	if r := nf.inFlight(); n+r+cost > failedValidationBudget {
		// No hold: the other issuance ends within minutes, and what it
		// spends is counted at the next attempt.
		return fmt.Errorf("%w (%d of Let's Encrypt's %d, %d more may be spent by an issuance in flight for the same identifier, this one may spend %d)", errValidationBudget, n, FailedValidationLimit, r, cost)
	}
	if nf.reserved == nil {
		nf.reserved = map[string]int{}
	}
	nf.reserved[cert] = cost
	return nil
}

// budgetError is admit's refusal of an issuance that may spend cost with
// n failures counted, until when enough leave the hour.
func budgetError(n, cost int, until time.Time) error {
	return fmt.Errorf("%w (%d of Let's Encrypt's %d, this issuance may spend %d) until %s", errValidationBudget, n, FailedValidationLimit, cost, until.UTC().Format(time.RFC3339))
}

// release ends the reservation admit made for the certificate cert, when
// certmagic reports the issuance's outcome.
func (v *validations) release(cert string) {
	if v == nil {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if nf := v.names[strings.TrimPrefix(cert, "*.")]; nf != nil {
		delete(nf.reserved, cert)
	}
}

// noteRead logs a failed count read once per cause, and the first read
// that works again; every failed read is counted. Until then admit counts
// this edge's own failures only.
func (v *validations) noteRead(name string, err error) {
	cause := ""
	if err != nil {
		cause = rootCause(err).Error()
		if v.unread != nil {
			v.unread.Inc()
		}
	}
	v.mu.Lock()
	last := v.readErr
	v.readErr = cause
	v.mu.Unlock()
	switch {
	case cause == last:
	case cause == "":
		v.log.Info().Msg("failed validations read from the certificate storage again: issuances count every edge's")
	default:
		v.log.Warn().Err(err).Str("name", name).Msg("failed validations not readable from the certificate storage: issuances count this edge's own only, other edges' are unseen until it answers")
	}
}

// rootCause returns the innermost error of err's chain: what a failed
// read's errors share whatever key they name.
func rootCause(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}

// sweep deletes the records of failures that have left the hour, every
// name's: admit drops a name's own when it counts them, but a name never
// issued again would keep its records for good.
func (v *validations) sweep(ctx context.Context, now time.Time) {
	if _, err := stamps.Sweep(ctx, v.storage, failedValidationsPrefix, now, failedValidationWindow); err != nil {
		v.log.Warn().Err(err).Msg("old failed validations not swept from the certificate storage; tried again in an hour")
	}
}

// heldUntil returns until when name is held back, from memory only: cheap
// enough for every on-demand decision. A nil v (ModeOff) holds nothing.
func (v *validations) heldUntil(name string) (time.Time, bool) {
	if v == nil {
		return time.Time{}, false
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	nf := v.names[name]
	if nf == nil || !v.clock.Now().Before(nf.held) {
		return time.Time{}, false
	}
	return nf.held, true
}

// count returns name's failed validations in the last hour, as last counted.
func (v *validations) count(name string) int {
	v.mu.Lock()
	defer v.mu.Unlock()
	if nf := v.names[name]; nf != nil {
		return len(within(nf.counted, v.clock.Now()))
	}
	return 0
}

// counts lists the names with failed validations in the last hour, or
// held back, most failures first.
func (v *validations) counts() []ValidationCount {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := v.clock.Now()
	var out []ValidationCount
	for name, nf := range v.names {
		vc := ValidationCount{Name: name, Failed: len(within(nf.counted, now))}
		if now.Before(nf.held) {
			vc.HeldUntil = nf.held
		}
		if vc.Failed > 0 || !vc.HeldUntil.IsZero() {
			out = append(out, vc)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Failed != out[j].Failed {
			return out[i].Failed > out[j].Failed
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// entryLocked returns name's entry with its failures older than the hour
// dropped, making one; a full table first forgets names with nothing left.
// A table still full gets no new entry: the one returned is counted from
// storage for this call only (names come from the routing document, so
// only a huge one fills it).
func (v *validations) entryLocked(name string, now time.Time) *nameFailures {
	nf := v.names[name]
	if nf == nil {
		if len(v.names) >= maxValidationNames {
			for n, o := range v.names {
				if o.idle(now) {
					delete(v.names, n)
				}
			}
		}
		nf = &nameFailures{}
		if len(v.names) < maxValidationNames {
			v.names[name] = nf
		}
	}
	nf.counted, nf.own = within(nf.counted, now), within(nf.own, now)
	return nf
}

// within returns the times of ts less than an hour before now, in a new
// slice: ts may be a caller's.
func within(ts []time.Time, now time.Time) []time.Time {
	return slices.DeleteFunc(slices.Clone(ts), func(t time.Time) bool { return !now.Before(t.Add(failedValidationWindow)) })
}

// challengeFailedCore is a zapcore.Core on the ACME client's log that
// calls failed with the identifier of each "challenge failed" entry. That
// entry, which acmez writes once per authorization the CA set invalid, is
// the only place each one shows: acmez retries a failed challenge with
// the other type in a new order inside one issuance and returns only the
// last error. TestFailedValidationsStayUnderTheCALimit counts Pebble's
// invalid authorizations, so a dependency update that renames the entry
// fails it.
type challengeFailedCore struct {
	failed func(name string)
	fields []zapcore.Field
}

// challengeFailedMsg is acmez's message for a failed authorization
// (client.go, pollAuthorization).
const challengeFailedMsg = "challenge failed"

func (c *challengeFailedCore) Enabled(l zapcore.Level) bool { return l >= zapcore.ErrorLevel }

func (c *challengeFailedCore) With(fields []zapcore.Field) zapcore.Core {
	return &challengeFailedCore{failed: c.failed, fields: append(slices.Clone(c.fields), fields...)}
}

func (c *challengeFailedCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if e.Level >= zapcore.ErrorLevel && e.Message == challengeFailedMsg {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *challengeFailedCore) Write(_ zapcore.Entry, fields []zapcore.Field) error {
	for _, f := range slices.Concat(c.fields, fields) {
		if f.Key == "identifier" && f.Type == zapcore.StringType {
			c.failed(f.String)
			return nil
		}
	}
	return nil
}

func (c *challengeFailedCore) Sync() error { return nil }
