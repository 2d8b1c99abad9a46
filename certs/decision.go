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
	// A name with a certificate still valid is never refused for the
	// budget here: certmagic asks before loading a certificate from storage
	// (after a failed renewal dropped it from the cache) and before renewing
	// one, and a refusal would stop serving it. Its renewals are held back
	// at cert_obtaining instead (onEvent).
	if until, ok := m.validations.heldUntil(name); ok && !m.hasValidCert(name) {
		return "validations", fmt.Errorf("%w until %s", errValidationBudget, until.UTC().Format(time.RFC3339))
	}
	return "", nil
}

// maxValidCertNames bounds the names whose certificates' expiry is kept.
const maxValidCertNames = 10000

// noteCached remembers until when the certificate certmagic just cached
// for sans is valid, for hasValidCert. certmagic may drop it from its
// cache later (an on-demand certificate whose renewal failed) while it
// stays in storage.
func (m *Manager) noteCached(sans []string) {
	var notAfter time.Time
	for _, c := range m.cache.AllMatchingCertificates(sans[0]) {
		if slices.Equal(c.Names, sans) && c.Leaf != nil && c.Leaf.NotAfter.After(notAfter) {
			notAfter = c.Leaf.NotAfter
		}
	}
	if notAfter.IsZero() {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.validCerts) >= maxValidCertNames {
		// Certificates' lives are wall-clock time, as certmagic reads them.
		now := time.Now()
		for n, t := range m.validCerts {
			if !now.Before(t) {
				delete(m.validCerts, n)
			}
		}
	}
	for _, n := range sans {
		if len(m.validCerts) < maxValidCertNames && notAfter.After(m.validCerts[n]) {
			m.validCerts[n] = notAfter
		}
	}
}

// hasValidCert reports whether this edge has held a certificate for name
// that has not expired, in memory only: cheap enough for every decision.
func (m *Manager) hasValidCert(name string) bool {
	m.mu.Lock()
	notAfter, ok := m.validCerts[name]
	m.mu.Unlock()
	return ok && time.Now().Before(notAfter)
}

// handshakeKey marks the context of an issuance a TLS handshake waits on.
type handshakeKey struct{}

// budgetRefusal is what cert_obtaining returns to certmagic for an
// issuance the failed-validation budget holds back. A handshake waits on
// its issuance: ErrNoRetry ends it now rather than at certmagic's retry a
// minute later. Anything else (the wildcard certificates, which certmagic
// obtains once through ManageAsync; renewals; a handshake's renewal in the
// background) gets a plain error, which certmagic's retry loop retries on
// its schedule (1, 2, 2, 5, 10 minutes...) rather than give up on for
// good; its retries while the name is held cost no storage read
// (validations.admit), and a single attempt (prefetch, maintenance)
// treats both alike.
func budgetRefusal(ctx context.Context, err error) error {
	if ctx.Value(handshakeKey{}) != nil {
		return certmagic.ErrNoRetry{Err: err}
	}
	return err
}

// challengeTypesKey marks, in an issuance's context, how many challenge
// types its issuer may try: one failed validation each.
type challengeTypesKey struct{}

// validationCost returns how many failed validations an issuance may
// spend at most: one per challenge type its issuer tries, as acmez
// tries the next type in a new order after a failed one. Prefetch marks
// its own (HTTP-01 only); the on-demand config tries HTTP-01 and
// TLS-ALPN-01.
//
// A wildcard base's two certificates, "*.<base>" and "<base>", are DNS-01
// only, one each, but share one identifier, and certmagic's issuance lock
// is per certificate: another edge of the fleet may be issuing the other
// one at the same moment, past this edge's reservations (validations.
// admit), which are its own. Each is charged the other's too, so that two
// started together on two edges stay within the budget; storage
// coordination per identifier would cost every issuance a write, a list
// and a delete at the node for the one identifier shape that needs it.
func (m *Manager) validationCost(ctx context.Context) int {
	if n, ok := ctx.Value(challengeTypesKey{}).(int); ok {
		return n
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
			if err := m.validations.admit(ctx, vname, name, m.validationCost(ctx)); err != nil {
				m.metrics.refusals.WithLabelValues("validations").Inc()
				m.log.Warn().Err(err).Str("name", name).Bool("renewal", renewal).Msg("certificate issuance not started: the name is close to the CA's limit of failed validations")
				return budgetRefusal(ctx, err)
			}
		}
		select {
		case m.slots <- struct{}{}:
		case <-ctx.Done():
			m.validations.release(name)
			return certmagic.ErrNoRetry{Err: fmt.Errorf("wait for an issuance slot: %w", ctx.Err())}
		}
		m.mu.Lock()
		m.held[name]++
		m.mu.Unlock()
		m.metrics.inFlight.Inc()
	case "cert_obtained":
		m.release(name)
		m.validations.release(name)
		m.metrics.issuances.WithLabelValues("obtained", kind).Inc()
		if m.backoff.clear(name) {
			m.log.Info().Str("name", name).Msg("certificate obtained after earlier failures; back-off cleared")
		}
	case "cert_failed":
		m.release(name)
		m.validations.release(name)
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
			m.noteCached(sans)
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
