package prefetch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/caddyserver/certmagic"
)

// ReachPath is the path prefix of reachability checks; the token follows it.
const ReachPath = "/.well-known/scafo-edge/reach/"

// reachKeyPrefix is where tokens live in the certificate storage. In the
// fleet store it is shared, so any edge of the fleet answers a check
// another edge started.
const reachKeyPrefix = "scafo-edge/reach/"

// tokenLen is the length of a token in hex: 128 random bits.
const tokenLen = 32

// maxAnswer bounds what a check reads of a response body.
const maxAnswer = 1 << 10

// ErrUnreachable is wrapped by a reachability check that got no answer from
// this fleet: the name's DNS points elsewhere, or nowhere yet.
var ErrUnreachable = errors.New("name does not reach this fleet")

// ErrNoIPv6 is wrapped by a reachability check of a name that publishes an
// AAAA record from a box with no IPv6 route: every IPv4 address reached
// the fleet, but the CA may validate over IPv6 (Let's Encrypt prefers it
// when an AAAA record exists), and that path could not be checked.
var ErrNoIPv6 = errors.New("name has an AAAA record and this box cannot reach IPv6 to check it")

// maxAddrs bounds the addresses one check connects to; a name the fleet
// serves publishes a few.
const maxAddrs = 8

// reachRecord is what storage holds for a token: the name it was made
// for, and the answer only storage knows (the token is in the URL, so
// anything that echoes the request could repeat it; it cannot repeat this).
type reachRecord struct {
	Name   string `json:"name"`
	Answer string `json:"answer"`
}

// prober runs reachability checks.
type prober struct {
	storage certmagic.Storage
	lookup  func(ctx context.Context, network, host string) ([]netip.Addr, error)
	client  *http.Client
	// timeout bounds the look-up, as the client's Timeout does each
	// request.
	timeout time.Duration
}

// addrKey carries, in a check request's context, the address its
// connection must go to: the transport dials it whatever the URL's name.
type addrKey struct{}

func newProber(storage certmagic.Storage, lookup func(ctx context.Context, network, host string) ([]netip.Addr, error), dial func(ctx context.Context, network, addr string) (net.Conn, error), timeout time.Duration) *prober {
	if lookup == nil {
		lookup = publicLookup(newPublicResolver(nil))
	}
	if dial == nil {
		dial = publicDial(timeout)
	}
	return &prober{
		storage: storage,
		lookup:  lookup,
		timeout: timeout,
		client: &http.Client{
			Timeout: timeout,
			Transport: &http.Transport{
				// Never through a proxy: the check is about where the
				// name's own DNS leads.
				Proxy: nil,
				DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
					a, _ := ctx.Value(addrKey{}).(netip.Addr)
					return dial(ctx, network, netip.AddrPortFrom(a, 80).String())
				},
				DisableKeepAlives:  true,
				DisableCompression: true,
			},
			// The edge answers a check before any redirect; a redirect
			// comes from something that is not this fleet.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
}

// errNotPublic is why the default resolver refuses a name, or the default
// dialer an address.
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
// servers (or dial's, for tests), through the Go resolver with
// StrictErrors. net.DefaultResolver drops a failed AAAA query (SERVFAIL, a
// timeout) and returns the A records alone: the check would then test the
// IPv4 addresses only and pass a name whose validation the CA fails ("DNS
// problem: SERVFAIL looking up AAAA"). Strict, the look-up fails, and the
// name is checked again later. PreferGo, as only the Go resolver honours
// StrictErrors; the public names checked here need nothing of the C
// library's resolver.
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
// netip.Addr's methods do not already cover: no public CA validates there.
var nonPublic = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),       // "this network"
	netip.MustParsePrefix("100.64.0.0/10"),   // shared address space (carrier-grade NAT)
	netip.MustParsePrefix("192.0.0.0/24"),    // IETF protocol assignments
	netip.MustParsePrefix("192.0.2.0/24"),    // documentation
	netip.MustParsePrefix("198.18.0.0/15"),   // benchmarking
	netip.MustParsePrefix("198.51.100.0/24"), // documentation
	netip.MustParsePrefix("203.0.113.0/24"),  // documentation
	netip.MustParsePrefix("240.0.0.0/4"),     // reserved, and the broadcast address
	netip.MustParsePrefix("2001:db8::/32"),   // documentation
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

func randomHex(n int) string {
	b := make([]byte, n/2)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// check reports whether http://<name>/ reaches an edge of this fleet at
// every address the name publishes, A and AAAA, as a CA may validate at any
// of them: nil, an error wrapping ErrUnreachable (some address leads
// elsewhere or nowhere) or ErrNoIPv6 (every IPv4 address reached the fleet,
// the IPv6 ones could not be tried from here), or the storage's error when
// the token could not be stored.
func (p *prober) check(ctx context.Context, name string) error {
	addrs, err := p.addresses(ctx, name)
	if err != nil {
		return err
	}
	token := randomHex(tokenLen)
	rec := reachRecord{Name: name, Answer: randomHex(tokenLen)}
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("reach %s: %w", name, err)
	}
	key := reachKeyPrefix + token
	if err := p.storage.Store(ctx, key, b); err != nil {
		return fmt.Errorf("reach %s: store token: %w", name, err)
	}
	// Deleted with a context of its own: the check's may have ended.
	defer p.storage.Delete(context.WithoutCancel(ctx), key)

	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		wg.Go(func() { errs[i] = p.ask(ctx, name, a, token, rec.Answer) })
	}
	wg.Wait()
	var failed addrErrors
	noIPv6 := false
	for i, err := range errs {
		switch {
		case err == nil:
		case addrs[i].Is6() && noRoute(err):
			noIPv6 = true
		default:
			failed = append(failed, fmt.Errorf("%s: %w", addrs[i], err))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("%w: %w", ErrUnreachable, failed)
	}
	if noIPv6 {
		return fmt.Errorf("reach %s: %w", name, ErrNoIPv6)
	}
	return nil
}

// addrErrors are the failures of a check at several addresses, on one
// line (the status page shows it), each still reachable by errors.Is.
type addrErrors []error

func (e addrErrors) Error() string {
	s := make([]string, len(e))
	for i, err := range e {
		s[i] = err.Error()
	}
	return strings.Join(s, "; ")
}

func (e addrErrors) Unwrap() []error { return e }

// addresses returns the distinct addresses name publishes, at most
// maxAddrs, or an error wrapping ErrUnreachable when it publishes none.
func (p *prober) addresses(ctx context.Context, name string) ([]netip.Addr, error) {
	// Bounded like the requests that follow: a resolver that does not
	// answer must not hold the check (and its prefetch slot) for good.
	lctx, cancel := context.WithTimeout(ctx, p.timeout)
	found, err := p.lookup(lctx, "ip", name)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("%w: look up %s: %w", ErrUnreachable, name, err)
	}
	var addrs []netip.Addr
	for _, a := range found {
		if a = a.Unmap(); !slices.Contains(addrs, a) && len(addrs) < maxAddrs {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("%w: %s has no A or AAAA record", ErrUnreachable, name)
	}
	return addrs, nil
}

// ask sends the check for name to addr and reports whether the token's
// answer came back.
func (p *prober) ask(ctx context.Context, name string, addr netip.Addr, token, answer string) error {
	req, err := http.NewRequestWithContext(context.WithValue(ctx, addrKey{}, addr), http.MethodGet, "http://"+name+ReachPath+token, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", "scafo-edge-reach")
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("answered %s", resp.Status)
	}
	if strings.TrimSpace(string(body)) != answer {
		return errors.New("answered 200 without the token's answer")
	}
	return nil
}

// noRoute reports whether a connection failed because this box has no
// route (or no stack) for the address's family, rather than because of
// anything at the address: the kernel refuses it before a packet leaves.
func noRoute(err error) bool {
	return errors.Is(err, syscall.ENETUNREACH) || errors.Is(err, syscall.EADDRNOTAVAIL) || errors.Is(err, syscall.EAFNOSUPPORT)
}

// LooksLikeReach reports whether r may be a reachability check.
func LooksLikeReach(r *http.Request) bool {
	return r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, ReachPath)
}

// ServeReach answers a reachability check for host whose token storage
// holds, and reports whether it did; otherwise it writes nothing. host is
// the request's host, normalised (lower case, no port). A well-formed
// token costs one storage read, as an HTTP-01 token does.
func ServeReach(w http.ResponseWriter, r *http.Request, storage certmagic.Storage, host string) bool {
	token := strings.TrimPrefix(r.URL.Path, ReachPath)
	if !LooksLikeReach(r) || !isToken(token) || host == "" {
		return false
	}
	b, err := storage.Load(r.Context(), reachKeyPrefix+token)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			http.Error(w, "reachability check: storage unavailable", http.StatusServiceUnavailable)
			return true
		}
		return false
	}
	var rec reachRecord
	if json.Unmarshal(b, &rec) != nil || rec.Name != host {
		return false
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	io.WriteString(w, rec.Answer)
	return true
}

// isToken reports whether s has a token's shape, so nothing else reaches
// a storage key.
func isToken(s string) bool {
	if len(s) != tokenLen {
		return false
	}
	for _, c := range []byte(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
