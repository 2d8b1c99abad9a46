package edge

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"net/http"
	"net/netip"
	"net/textproto"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/crypto/bcrypt"
	"golang.org/x/time/rate"

	"github.com/scafo/scafo-edge/internal/forwarded"
	"github.com/scafo/scafo-edge/node"
)

// policy is what the operator routes file adds to one of its routes: a
// redirect, an allow list, basic auth, response header rules. Node routes
// never have one (the node's document has no such fields), and an operator
// route without any has none either: the handler's cost for them is one nil
// check.
type policy struct {
	redirect *redirect
	allow    []netip.Prefix // empty: every client
	auth     *basicAuth
	headers  *headerRules
	// maxBody is the route's own bound on a request body when hasMaxBody
	// (0: none), in place of Handler.MaxBodyBytes (bodylimit.go).
	maxBody    int64
	hasMaxBody bool
}

type redirect struct {
	to       string
	status   int
	keepPath bool
}

type headerRules struct {
	remove []string    // canonical names
	set    [][2]string // canonical name, value; sorted by name
}

// basicAuth checks RFC 7617 credentials against bcrypt hashes.
type basicAuth struct {
	challenge string            // the WWW-Authenticate value
	unknown   []byte            // checked for a user the route does not know
	users     map[string][]byte // user -> bcrypt hash
	v         *verifier
}

// newPolicy compiles an operator route's extras; nil when it has none. The
// file was validated by node.ParseOperator, so nothing here can fail.
func newPolicy(host string, r *node.OperatorRoute, v *verifier) *policy {
	if r.Redirect == nil && len(r.Allow) == 0 && r.BasicAuth == nil && r.Headers == nil && r.MaxBodyBytes == nil {
		return nil
	}
	p := &policy{}
	if r.MaxBodyBytes != nil {
		p.maxBody, p.hasMaxBody = max(*r.MaxBodyBytes, 0), true
	}
	if rd := r.Redirect; rd != nil {
		p.redirect = &redirect{to: rd.To, status: rd.Status, keepPath: rd.KeepPath}
		if p.redirect.status == 0 {
			p.redirect.status = http.StatusPermanentRedirect
		}
	}
	for _, a := range r.Allow {
		if pfx, err := node.ParseAllow(a); err == nil {
			p.allow = append(p.allow, pfx)
		}
	}
	if len(r.Allow) > 0 && len(p.allow) == 0 {
		// Unreachable after ParseOperator; a list of nothing valid must
		// still deny rather than open the route.
		p.allow = []netip.Prefix{}
	}
	if b := r.BasicAuth; b != nil {
		realm := b.Realm
		if realm == "" {
			realm = host
		}
		a := &basicAuth{challenge: `Basic realm="` + realm + `", charset="UTF-8"`, users: map[string][]byte{}, v: v}
		cost := bcrypt.DefaultCost
		for _, line := range b.Users {
			if user, hash, err := node.ParseHtpasswd(line); err == nil {
				a.users[user] = hash
				if c, err := bcrypt.Cost(hash); err == nil && c > cost {
					cost = c
				}
			}
		}
		a.unknown = unknownUserHash(cost)
		p.auth = a
	}
	if h := r.Headers; h != nil {
		hr := &headerRules{}
		for _, name := range h.Remove {
			hr.remove = append(hr.remove, textproto.CanonicalMIMEHeaderKey(name))
		}
		for name, val := range h.Set {
			hr.set = append(hr.set, [2]string{textproto.CanonicalMIMEHeaderKey(name), val})
		}
		sort.Slice(hr.set, func(i, j int) bool { return hr.set[i][0] < hr.set[j][0] })
		p.headers = hr
	}
	return p
}

// Features lists what the operator file adds to the route, for status
// surfaces ("redirect 308 https://www.example.com", "allow 2 networks",
// "basic auth", "headers", "max body 1048576 bytes"); nil for a route with
// none.
func (r *Route) Features() []string {
	p := r.policy
	if p == nil {
		return nil
	}
	var out []string
	if p.redirect != nil {
		s := "redirect " + strconv.Itoa(p.redirect.status) + " " + p.redirect.to
		if p.redirect.keepPath {
			s += " (path kept)"
		}
		out = append(out, s)
	}
	if p.allow != nil {
		out = append(out, "allow "+strconv.Itoa(len(p.allow))+" networks")
	}
	if p.auth != nil {
		out = append(out, "basic auth")
	}
	if p.headers != nil {
		out = append(out, "headers")
	}
	if p.hasMaxBody {
		if p.maxBody == 0 {
			out = append(out, "no max body")
		} else {
			out = append(out, "max body "+strconv.FormatInt(p.maxBody, 10)+" bytes")
		}
	}
	return out
}

// enforce applies p to a request of its route: it answers the request
// itself (a redirect, 403 outside the allow list, 401 without valid
// credentials) and returns true, or readies it to be forwarded (the
// Authorization header it consumed is removed) and returns the writer to
// forward to (w, or w wrapped to apply the route's header rules) and
// false.
func (h *Handler) enforce(w http.ResponseWriter, r *http.Request, rec *Record, p *policy) (http.ResponseWriter, bool) {
	if h.answeredByPolicy(w, r, rec, p) {
		return w, true
	}
	if p.headers != nil {
		w = &headerWriter{ResponseWriter: w, rules: p.headers}
	}
	return w, false
}

func (h *Handler) answeredByPolicy(w http.ResponseWriter, r *http.Request, rec *Record, p *policy) bool {
	if p.allow != nil && !h.allowed(r, p.allow) {
		h.answer(w, r, rec, ReasonNotAllowed)
		return true
	}
	if p.auth != nil {
		switch p.auth.check(r, forwarded.Origin(r.RemoteAddr, r.Header["X-Forwarded-For"], h.TrustedProxies)) {
		case authBusy:
			h.answer(w, r, rec, ReasonOverloaded)
			return true
		case authLimited:
			h.answer(w, r, rec, ReasonClientRate)
			return true
		case authRefused:
			w.Header().Set("WWW-Authenticate", p.auth.challenge)
			h.answer(w, r, rec, ReasonUnauthorized)
			return true
		}
		// The credentials were for the edge: the upstream never sees them.
		r.Header.Del("Authorization")
	}
	if rd := p.redirect; rd != nil {
		loc := rd.to
		// Only a path goes after the URL: the target's other forms are
		// refused before, and nothing may reach the Location's authority.
		if kept := requestPath(r); rd.keepPath && strings.HasPrefix(kept, "/") {
			loc += kept
			if r.URL.RawQuery != "" {
				loc += "?" + r.URL.RawQuery
			}
		}
		hdr := w.Header()
		hdr.Set("Location", loc)
		hdr.Set("Content-Type", "text/plain; charset=utf-8")
		p.headers.apply(hdr)
		w.WriteHeader(rd.status)
		n, _ := w.Write([]byte("scafo-edge: moved to " + loc + "\n"))
		rec.Reason, rec.Status, rec.BytesOut = ReasonRedirect, rd.status, int64(n)
		return true
	}
	return false
}

// allowed reports whether the request's client is in nets: its peer
// address, or, when the peer is one of TrustedProxies, the client the
// proxies vouch for in X-Forwarded-For. A proxy that vouches for nobody is
// not allowed.
func (h *Handler) allowed(r *http.Request, nets []netip.Prefix) bool {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := ap.Addr().Unmap().WithZone("")
	if forwarded.Contains(h.TrustedProxies, ip) {
		client, vouched, err := forwarded.Client(r.Header["X-Forwarded-For"], h.TrustedProxies)
		if err != nil || !vouched {
			return false
		}
		ip = client
	}
	return forwarded.Contains(nets, ip)
}

// apply removes, then sets, the rule's headers on hdr; a nil rule does
// nothing.
func (hr *headerRules) apply(hdr http.Header) {
	if hr == nil {
		return
	}
	for _, name := range hr.remove {
		delete(hdr, name)
	}
	for _, kv := range hr.set {
		hdr[kv[0]] = []string{kv[1]}
	}
}

// headerWriter applies a route's header rules to the response its
// upstream sends, as the header is written. Unwrap lets
// http.ResponseController (flushes, deadlines, hijacking for upgrades)
// reach the server's writer; a 101's headers are written on the hijacked
// connection and are not changed.
type headerWriter struct {
	http.ResponseWriter
	rules *headerRules
	wrote bool
}

func (w *headerWriter) WriteHeader(code int) {
	if !w.wrote && code >= 200 {
		w.wrote = true
		w.rules.apply(w.ResponseWriter.Header())
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *headerWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *headerWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// unknownUserHash returns a bcrypt hash of cost, of a password nobody
// sends, checked for a user a route does not know: as costly as its
// costliest user's, so that the time a refusal takes does not tell which
// users exist. One is made per cost, once.
func unknownUserHash(cost int) []byte {
	if h, ok := unknownHashes.Load(cost); ok {
		return h.([]byte)
	}
	secret := make([]byte, 32)
	rand.Read(secret)
	h, err := bcrypt.GenerateFromPassword(secret, cost)
	if err != nil {
		h, _ = bcrypt.GenerateFromPassword(secret, bcrypt.DefaultCost)
	}
	got, _ := unknownHashes.LoadOrStore(cost, h)
	return got.([]byte)
}

var unknownHashes sync.Map // cost -> hash

// Outcomes of basicAuth.check.
const (
	authPassed = iota
	authRefused
	authBusy    // no check could start in time: 503
	authLimited // the client's address is past its rate of checks: 429
)

func (a *basicAuth) check(r *http.Request, client netip.Addr) int {
	user, pass, ok := r.BasicAuth()
	if !ok {
		return authRefused
	}
	hash, known := a.users[user]
	if !known {
		// As long to refuse as a wrong password, so that the time taken
		// does not tell which users exist.
		if got := a.v.verify(r.Context(), client, a.unknown, pass); got != authPassed {
			return got // limited or busy, as a known user's would be
		}
		return authRefused
	}
	return a.v.verify(r.Context(), client, hash, pass)
}

// verifier bounds the cost of checking passwords, so that a guesser
// cannot burn the edge's CPU: bcrypt takes tens of milliseconds of CPU by
// design. A pair that passed is remembered, so a browser that sends its
// credentials with every request pays once; only successes are kept
// (failures are the guesser's to choose, and would crowd the cache). A
// pair not remembered is checked within the box's rate
// (checksPerCore a second for each core: a request waits up to wait for
// its turn, then is answered 503), one check at a time for every two
// cores, and, while the box's rate is spent, within its client
// address's rate (checksPerClient a second, past it 429), so that one
// guesser cannot take every turn. One verifier serves every table an Updater compiles, so a swap
// does not forget who passed.
type verifier struct {
	slots chan struct{}
	wait  time.Duration
	rate  *rate.Limiter

	mu      sync.Mutex
	passed  map[[sha256.Size]byte]struct{}
	clients map[netip.Addr]*rate.Limiter
}

// The rates of password checks: a client address's, and the box's for
// each core. A check at bcrypt's default cost takes tens of milliseconds
// of a core: the box's rate keeps the checks to a small part of the CPU.
const (
	checksPerClient      = 1
	checksPerClientBurst = 5
	checksPerCore        = 4
	// maxClients bounds the addresses whose rates are remembered; past
	// it they start over.
	maxClients = 16384
)

// maxVerified bounds the remembered pairs; past it the cache starts over.
const maxVerified = 4096

func newVerifier() *verifier {
	cores := runtime.GOMAXPROCS(0)
	return &verifier{
		slots:   make(chan struct{}, max(1, cores/2)),
		wait:    time.Second,
		rate:    rate.NewLimiter(rate.Limit(checksPerCore*cores), checksPerCore*cores),
		passed:  make(map[[sha256.Size]byte]struct{}),
		clients: make(map[netip.Addr]*rate.Limiter),
	}
}

// clientAllows reports whether client may have a password checked now.
func (v *verifier) clientAllows(client netip.Addr) bool {
	if client.Is6() {
		client = netip.PrefixFrom(client, 64).Masked().Addr() // one /64, one client
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	l, ok := v.clients[client]
	if !ok {
		if len(v.clients) >= maxClients {
			clear(v.clients)
		}
		l = rate.NewLimiter(checksPerClient, checksPerClientBurst)
		v.clients[client] = l
	}
	return l.Allow()
}

func (v *verifier) verify(ctx context.Context, client netip.Addr, hash []byte, pass string) int {
	// Keyed by hash and password together: a changed hash for the user
	// forgets the old password.
	h := sha256.New()
	h.Write(hash)
	h.Write([]byte{0})
	// bcrypt reads 72 bytes of a password and no more: so does the key,
	// or suffixes of one good password would fill the cache.
	h.Write([]byte(pass[:min(len(pass), 72)]))
	var key [sha256.Size]byte
	h.Sum(key[:0])
	v.mu.Lock()
	_, ok := v.passed[key]
	v.mu.Unlock()
	if ok {
		return authPassed
	}
	// A client address's rate bites only while the box's is spent: on an
	// idle box an office behind one NAT logs in as fast as it types.
	if v.rate.Tokens() < 1 && !v.clientAllows(client) {
		return authLimited
	}
	wctx, cancel := context.WithTimeout(ctx, v.wait)
	defer cancel()
	if err := v.rate.Wait(wctx); err != nil {
		return authBusy
	}
	select {
	case v.slots <- struct{}{}:
	case <-wctx.Done():
		return authBusy
	}
	err := bcrypt.CompareHashAndPassword(hash, []byte(pass))
	<-v.slots
	if err != nil {
		return authRefused
	}
	v.mu.Lock()
	if len(v.passed) >= maxVerified {
		clear(v.passed)
	}
	v.passed[key] = struct{}{}
	v.mu.Unlock()
	return authPassed
}
