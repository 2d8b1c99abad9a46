package certs

import (
	"context"
	"errors"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"
)

// HeldWildcards serves the "*.<base>" certificates already in storage
// for wildcard route keys that no DNS-01 configuration (WildcardDomains)
// keeps: certificates imported from Traefik or Caddy (certs/migrate).
// Hosts under such a key are then served over HTTPS with it, as DNS-01
// would have served them.
//
// With a DNS provider (ModeACME, Options.DNSProvider), a held wildcard is
// adopted while the live document names its key: renewed by DNS-01 as a
// WildcardDomains base's is (the wildcard config, certmagic's
// maintenance), its bare base never ordered. Only a certificate held and
// valid is adopted, so nothing is ever ordered for a key the operator
// holds no certificate for (docs/design.md rule 8), and a key the
// document drops is released: no renewal after that. Without a provider
// nothing renews them: each is logged once with when it lapses, and
// Lapsing lists them for the status page.
//
// Safe for concurrent use.
type HeldWildcards struct {
	m *Manager

	// loading serialises Loads, which wait on storage; failed is theirs.
	// mu guards held and keys only, so that Lapsing and NotRenewed (the
	// status page) never wait for storage.
	loading sync.Mutex
	mu      sync.Mutex
	// held maps each wildcard loaded and not renewed (not adopted) to its
	// certificate's expiry; Load writes it under both locks.
	held map[string]time.Time
	// failed remembers keys whose load failed for another reason than
	// absence, so the failure is logged once.
	failed map[string]bool
	// keys are the wildcard keys of the last Want, looked for again every
	// heldRecheck until the Manager closes.
	keys []string
	// wake asks recheck to look for keys now.
	wake chan struct{}
}

const (
	// heldLoadTimeout bounds the storage reads of one Load.
	heldLoadTimeout = 10 * time.Second
	// heldRecheck is how often the last document's wildcard keys not held
	// yet are looked for again: a certificate imported into the fleet
	// store while the edge runs is served within it.
	heldRecheck = time.Minute
)

// NewHeldWildcards returns an empty set for m; nil when m obtains
// certificates from no ACME CA (ModeOff, ModeInternal), where no imported
// certificate is looked for.
func NewHeldWildcards(m *Manager) *HeldWildcards {
	if m.acme == nil {
		return nil
	}
	h := &HeldWildcards{m: m, held: map[string]time.Time{}, failed: map[string]bool{}, wake: make(chan struct{}, 1)}
	go h.recheck()
	return h
}

// Want makes keys, the wildcard keys of the routing document now served,
// the ones looked for: at once, off the caller's goroutine, then every
// heldRecheck. The keys are recorded before Want returns, so a document's
// keys never replace a later one's, whatever the goroutines' order.
func (h *HeldWildcards) Want(keys []string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.keys = keys
	h.mu.Unlock()
	select {
	case h.wake <- struct{}{}:
	default: // a look is due already; it reads the keys just set
	}
}

// recheck runs Load with the last keys Want recorded, when Want asks and
// every heldRecheck, until the Manager closes.
func (h *HeldWildcards) recheck() {
	t := time.NewTicker(heldRecheck)
	defer t.Stop()
	for {
		select {
		case <-h.m.ctx.Done():
			return
		case <-h.wake:
		case <-t.C:
		}
		h.mu.Lock()
		keys := h.keys
		h.mu.Unlock()
		h.Load(keys)
	}
}

// Load looks in storage for a certificate for each "*.<base>" in keys
// (other names are ignored) not kept by DNS-01 and not held yet, and
// serves what it finds (Want calls it with each routing document's
// wildcard keys). With a DNS provider it adopts each one held and valid
// (HeldWildcards) and releases those keys no longer names; a key dropped
// from the document keeps its certificate in memory until it expires,
// as any certificate would.
func (h *HeldWildcards) Load(keys []string) {
	if h == nil || h.m.ctx.Err() != nil {
		return // closed: a load now would only log the cancellation
	}
	ctx, cancel := context.WithTimeout(h.m.ctx, heldLoadTimeout)
	defer cancel()
	h.loading.Lock()
	defer h.loading.Unlock()
	named, adopted := map[string]bool{}, false
	for _, key := range keys {
		base, ok := strings.CutPrefix(key, "*.")
		if !ok || h.m.bases[base] {
			continue
		}
		named[base] = true
		if h.m.adoptedBase(base) {
			continue
		}
		if until, ok := h.held[key]; ok && time.Now().Before(until) {
			if h.m.renewsHeldBy != "" {
				// Held unrenewed while the document left it out.
				h.adopt(key, base, until)
				adopted = true
			}
			continue
		}
		// Adopted before it is cached: a handshake under it never goes
		// through on-demand maintenance, which would drop a certificate
		// due for renewal that no exact name approves.
		h.m.setAdopted(base, h.m.renewsHeldBy != "")
		cert, err := h.m.cfg.CacheManagedCertificate(ctx, key)
		if err == nil && !time.Now().Before(cert.Leaf.NotAfter) {
			err = errHeldExpired
		}
		if err != nil {
			h.m.setAdopted(base, false)
		}
		switch {
		case errors.Is(err, fs.ErrNotExist), errors.Is(err, errHeldExpired):
			continue
		case err != nil:
			if !h.failed[key] {
				h.failed[key] = true
				h.m.log.Warn().Err(err).Str("name", key).Msg("wildcard certificate in storage could not be loaded; hosts under it are served over HTTP only")
			}
			continue
		}
		delete(h.failed, key)
		until := cert.Leaf.NotAfter
		if h.m.renewsHeldBy != "" {
			h.adopt(key, base, until)
			adopted = true
			continue
		}
		h.mu.Lock()
		h.held[key] = until
		h.mu.Unlock()
		h.m.log.Warn().Str("name", key).Strs("names", cert.Names).Time("lapses_at", until).
			Msg("wildcard certificate from storage served without renewal: no DNS-01 provider keeps it (--dns-provider); hosts under it lose HTTPS when it lapses")
	}
	for _, base := range h.m.adoptedBases() {
		if !named[base] {
			h.release("*."+base, base)
		}
	}
	if adopted {
		// Renew now what is due rather than at certmagic's next
		// maintenance, up to 10 minutes on: an imported certificate may
		// be close to lapsing. Renewals run on the Manager's context.
		if err := h.m.cache.RenewManagedCertificates(h.m.ctx); err != nil {
			h.m.log.Warn().Err(err).Msg("renewing the wildcard certificates adopted")
		}
	}
}

// errHeldExpired marks a wildcard in storage that has expired: not held,
// so neither served nor renewed.
var errHeldExpired = errors.New("expired")

// adopt makes the held wildcard key renewed by DNS-01 from now on.
func (h *HeldWildcards) adopt(key, base string, until time.Time) {
	h.m.setAdopted(base, true)
	h.mu.Lock()
	delete(h.held, key)
	h.mu.Unlock()
	h.m.log.Info().Str("name", key).Time("not_after", until).
		Msg("wildcard certificate from storage renewed by DNS-01 (--dns-provider " + h.m.renewsHeldBy + ") while the routing document names it")
}

// release stops renewing the adopted key, which the document no longer
// names: its certificate is served until it lapses, as one not renewed.
func (h *HeldWildcards) release(key, base string) {
	h.m.setAdopted(base, false)
	var until time.Time
	for _, c := range h.m.cache.AllMatchingCertificates(key) {
		if c.Leaf != nil && slices.Contains(c.Names, key) && c.Leaf.NotAfter.After(until) {
			until = c.Leaf.NotAfter
		}
	}
	if !until.IsZero() {
		h.mu.Lock()
		h.held[key] = until
		h.mu.Unlock()
	}
	h.m.log.Info().Str("name", key).Msg("wildcard route key left the routing document: its certificate is no longer renewed")
}

// adoptedBase reports whether "*.<base>" is a held wildcard renewed by
// DNS-01. Handshakes ask: one atomic load, no lock.
func (m *Manager) adoptedBase(base string) bool {
	a := m.adopted.Load()
	return a != nil && (*a)[base]
}

// adoptedBases lists the bases adopted.
func (m *Manager) adoptedBases() []string {
	a := m.adopted.Load()
	if a == nil {
		return nil
	}
	out := make([]string, 0, len(*a))
	for b := range *a {
		out = append(out, b)
	}
	return out
}

// setAdopted adds base to the adopted bases or removes it. Its callers
// are serialised (HeldWildcards.loading).
func (m *Manager) setAdopted(base string, on bool) {
	if m.adoptedBase(base) == on {
		return
	}
	next := map[string]bool{}
	if a := m.adopted.Load(); a != nil {
		maps.Copy(next, *a)
	}
	if on {
		next[base] = true
	} else {
		delete(next, base)
	}
	m.adopted.Store(&next)
}

// Lapsing lists the wildcard certificates served that nothing renews,
// soonest expiry first: none adopted.
func (h *HeldWildcards) Lapsing() []CertInfo {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]CertInfo, 0, len(h.held))
	for key, until := range h.held {
		out = append(out, CertInfo{Names: []string{key}, NotAfter: until})
	}
	slices.SortFunc(out, func(a, b CertInfo) int { return a.NotAfter.Compare(b.NotAfter) })
	return out
}

// NotRenewed reports whether the certificate for names is a held
// wildcard nothing renews (not adopted).
func (h *HeldWildcards) NotRenewed(names []string) bool {
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, n := range names {
		if _, ok := h.held[n]; ok {
			return true
		}
	}
	return false
}
