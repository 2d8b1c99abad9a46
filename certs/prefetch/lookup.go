package prefetch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// addresses returns the addresses a CA will validate name at, as Let's
// Encrypt's resolver finds them (Boulder's bdns.LookupHost): A and AAAA
// are asked for apart; from each answer only public addresses count (a
// private or reserved one beside them is dropped, never dialled, and does
// not hold the name back); a family fails when its query fails (SERVFAIL,
// a timeout) or leaves no public address; and the look-up fails only when
// both families fail. A name whose AAAA query fails while its A records
// answer is validated over IPv4 alone, so it is checked over IPv4 alone;
// an AAAA record that answers is dialled like any other address. At most
// maxAddrs/2 addresses a family are returned; the error wraps
// ErrUnreachable.
func (p *prober) addresses(ctx context.Context, name string) ([]netip.Addr, error) {
	// Bounded like the requests that follow: a resolver that does not
	// answer must not hold the check (and its prefetch slot) for good.
	lctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	var v4, v6 []netip.Addr
	var err4, err6 error
	var wg sync.WaitGroup
	wg.Go(func() { v4, err4 = p.family(lctx, "ip4", name) })
	wg.Go(func() { v6, err6 = p.family(lctx, "ip6", name) })
	wg.Wait()
	if err4 != nil && err6 != nil {
		return nil, fmt.Errorf("%w: look up %s: A: %w; AAAA: %w", ErrUnreachable, name, err4, err6)
	}
	return append(v6, v4...), nil
}

// errNoRecords is a family's failure when its answer holds no address of
// the family.
var errNoRecords = errors.New("no records")

// family looks up name's addresses of one family ("ip4" or "ip6") and
// returns the public ones, distinct, at most maxAddrs/2, or why there are
// none.
func (p *prober) family(ctx context.Context, network, name string) ([]netip.Addr, error) {
	found, err := p.lookup(ctx, network, name)
	if err != nil {
		return nil, err
	}
	var addrs []netip.Addr
	var private []netip.Addr
	for _, a := range found {
		// An IPv4-mapped AAAA record is not an address a CA dials
		// (Boulder counts ::ffff:0:0/96 as reserved); a look-up that
		// ignores network may hand back the other family too.
		if network == "ip4" {
			a = a.Unmap()
		}
		if a.Is4() != (network == "ip4") || a.Is4In6() {
			continue
		}
		switch {
		case !isPublic(a):
			private = append(private, a)
		case !slices.Contains(addrs, a) && len(addrs) < maxAddrs/2:
			addrs = append(addrs, a)
		}
	}
	switch {
	case len(addrs) > 0:
		return addrs, nil
	case len(private) > 0:
		return nil, fmt.Errorf("%v: %w", private, errNotPublic)
	default:
		return nil, errNoRecords
	}
}

// errNotPublic is why a family of a name's addresses does not count (none
// is public), why the default resolver refuses a special-use name, or the
// default dialer an address.
var errNotPublic = errors.New("not a public address")

// specialUse are the special-use domain names public DNS never delegates
// (RFC 6761, RFC 6762 .local, RFC 7686 .onion, RFC 8375 home.arpa, and
// ICANN's .internal): no public CA validates a name under them.
var specialUse = []string{"test", "example", "invalid", "localhost", "local", "onion", "home.arpa", "internal"}

// isSpecialUse reports whether host is or lies under a special-use name.
func isSpecialUse(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	for _, s := range specialUse {
		if host == s || strings.HasSuffix(host, "."+s) {
			return true
		}
	}
	return false
}

// newPublicResolver returns the checks' resolver: the system's DNS
// servers (or dial's, for tests), through the Go resolver. addresses asks
// it for each family apart, so a failed AAAA query is seen as such rather
// than hidden behind the A answer, as a CA's resolver sees it; StrictErrors
// makes a temporary failure an error rather than an empty answer. PreferGo,
// as only the Go resolver honours StrictErrors; the public names checked
// here need nothing of the C library's resolver.
func newPublicResolver(dial func(ctx context.Context, network, address string) (net.Conn, error)) *net.Resolver {
	return &net.Resolver{PreferGo: true, StrictErrors: true, Dial: dial}
}

// publicLookup returns the checks' default look-up on r, for A and AAAA
// records, and no look-up at all for a special-use name, which cannot reach
// the fleet as a public CA sees it (and whose look-up would only leak it to
// the resolver).
func publicLookup(r *net.Resolver) func(ctx context.Context, network, host string) ([]netip.Addr, error) {
	return func(ctx context.Context, network, host string) ([]netip.Addr, error) {
		if isSpecialUse(host) {
			return nil, fmt.Errorf("reach: %s is a special-use name: %w", host, errNotPublic)
		}
		return r.LookupNetIP(ctx, network, host)
	}
}

// publicDial returns the checks' default dial: to public addresses only
// (publicOnly).
func publicDial(timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return (&net.Dialer{Timeout: timeout, Control: publicOnly}).DialContext
}

// publicOnly refuses a connection to an address that is not public, as a
// net.Dialer's Control. A name whose DNS leads to a loopback or private address can reach an edge of
// this fleet from where the check runs (the edge itself, or its private
// network), yet a public CA cannot validate it from the internet: the
// order would fail validation, which is what the check is there to spare.
func publicOnly(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("reach: dial %s: %w", address, err)
	}
	if !isPublic(ap.Addr()) {
		return fmt.Errorf("reach: %s: %w", ap.Addr(), errNotPublic)
	}
	return nil
}

// nonPublic are the special-purpose ranges (RFC 6890 and its updates) that
// netip.Addr's methods do not already cover: no public CA validates there
// (Boulder's bdns drops each from a look-up's answer).
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),       // "this network"
	netip.MustParsePrefix("100.64.0.0/10"),   // shared address space (carrier-grade NAT)
	netip.MustParsePrefix("192.0.0.0/24"),    // IETF protocol assignments
	netip.MustParsePrefix("192.0.2.0/24"),    // documentation
	netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking
	netip.MustParsePrefix("198.51.100.0/24"), // documentation
	netip.MustParsePrefix("203.0.113.0/24"),  // documentation
	netip.MustParsePrefix("240.0.0.0/4"),     // reserved, and the broadcast address
	netip.MustParsePrefix("192.88.99.0/24"),  // 6to4 relay anycast (RFC 7526)
	netip.MustParsePrefix("100::/64"),        // discard (RFC 6666)
	netip.MustParsePrefix("2001::/23"),       // IETF protocol assignments, Teredo among them
	netip.MustParsePrefix("2001:db8::/32"),   // documentation
	// 6to4: Let's Encrypt does not validate there (Boulder's bdns), as
	// anyone announcing the prefix could answer for the host.
	netip.MustParsePrefix("2002::/16"),
}

// isPublic reports whether a is a global unicast address outside the
// special-purpose ranges.
func isPublic(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsGlobalUnicast() || a.IsPrivate() {
		return false
	}
	for _, p := range nonPublic {
		if p.Contains(a) {
			return false
		}
	}
	return true
}
