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

// errNotYet is wrapped, beside ErrUnreachable, by a check that every
// address it failed at answered as an edge answers a host its document
// does not name: the document naming the name has not reached that edge
// yet. Edges poll the document on their own clocks, so this is the
// normal state of a new name for up to a poll interval.
var errNotYet = errors.New("an edge of this fleet does not name the host yet")

// errNoRoute is an address's failure when it answered as an edge answers
// a host its document does not name.
var errNoRoute = errors.New("answered 404 as an edge of this fleet whose document does not name the host")

// noRouteAnswer is the body an edge answers a host its document does not
// name with (package edge, its "no_route" answer), after a 404. Anything
// answering it is taken for an edge of this fleet; one of another fleet
// costs a few checks more before the name's back-off, never an order.
const noRouteAnswer = "scafo-edge: no route for this host"

// maxAddrs bounds the addresses one check connects to, half of them per
// family; a name the fleet serves publishes a few.
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
	// stored is called for each token stored; nil: nothing.
	stored func()
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

func randomHex(n int) string {
	b := make([]byte, n/2)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// check reports whether http://<name>/ reaches an edge of this fleet at
// every address a CA would validate at (addresses: the public A and AAAA
// records of the families whose queries answered), as it may validate at
// any of them. It returns nil; an error wrapping ErrUnreachable (some
// address leads elsewhere or nowhere), and errNotYet too when every
// address that failed is an edge whose document does not name the host
// yet; ErrNoIPv6 (every IPv4 address reached the fleet, the IPv6 ones
// could not be tried from here); or the storage's error when the token
// could not be stored.
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
	if p.stored != nil {
		p.stored()
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
		if !slices.ContainsFunc(failed, func(err error) bool { return !errors.Is(err, errNoRoute) }) {
			return fmt.Errorf("%w: %w: %w", ErrUnreachable, errNotYet, failed)
		}
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
	if resp.StatusCode == http.StatusNotFound && strings.TrimSpace(string(body)) == noRouteAnswer {
		return errNoRoute
	}
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
