package certs

import (
	"context"
	"fmt"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/scafo/scafo-edge/certs/prefetch"
	"github.com/scafo/scafo-edge/internal/hostname"
)

// startPrefetch starts the prefetch queue on the Manager's decision rules,
// storage and on-demand config. The queue logs through the Manager's
// logger, and registers on reg unless opts names a Registerer.
func (m *Manager) startPrefetch(opts prefetch.Options, reg prometheus.Registerer) error {
	opts.Log = m.log
	// One clock for both: the queue waits out the Manager's back-off
	// deadlines, which are read on the Manager's clock.
	opts.Clock = m.backoff.clock
	if opts.Registerer == nil {
		opts.Registerer = reg
	}
	q, err := prefetch.New(prefetch.Certs{
		Certifiable: m.prefetchable,
		HeldBack:    m.heldBack,
		Held:        m.holds,
		Obtain:      m.obtain,
		Storage:     m.cfg.Storage,
	}, opts)
	if err != nil {
		return fmt.Errorf("certificate prefetch: %w", err)
	}
	m.prefetch = q
	return nil
}

// Prefetch hands the live routing document's exact names (route hosts and
// API hosts) to the prefetch queue, which obtains certificates for the
// names new since the previous call; see package certs/prefetch. Call it
// on every document change. A no-op unless Options.Prefetch is set.
func (m *Manager) Prefetch(names []string) {
	if m.prefetch == nil {
		return
	}
	norm := make([]string, 0, len(names))
	for _, n := range names {
		if n, ok := hostname.Normalise(n); ok {
			norm = append(norm, n)
		}
	}
	m.prefetch.Update(norm)
}

// PrefetchStatus lists the names waiting for a prefetched certificate,
// newest first, with why they wait (budget, unreachable, ...); nil when
// prefetch is off.
func (m *Manager) PrefetchStatus() []prefetch.Entry {
	if m.prefetch == nil {
		return nil
	}
	return m.prefetch.Status()
}

// prefetchable reports whether name may be prefetched: on-demand issuance
// would approve it (the same rules, decision.go), but for a back-off after
// a failed issuance, which the queue waits out (heldBack) instead of
// dropping a name still in the document; and no wildcard base covers it
// (the wildcard certificate, managed from start, serves it).
func (m *Manager) prefetchable(name string) bool {
	reason, err := m.refusal(name)
	return (err == nil || reason == "backoff") && !m.underBase(name)
}

// heldBack returns until when on-demand issuance holds name back after a
// failed issuance, or the zero time.
func (m *Manager) heldBack(name string) time.Time {
	until, _ := m.backoff.active(name)
	if v, ok := m.validations.heldUntil(name); ok && v.After(until) {
		until = v
	}
	return until
}

// holds reports whether a certificate covering name is in memory or in
// storage. One in storage is left there: the first handshake loads it, as
// it would without prefetch, so an edge starting with a large document
// does not load every certificate at once.
func (m *Manager) holds(ctx context.Context, name string) bool {
	return len(m.cache.AllMatchingCertificates(name)) > 0 ||
		m.cfg.Storage.Exists(ctx, certmagic.StorageKeys.SiteCert(m.acme.IssuerKey(), name))
}

// obtain places the order for name through the prefetch config (the
// on-demand config's events, slots, back-off and failed-validation budget
// apply), without certmagic's retries, and loads the result into memory.
//
// The prefetch config tries HTTP-01 only. The reachability check has just
// shown that port 80 at every address the name publishes reaches the
// fleet, so a validation failing now almost always fails for a reason the
// other challenge type shares (the CA's DNS view differs from the check's:
// propagation, a resolver's cache; a firewall in front of the validator's
// vantage points), and TLS-ALPN-01 after it
// would cost a second order and a second of the five failed validations
// an hour for one attempt. A visitor's on-demand issuance still tries both.
func (m *Manager) obtain(ctx context.Context, name string) error {
	ctx = context.WithValue(ctx, challengeTypesKey{}, 1)
	if err := m.pcfg.ObtainCertSync(ctx, name); err != nil {
		return err
	}
	if _, err := m.pcfg.CacheManagedCertificate(ctx, name); err != nil {
		return fmt.Errorf("load obtained certificate: %w", err)
	}
	return nil
}
