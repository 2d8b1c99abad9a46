package certs

import (
	"context"
	"errors"
	"io/fs"
	"slices"
	"strings"
	"sync"
	"time"
)

// HeldWildcards serves the "*.<base>" certificates already in storage
// for wildcard route keys that no DNS-01 configuration (WildcardDomains)
// keeps: certificates imported from Traefik or Caddy (certs/migrate).
// Hosts under such a key are then served over HTTPS with it, as DNS-01
// would have served them, and nothing is ever ordered for them
// (docs/design.md rule 8). Nothing renews them either: each is logged
// once with when it lapses, and Lapsing lists them for the status page.
//
// Safe for concurrent use.
type HeldWildcards struct {
	m *Manager

	// loading serialises Loads, which wait on storage; failed is theirs.
	// mu guards held and keys only, so that Lapsing and NotRenewed (the
	// status page) never wait for storage.
	loading sync.Mutex
	mu      sync.Mutex
	// held maps each wildcard loaded to its certificate's expiry; Load
	// writes it under both locks.
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
// wildcard keys); a key dropped from the document keeps its certificate
// in memory until it expires, as any certificate would.
func (h *HeldWildcards) Load(keys []string) {
	if h == nil || h.m.ctx.Err() != nil {
		return // closed: a load now would only log the cancellation
	}
	ctx, cancel := context.WithTimeout(h.m.ctx, heldLoadTimeout)
	defer cancel()
	h.loading.Lock()
	defer h.loading.Unlock()
	for _, key := range keys {
		base, ok := strings.CutPrefix(key, "*.")
		if !ok || h.m.bases[base] {
			continue
		}
		if until, ok := h.held[key]; ok && time.Now().Before(until) {
			continue
		}
		cert, err := h.m.cfg.CacheManagedCertificate(ctx, key)
		switch {
		case errors.Is(err, fs.ErrNotExist):
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
		if !time.Now().Before(until) {
			continue
		}
		h.mu.Lock()
		h.held[key] = until
		h.mu.Unlock()
		h.m.log.Warn().Str("name", key).Strs("names", cert.Names).Time("lapses_at", until).
			Msg("wildcard certificate from storage served without renewal: no DNS-01 provider keeps it (--dns-provider, --wildcard-domains " + base + "); hosts under it lose HTTPS when it lapses")
	}
}

// Lapsing lists the wildcard certificates served that nothing renews,
// soonest expiry first.
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
// wildcard nothing renews.
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
