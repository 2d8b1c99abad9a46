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
	"strings"
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
	client  *http.Client
}

func newProber(storage certmagic.Storage, dial func(ctx context.Context, network, addr string) (net.Conn, error), timeout time.Duration) *prober {
	if dial == nil {
		dial = publicDial(timeout)
	}
	return &prober{
		storage: storage,
		client: &http.Client{
			Timeout: timeout,
			Transport: &http.Transport{
				// Never through a proxy: the check is about where the
				// name's own DNS leads.
				Proxy:              nil,
				DialContext:        dial,
				DisableKeepAlives:  true,
				DisableCompression: true,
			},
			// The edge answers a check before any redirect; a redirect
			// comes from something that is not this fleet.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
}

// errNotPublic is why the default dialer refuses a name or an address.
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

// publicDial returns the checks' default dial: through the system
// resolver to public addresses only (publicOnly), and without even a
// look-up for a special-use name, which cannot reach the fleet as a public
// CA sees it (and whose look-up would only leak it to the resolver).
func publicDial(timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout, Control: publicOnly}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if host, _, err := net.SplitHostPort(addr); err == nil && isSpecialUse(host) {
			return nil, fmt.Errorf("reach: %s is a special-use name: %w", host, errNotPublic)
		}
		return d.DialContext(ctx, network, addr)
	}
}

// publicOnly refuses a connection to an address that is not public, as a
// net.Dialer's Control (called with each resolved address, so a name with
// several addresses is refused only those that are not public). A name
// whose DNS leads to a loopback or private address can reach an edge of
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

// check reports whether http://<name>/ reaches an edge of this fleet: nil,
// or an error wrapping ErrUnreachable (or the storage's error, when the
// token could not be stored).
func (p *prober) check(ctx context.Context, name string) error {
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

	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+name+ReachPath+token, nil)
	if err != nil {
		return fmt.Errorf("reach %s: %w", name, err)
	}
	req.Header.Set("User-Agent", "scafo-edge-reach")
	resp, err := p.client.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: answered %s", ErrUnreachable, resp.Status)
	}
	if strings.TrimSpace(string(body)) != rec.Answer {
		return fmt.Errorf("%w: answered 200 without the token's answer", ErrUnreachable)
	}
	return nil
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
