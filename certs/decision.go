package certs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/scafo/scafo-edge/internal/backoff"
	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/hostname"
)

// Refusal causes, returned to certmagic by the decision function.
var (
	errWildcardKey = errors.New("a *.<base> name never approves issuance")
	errNotNamed    = errors.New("name is not in the routing document")
	errBackingOff  = errors.New("backing off after a failed issuance")
)

// decide is certmagic's on-demand decision function. certmagic calls it
// before loading a certificate from storage, before obtaining one and before
// renewing one on demand; a refusal costs no storage access and no ACME
// traffic.
func (m *Manager) decide(_ context.Context, name string) error {
	if reason, err := m.refusal(name); err != nil {
		m.metrics.refusals.WithLabelValues(reason).Inc()
		return err
	}
	return nil
}

// refusal returns why a certificate may not be requested for name now,
// and the metric's reason label; nil when it may. It is the rule for
// on-demand issuance and for prefetching alike. name is spelled as
// certmagic or the caller has it; a name hostname.Normalise finds malformed
// is one no document names.
func (m *Manager) refusal(name string) (string, error) {
	if strings.HasPrefix(name, "*.") {
		// docs/design.md rule 8: the wildcard key exists for routing only. It
		// is told apart before normalising, which refuses any "*".
		return "wildcard", errWildcardKey
	}
	name, ok := hostname.Normalise(name)
	if !ok || m.allowed == nil || !m.allowed(name) {
		return "not_named", errNotNamed
	}
	if until, ok := m.backoff.active(name); ok {
		return "backoff", fmt.Errorf("%w until %s", errBackingOff, until.UTC().Format(time.RFC3339))
	}
	if until, ok := m.validations.heldUntil(name); ok {
		return "validations", fmt.Errorf("%w until %s", errValidationBudget, until.UTC().Format(time.RFC3339))
	}
	return "", nil
}

// challengeTypesKey marks, in an issuance's context, how many challenge
// types its issuer may try: one failed validation each.
type challengeTypesKey struct{}

// validationCost returns how many failed validations an issuance of name
// may spend at most: one per challenge type its issuer tries, as acmez
// tries the next type in a new order after a failed one. Prefetch marks
// its own (HTTP-01 only); a wildcard base is DNS-01 only; the on-demand
// config tries HTTP-01 and TLS-ALPN-01.
func (m *Manager) validationCost(ctx context.Context, name string) int {
	if n, ok := ctx.Value(challengeTypesKey{}).(int); ok {
		return n
	}
	if m.isBaseName(name) {
		return 1
	}
	return 2
}

// validationFailed is called with the name of each authorization the CA
// set invalid, whatever started the issuance (challengeFailedCore).
func (m *Manager) validationFailed(name string) {
	m.metrics.failedValidations.Inc()
	// The ACME client waits on this call; a storage that does not answer
	// must not stall it for long.
	ctx, cancel := context.WithTimeout(m.ctx, 10*time.Second)
	defer cancel()
	if err := m.validations.failed(ctx, name); err != nil {
		m.log.Warn().Err(err).Str("name", name).Msg("failed validation not recorded in the certificate storage; counted on this edge only")
	}
	m.log.Warn().Str("name", name).Int("last_hour", m.validations.count(name)).Int("ca_limit", FailedValidationLimit).Msg("validation failed at the CA")
}

// onEvent follows certmagic's issuance events: it bounds issuances in
// flight, counts outcomes, starts a name's back-off after a failure and
// remembers which certificates are cached.
func (m *Manager) onEvent(ctx context.Context, event string, data map[string]any) error {
	name, _ := data["identifier"].(string)
	renewal, _ := data["renewal"].(bool)
	kind := "new"
	if renewal {
		kind = "renewal"
	}
	switch event {
	case "cert_obtaining":
		if m.acme != nil {
			vname := strings.TrimPrefix(name, "*.") // the authorization's identifier
			if err := m.validations.admit(ctx, vname, m.validationCost(ctx, name)); err != nil {
				m.metrics.refusals.WithLabelValues("validations").Inc()
				m.log.Warn().Err(err).Str("name", name).Bool("renewal", renewal).Msg("certificate issuance not started: the name is close to the CA's limit of failed validations")
				return certmagic.ErrNoRetry{Err: err}
			}
		}
		select {
		case m.slots <- struct{}{}:
		case <-ctx.Done():
			return certmagic.ErrNoRetry{Err: fmt.Errorf("wait for an issuance slot: %w", ctx.Err())}
		}
		m.mu.Lock()
		m.held[name]++
		m.mu.Unlock()
		m.metrics.inFlight.Inc()
	case "cert_obtained":
		m.release(name)
		m.metrics.issuances.WithLabelValues("obtained", kind).Inc()
		if m.backoff.clear(name) {
			m.log.Info().Str("name", name).Msg("certificate obtained after earlier failures; back-off cleared")
		}
	case "cert_failed":
		m.release(name)
		m.metrics.issuances.WithLabelValues("failed", kind).Inc()
		// Renewals follow certmagic's own schedule, configured names are
		// retried by certmagic, and a failure caused by our own stop or by
		// the client going away is no reason to hold the name back.
		if renewal || m.isBaseName(name) || ctx.Err() != nil {
			return nil
		}
		d := m.backoff.fail(name)
		err, _ := data["error"].(error)
		m.log.Warn().Err(err).Str("name", name).Dur("backoff", d).Msg("certificate issuance failed; no new attempt for this name until the back-off ends")
		// Handshakes waiting on this name would otherwise sit in
		// certmagic's retry wait (a minute, then more) holding the lock.
		m.cancelPending(name)
	case "cached_managed_cert":
		sans, _ := data["sans"].([]string)
		if len(sans) > 0 {
			m.mu.Lock()
			m.known[strings.Join(sans, ",")] = slices.Clone(sans)
			m.mu.Unlock()
		}
	}
	return nil
}

// release gives back the issuance slot name took, if it took one.
func (m *Manager) release(name string) {
	m.mu.Lock()
	took := m.held[name] > 0
	if took {
		m.held[name]--
		if m.held[name] == 0 {
			delete(m.held, name)
		}
	}
	m.mu.Unlock()
	if took {
		<-m.slots
		m.metrics.inFlight.Dec()
	}
}

// maxBackoffNames bounds the back-off table; names come from the routing
// document, so this is only reached by a very large or churning document.
const maxBackoffNames = 10000

// issuanceBackoff is the per-name back-off after failed issuances.
type issuanceBackoff struct {
	base, max time.Duration
	clock     clock.Clock

	mu    sync.Mutex
	names map[string]*backoffState
}

type backoffState struct {
	failures int
	until    time.Time
}

func newIssuanceBackoff(base, max time.Duration, clk clock.Clock) *issuanceBackoff {
	if max < base {
		max = base
	}
	return &issuanceBackoff{base: base, max: max, clock: clock.OrReal(clk), names: map[string]*backoffState{}}
}

// fail records a failure for name and returns how long it is held back:
// base, doubled for each failure in a row, at most max.
func (b *issuanceBackoff) fail(name string) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.clock.Now()
	st := b.names[name]
	if st == nil {
		if len(b.names) >= maxBackoffNames {
			b.pruneLocked(now)
		}
		st = &backoffState{}
		b.names[name] = st
	} else if now.Sub(st.until) > b.max {
		// Quiet for longer than the longest back-off: start over.
		st.failures = 0
	}
	st.failures++
	d := backoff.Doubling(b.base, b.max, st.failures)
	st.until = now.Add(d)
	return d
}

// active reports whether name is held back, and until when.
func (b *issuanceBackoff) active(name string) (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := b.names[name]
	if st == nil || !b.clock.Now().Before(st.until) {
		return time.Time{}, false
	}
	return st.until, true
}

// clear forgets name's failures and reports whether there were any.
func (b *issuanceBackoff) clear(name string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	_, had := b.names[name]
	delete(b.names, name)
	return had
}

// count returns how many names are held back now.
func (b *issuanceBackoff) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	now, n := b.clock.Now(), 0
	for _, st := range b.names {
		if now.Before(st.until) {
			n++
		}
	}
	return n
}

func (b *issuanceBackoff) pruneLocked(now time.Time) {
	for name, st := range b.names {
		if !now.Before(st.until) {
			delete(b.names, name)
		}
	}
}
