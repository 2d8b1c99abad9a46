package certs

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/caddyserver/certmagic"

	"github.com/scafo/scafo-edge/certs/prefetch"
	"github.com/scafo/scafo-edge/internal/hostname"
)

// HTTPHandler wraps the plain-HTTP listener's handler. It answers ACME
// HTTP-01 challenges for names being issued and prefetch reachability
// checks (both before any routing), redirects with 308 to HTTPS every host
// that has or may get a certificate, and passes everything else to next:
// a host that can have no certificate, such as one under a wildcard route
// without a covering certificate held, is proxied over HTTP. In ModeOff it
// returns next unchanged.
func (m *Manager) HTTPHandler(next http.Handler) http.Handler {
	if m.mode == ModeOff {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A malformed Host is "": passed on, for the edge to answer 400.
		host, _ := hostname.Normalise(r.Host)
		// HandleHTTPChallenge answers only a token of a challenge in
		// progress: from memory, or else from storage (with the fleet
		// store, a request to the node).
		if m.acme != nil && certmagic.LooksLikeHTTPChallenge(r) && m.mayHoldChallenge(host, r.Host) && m.acme.HandleHTTPChallenge(w, r) {
			return
		}
		// A prefetch reachability check from any edge of the fleet: its
		// token is in the (shared) storage. Prefetch checks only names its
		// document names, so no other host's check costs a storage read.
		// Unlike HTTP-01 (mayHoldChallenge), a check that reaches an edge
		// whose document does not name the host yet is not answered: the
		// edge's 404 "no route" tells the checking edge to look again about
		// one poll interval later, by when every edge has the document, at
		// no cost at the CA; so a flood of checks for
		// made-up hosts costs no read at all, and cannot crowd out the
		// HTTP-01 tokens' reads.
		if prefetch.LooksLikeReach(r) && m.named(host) && prefetch.ServeReach(w, r, m.cfg.Storage, host) {
			return
		}
		if host != "" && m.httpsAvailable(host) {
			http.Redirect(w, r, m.httpsURL(host, r), http.StatusPermanentRedirect)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// named reports whether the live document names host exactly: the only
// hosts that may be issued a certificate on demand or prefetched, and so
// the only ones an edge of the fleet may have stored a challenge for.
func (m *Manager) named(host string) bool {
	return host != "" && m.allowed != nil && m.allowed(host)
}

// Storage reads for HTTP-01 tokens of hosts the live document does not
// name: at most unnamedChallengeBurst at once, unnamedChallengeRate a
// second after that, whatever the flood. Such a token is real while a new
// name propagates: edges fetch the document on their own, and the CA's
// validator may reach an edge that does not name the name yet while
// another edge, which does, has stored its token. Refusing it would fail
// the validation (one of the CA's five an hour for the name; prefetch's
// HTTP-01-only order fails outright). Let's Encrypt asks from a handful of
// vantage points per challenge, within seconds; the burst covers that, and
// a flood for made-up hosts costs at most the rate in reads at the node.
// (A flood at the moment a new name propagates can crowd its validation
// out; the name's own edges still answer it, and a miss costs what
// refusing every such token costs always.)
const (
	unnamedChallengeRate  = 2
	unnamedChallengeBurst = 10
)

// mayHoldChallenge reports whether an HTTP-01 request for host may find a
// token and is worth a look: one this process holds in memory (certmagic's,
// whatever the name), one in storage for a name the document names, or,
// within unnamedReads's rate, one in storage for another host that an edge
// with a newer document stored. certmagic's solver looks a token up in
// storage by the request's Host alone, so without the rate a flood of
// made-up hosts would cost a storage read each (with the fleet store, a
// request to the node). rawHost is the Host as sent, as certmagic keys its
// memory by it.
func (m *Manager) mayHoldChallenge(host, rawHost string) bool {
	if m.named(host) {
		return true
	}
	if _, ok := certmagic.GetACMEChallenge(rawHost); ok {
		return true
	}
	return host != "" && m.unnamedReads.AllowN(m.backoff.clock.Now(), 1)
}

// httpsAvailable reports whether host has a certificate in memory or may be
// issued one on demand. host is normalised, so never a "*.<base>" key.
func (m *Manager) httpsAvailable(host string) bool {
	if m.named(host) {
		return true
	}
	return len(m.cache.AllMatchingCertificates(host)) > 0
}

func (m *Manager) httpsURL(host string, r *http.Request) string {
	var b strings.Builder
	b.WriteString("https://")
	b.WriteString(host)
	if m.httpsPort != 443 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(m.httpsPort))
	}
	// RequestURI is the request-target as the client sent it, so the
	// redirect keeps the path's exact bytes and the query.
	uri := r.RequestURI
	if uri == "" || !strings.HasPrefix(uri, "/") {
		uri = r.URL.RequestURI()
	}
	b.WriteString(uri)
	return b.String()
}
