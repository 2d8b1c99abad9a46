package admin

import (
	"crypto/subtle"
	"fmt"
	"net/http"
	"net/netip"
	"strings"

	"github.com/scafo/scafo-edge/internal/forwarded"
)

// Who may read what on the admin listener, in three tiers:
//
//   - /healthz and /readyz: anyone (health checks, load balancers).
//   - /metrics: a client on loopback, in Server.MetricsFrom (by default the
//     private networks, --admin-allow), or a trusted proxy asking for
//     itself; anyone else with the ingress token as a bearer. Metrics name
//     every application, node and certificate, so a box with a public
//     address does not hand them to the internet.
//   - the status page, status.json and pprof: a client on loopback, or the
//     token (docs/design.md rule 10). No allow list opens them, not even
//     "any": they reveal upstream addresses, which a network rule made for
//     Prometheus should not widen to.
//
// The client is the TCP peer; when the peer is a trusted proxy, it is the
// address the proxy names in X-Forwarded-For after the last trusted proxy, as
// the edge's own listeners read it (admission, backhaul). A CDN listed in
// --trusted-proxies thus cannot relay the internet to /metrics: what it
// relays is judged by the client it names.

// privateNetworks are what "private" stands for in an allow list: RFC 1918,
// the shared address space of carrier-grade NAT (RFC 6598, which overlay
// networks such as Tailscale use), IPv6 unique local addresses (RFC 4193)
// and the link-local ranges of both families, none of which the internet
// routes to this box.
var privateNetworks = []netip.Prefix{
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("fc00::/7"),
	netip.MustParsePrefix("fe80::/10"),
}

// anyNetwork is what "any" stands for: every address of both families.
var anyNetwork = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}

// ParseAllow reads an allow list of the admin listener's /metrics (the
// --admin-allow flag): comma-separated CIDRs or bare addresses, and the
// words "private" (the private networks: RFC 1918, 100.64.0.0/10, fc00::/7,
// 169.254.0.0/16, fe80::/10), "any" (every address: /metrics open to all, as
// Prometheus exporters usually are) and "loopback" (nothing beyond loopback,
// which is always allowed). An empty list allows loopback only.
func ParseAllow(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		switch f {
		case "", "loopback":
			continue
		case "private":
			out = append(out, privateNetworks...)
			continue
		case "any":
			out = append(out, anyNetwork...)
			continue
		}
		if strings.Contains(f, "%") {
			return nil, fmt.Errorf("%q: a zone names an interface, not a network; give the prefix (fe80::/10)", f)
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			a, aerr := netip.ParseAddr(f)
			if aerr != nil {
				return nil, fmt.Errorf("%q: want a CIDR, an address, private, any or loopback", f)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		// An IPv4-mapped prefix would never match: peers are unmapped.
		if p.Addr().Is4In6() {
			return nil, fmt.Errorf("%q: an IPv4-mapped prefix; give the IPv4 one", f)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// client returns the address r is judged by and its TCP peer, both
// unmapped and without a zone: the peer itself, or, when the peer is a
// trusted proxy, the rightmost address of X-Forwarded-For that is not a
// trusted proxy's (any left of it could be forged); when every address
// named is a trusted proxy's, the leftmost. A trusted proxy that names
// no client asks for itself. ok is false when the peer or a named address
// cannot be parsed: such a request is judged by its token alone.
func (a *Server) client(r *http.Request) (client, peer netip.Addr, ok bool) {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return client, peer, false
	}
	peer = ap.Addr().Unmap().WithZone("")
	client = peer
	if !forwarded.Contains(a.TrustedProxies, peer) {
		return client, peer, true
	}
	named, _, err := forwarded.Client(r.Header.Values("X-Forwarded-For"), a.TrustedProxies)
	if err != nil {
		return client, peer, false
	}
	if named.IsValid() {
		client = named
	}
	return client, peer, true
}

// bearer reports whether r carries the ingress token as a bearer token. No
// request does while the token is empty.
func (a *Server) bearer(r *http.Request) bool {
	if a.Token == "" {
		return false
	}
	// The scheme is case-insensitive (RFC 9110 section 11.1).
	scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	return ok && strings.EqualFold(scheme, "Bearer") && subtle.ConstantTimeCompare([]byte(got), []byte(a.Token)) == 1
}

// privileged reports whether r may see upstream addresses (docs/design.md
// rule 10): it comes from loopback, and no trusted proxy relays it for a
// client elsewhere, or it carries the ingress token.
func (a *Server) privileged(r *http.Request) bool {
	if client, peer, ok := a.client(r); ok && peer.IsLoopback() && client.IsLoopback() {
		return true
	}
	return a.bearer(r)
}

// mayScrape reports whether r may read /metrics: its client is on
// loopback, in MetricsFrom, or a trusted proxy asking for itself, or it
// carries the ingress token.
func (a *Server) mayScrape(r *http.Request) bool {
	if client, _, ok := a.client(r); ok && a.MayScrapeFrom(client) {
		return true
	}
	return a.bearer(r)
}

// MayScrapeFrom reports whether addr (unmapped, without a zone) may read
// /metrics without the token: it is on loopback, in MetricsFrom, or a
// trusted proxy (which, as a TCP peer, may relay for others: each request
// it relays is judged by the client it names). The admin listener's
// admission gives the connections of such peers the larger share of its
// pool, and the others, which may only ask /healthz and /readyz without
// the token, a small one.
func (a *Server) MayScrapeFrom(addr netip.Addr) bool {
	return addr.IsLoopback() || forwarded.Contains(a.MetricsFrom, addr) || forwarded.Contains(a.TrustedProxies, addr)
}

// scrapers serves h only to a request mayScrape allows; anyone else is
// answered 401 with a Bearer challenge (RFC 6750), which Prometheus meets
// with the authorization of its scrape config.
func (a *Server) scrapers(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.mayScrape(r) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.Header().Set("WWW-Authenticate", `Bearer realm="scafo-edge admin"`)
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte("scafo-edge: unauthorized: /metrics answers loopback and the networks of --admin-allow; from elsewhere send Authorization: Bearer <ingress token>\n"))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// private serves h only to a privileged request (loopback, or the ingress
// token): the status surfaces and pprof reveal upstream addresses and
// internals (docs/design.md rule 10).
func (a *Server) private(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.privileged(r) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("X-Content-Type-Options", "nosniff")
			w.WriteHeader(http.StatusForbidden)
			w.Write([]byte("scafo-edge: forbidden: this page reveals upstream addresses; ask from loopback or send Authorization: Bearer <ingress token>\n"))
			return
		}
		h.ServeHTTP(w, r)
	})
}
