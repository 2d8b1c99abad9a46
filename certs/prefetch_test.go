package certs

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/scafo/scafo-edge/certs/certstest"
	"github.com/scafo/scafo-edge/certs/prefetch"
	"github.com/scafo/scafo-edge/edge"
	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
	"github.com/scafo/scafo-edge/node/nodetest"
)

// testDNS is the tests' stand-in for public DNS: each name it is asked
// for gets an address of its own (public-looking; only dialRoutes dials it).
var testDNS struct {
	mu    sync.Mutex
	names []string
}

// lookupTestDNS is prefetch.Options.LookupNetIP on testDNS.
func lookupTestDNS(_ context.Context, _, host string) ([]netip.Addr, error) {
	testDNS.mu.Lock()
	defer testDNS.mu.Unlock()
	i := slices.Index(testDNS.names, host)
	if i < 0 {
		testDNS.names = append(testDNS.names, host)
		i = len(testDNS.names) - 1
	}
	return []netip.Addr{netip.AddrFrom4([4]byte{93, 184, byte(i >> 8), byte(i)})}, nil
}

// dialRoutes connects a reachability check for the address lookupTestDNS
// gave a name to the loopback address routes gives that name, or to
// fallback.
func dialRoutes(fallback string, routes map[string]string) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ap, err := netip.ParseAddrPort(addr)
		if err != nil {
			return nil, err
		}
		b := ap.Addr().As4()
		testDNS.mu.Lock()
		name := testDNS.names[int(b[2])<<8|int(b[3])]
		testDNS.mu.Unlock()
		to, ok := routes[name]
		if !ok {
			to = fallback
		}
		return (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", to)
	}
}

// notThisFleet is a web server somewhere else: where a custom domain
// points before its owner moves it to the fleet.
func notThisFleet(t *testing.T) string {
	srv := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// storedCert reports whether m's storage holds a certificate for name.
func storedCert(m *Manager, name string) bool {
	return m.cfg.Storage.Exists(context.Background(), certmagic.StorageKeys.SiteCert(m.acme.IssuerKey(), name))
}

// prefetchEntry returns name's entry in m's prefetch queue.
func prefetchEntry(m *Manager, name string) (prefetch.Entry, bool) {
	i := slices.IndexFunc(m.PrefetchStatus(), func(e prefetch.Entry) bool { return e.Name == name })
	if i < 0 {
		return prefetch.Entry{}, false
	}
	return m.PrefetchStatus()[i], true
}

// series returns the value of the series name{labels} in reg, or 0.
func series(t *testing.T, reg *prometheus.Registry, name string, labels testsupport.Labels) float64 {
	t.Helper()
	v, _ := testsupport.MetricValue(t, reg, name, labels)
	return v
}

// prefetchOptions is Options for an edge with prefetch p against pb,
// approving what names approves.
func prefetchOptions(pb *certstest.Pebble, names *nameSet, reg prometheus.Registerer, p *prefetch.Options) Options {
	return Options{
		Allowed:    names.Allowed,
		CA:         pb.DirectoryURL,
		CARoot:     string(pb.RootPEM),
		Email:      "ops@example.test",
		Registerer: reg,
		Prefetch:   p,
	}
}

func TestPrefetch(t *testing.T) {
	e := newTestEdge(t)
	pb := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: e.httpPort, TLSPort: e.httpsPort})
	roots := pb.IssuerRoots(t)
	elsewhere := notThisFleet(t)
	names := newNameSet()
	reg := prometheus.NewRegistry()
	m := e.start(t, t.TempDir(), prefetchOptions(pb, names, reg, &prefetch.Options{
		RetryBase:   100 * time.Millisecond,
		RetryMax:    time.Second,
		LookupNetIP: lookupTestDNS,
		DialContext: dialRoutes(e.httpLn.Addr().String(), testsupport.Labels{"dark.test": elsewhere}),
	}))
	doc := []string{"old.test"}
	names.set("old.test", true)
	m.Prefetch(doc)
	testsupport.WaitFor(t, 30*time.Second, "old.test prefetched", func() bool { return storedCert(m, "old.test") })
	pb.WaitOrderCount(t, 1)

	added := []string{"one.test", "two.test", "three.test"}
	t.Run("a document adding three names gets their certificates before any client connects", func(t *testing.T) {
		for _, n := range added {
			names.set(n, true)
		}
		doc = append(doc, added...)
		m.Prefetch(doc)
		testsupport.WaitFor(t, 60*time.Second, "three certificates in storage", func() bool {
			return storedCert(m, "one.test") && storedCert(m, "two.test") && storedCert(m, "three.test")
		})
		pb.WaitOrderCount(t, 4)
		testsupport.WaitFor(t, 5*time.Second, "the queue to empty", func() bool { return len(m.PrefetchStatus()) == 0 })
		if got := series(t, reg, "scafo_edge_tls_prefetch_turns_total", testsupport.Labels{"result": "obtained"}); got != 4 {
			t.Errorf("prefetch obtained metric = %v, want 4", got)
		}
	})

	t.Run("the first HTTPS request to a prefetched name places no order", func(t *testing.T) {
		for _, n := range added {
			before := pb.OrderCount()
			status, _, ttfb, err := e.get(n, "/", roots)
			if err != nil || status != http.StatusOK {
				t.Fatalf("GET https://%s = %d, %v; want 200", n, status, err)
			}
			if got := pb.OrderCount(); got != before {
				t.Errorf("orders during the first request to %s: %d -> %d, want none", n, before, got)
			}
			t.Logf("time to first byte, first HTTPS request to prefetched %s: %v", n, ttfb.Round(time.Microsecond))
		}
		// The same, for a name the document names but prefetch was not
		// told about: on-demand issuance inside the handshake.
		names.set("ondemand.test", true)
		status, _, ttfb, err := e.get("ondemand.test", "/", roots)
		if err != nil || status != http.StatusOK {
			t.Fatalf("GET https://ondemand.test = %d, %v; want 200", status, err)
		}
		t.Logf("time to first byte, first HTTPS request to on-demand ondemand.test: %v", ttfb.Round(time.Microsecond))
		pb.WaitOrderCount(t, 5)
	})

	t.Run("a name whose DNS does not reach the fleet costs no order and is reported", func(t *testing.T) {
		before := pb.OrderCount()
		names.set("dark.test", true)
		doc = append(doc, "dark.test")
		m.Prefetch(doc)
		testsupport.WaitFor(t, 10*time.Second, "dark.test reported unreachable twice", func() bool {
			en, ok := prefetchEntry(m, "dark.test")
			return ok && en.State == prefetch.Unreachable && en.Failures >= 2
		})
		if got := series(t, reg, "scafo_edge_tls_prefetch_unreachable_names", nil); got != 1 {
			t.Errorf("unreachable names metric = %v, want 1", got)
		}
		if got := pb.OrderCount(); got != before {
			t.Errorf("orders = %d, want %d: an unreachable name must cost none", got, before)
		}
		if storedCert(m, "dark.test") {
			t.Error("dark.test has a certificate")
		}
		en, _ := prefetchEntry(m, "dark.test")
		t.Logf("status of dark.test: %+v", en)
	})

	t.Run("a visitor for a name in prefetch back-off gets an on-demand certificate at once", func(t *testing.T) {
		// Pebble's DNS sends dark.test to this edge; the prefetch check
		// still sees it elsewhere.
		before := pb.OrderCount()
		leaf, err := e.handshake("dark.test", roots)
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		if err := leaf.VerifyHostname("dark.test"); err != nil {
			t.Error(err)
		}
		pb.WaitOrderCount(t, before+1)
		testsupport.WaitFor(t, 10*time.Second, "the queue to drop dark.test once held", func() bool {
			_, ok := prefetchEntry(m, "dark.test")
			return !ok
		})
	})

	t.Run("a reachability check with an unknown token is not answered", func(t *testing.T) {
		resp, _, err := e.getHTTP("one.test", prefetch.ReachPath+"0123456789abcdef0123456789abcdef")
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode == http.StatusOK {
			t.Errorf("unknown token answered 200")
		}
	})
}

func TestPrefetchBudgetAndRemoval(t *testing.T) {
	e := newTestEdge(t)
	pb := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: e.httpPort, TLSPort: e.httpsPort})
	// The test moves the queue's clock an hour to refill the budget.
	clk := newFakeClock()
	doc := []string{"b1.test", "b2.test", "b3.test", "b4.test"}
	names := newNameSet(doc...)
	reg := prometheus.NewRegistry()
	opts := prefetchOptions(pb, names, reg, &prefetch.Options{
		PerHour:     2,
		LookupNetIP: lookupTestDNS,
		DialContext: dialRoutes(e.httpLn.Addr().String(), nil),
	})
	opts.Clock = clk
	m := e.start(t, t.TempDir(), opts)
	m.Prefetch(doc)

	t.Run("more names than the budget: the rest wait, counted", func(t *testing.T) {
		// The first two names in the document go first.
		testsupport.WaitFor(t, 60*time.Second, "b1 and b2 obtained, b3 and b4 held back", func() bool {
			st := m.PrefetchStatus()
			return storedCert(m, "b1.test") && storedCert(m, "b2.test") &&
				len(st) == 2 && st[0].State == prefetch.Budget && st[1].State == prefetch.Budget
		})
		pb.WaitOrderCount(t, 2)
		if got := series(t, reg, "scafo_edge_tls_prefetch_budget_waits_total", nil); got < 2 {
			t.Errorf("budget waits = %v, want at least 2", got)
		}
		if got := series(t, reg, "scafo_edge_tls_prefetch_queue_names", nil); got != 2 {
			t.Errorf("queue metric = %v, want 2", got)
		}
		if got := series(t, reg, "scafo_edge_tls_prefetch_budget_remaining", nil); got >= 1 {
			t.Errorf("budget remaining = %v, want < 1", got)
		}
	})

	t.Run("a name removed from the document before its turn is never ordered", func(t *testing.T) {
		names.set("b4.test", false)
		doc = doc[:3]
		m.Prefetch(doc)
		if _, ok := prefetchEntry(m, "b4.test"); ok {
			t.Fatalf("b4.test still queued after leaving the document")
		}
		clk.Advance(time.Hour)
		testsupport.WaitFor(t, 60*time.Second, "b3.test obtained once the budget refills", func() bool { return storedCert(m, "b3.test") })
		testsupport.WaitFor(t, 5*time.Second, "the queue to empty", func() bool { return len(m.PrefetchStatus()) == 0 })
		pb.WaitOrderCount(t, 3)
		if storedCert(m, "b4.test") {
			t.Error("b4.test was obtained after leaving the document")
		}
	})
}

// TestPrefetchFleetOneOrderPerName gives five edges on one fleet store the
// same new document at once. Each prefetches; the fleet places one order
// per name, and every edge then serves every name without another.
// Each edge's reachability check is answered by the next edge, which
// knows the token only through the fleet store.
func TestPrefetchFleetOneOrderPerName(t *testing.T) {
	const edges = 5
	n := nodetest.New(t, nodetest.Options{Token: fleetToken})
	fleet := make([]*fleetEdge, edges)
	for i := range fleet {
		fleet[i] = newFleetEdge(t)
	}
	pb := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: fleet[0].httpPort, TLSPort: fleet[0].httpsPort})
	doc := []string{"a.fleet.test", "b.fleet.test", "c.fleet.test"}
	ms := make([]*Manager, edges)
	for i, e := range fleet {
		opts := acmeOptions(pb, doc...)
		opts.Prefetch = &prefetch.Options{
			BusyRetry:   200 * time.Millisecond,
			LookupNetIP: lookupTestDNS,
			DialContext: dialRoutes(fleet[(i+1)%edges].httpLn.Addr().String(), nil),
		}
		ms[i] = e.start(t, n, opts, FleetOptions{LockPollMax: 200 * time.Millisecond})
	}
	before := n.StorageCounts()
	var wg sync.WaitGroup
	for _, m := range ms {
		wg.Go(func() { m.Prefetch(doc) })
	}
	wg.Wait()
	testsupport.WaitFor(t, 90*time.Second, "every name in the fleet store and every queue empty", func() bool {
		for _, m := range ms {
			if len(m.PrefetchStatus()) > 0 {
				return false
			}
		}
		for _, name := range doc {
			if !storedCert(ms[0], name) {
				return false
			}
		}
		return true
	})
	pb.WaitOrderCount(t, len(doc))
	after := n.StorageCounts()
	t.Logf("%d edges, %d new names: %d ACME orders; node locks taken %d, try-lock conflicts %d",
		edges, len(doc), pb.OrderCount(), after.LocksTaken-before.LocksTaken, after.LockConflicts-before.LockConflicts)
	roots := pb.IssuerRoots(t)
	for _, name := range doc {
		serials := map[string]bool{}
		for i, e := range fleet {
			leaf, err := e.handshake(name, roots)
			if err != nil {
				t.Fatalf("edge %d handshake for %s: %v", i, name, err)
			}
			serials[leaf.SerialNumber.Text(16)] = true
		}
		if len(serials) != 1 {
			t.Errorf("%s: edges serve %d certificates, want one", name, len(serials))
		}
	}
	if got := pb.OrderCount(); got != len(doc) {
		t.Errorf("orders = %d, want %d (one per name)", got, len(doc))
	}
}

// TestPrefetchFailedOrderWaitsOutTheBackOff: a name that reaches the edge
// but fails validation costs one prefetched order, then stays listed as
// failed until on-demand issuance's back-off for it ends, rather than being
// dropped as if it had left the document once prefetch's shorter back-off
// ended.
func TestPrefetchFailedOrderWaitsOutTheBackOff(t *testing.T) {
	e := newTestEdge(t)
	pb := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: e.httpPort, TLSPort: e.httpsPort})
	// The check is answered, but Pebble's validator resolves the name to
	// an address nothing listens on.
	pb.SetA(t, "broken.test", "127.0.0.2")
	reg := prometheus.NewRegistry()
	opts := prefetchOptions(pb, newNameSet("broken.test"), reg, &prefetch.Options{
		RetryBase:   50 * time.Millisecond,
		RetryMax:    100 * time.Millisecond,
		LookupNetIP: lookupTestDNS,
		DialContext: dialRoutes(e.httpLn.Addr().String(), nil),
	})
	opts.FailureBackoffBase = time.Hour
	m := e.start(t, t.TempDir(), opts)
	m.Prefetch([]string{"broken.test"})
	testsupport.WaitFor(t, 60*time.Second, "broken.test listed as failed until the on-demand back-off ends", func() bool {
		en, ok := prefetchEntry(m, "broken.test")
		return ok && en.State == prefetch.Failed && en.Failures == 1 && en.Next.After(time.Now().Add(30*time.Minute))
	})
	// Prefetch tries HTTP-01 only: one order and one failed validation for
	// the attempt, where HTTP-01 then TLS-ALPN-01 spent two of each. (Pebble
	// logs them a moment after answering.)
	testsupport.WaitForNil(t, 5*time.Second, "one order and one invalid authorization at the CA", func() error {
		if o, i := pb.OrderCount(), pb.InvalidAuthzCount(); o != 1 || i != 1 {
			return fmt.Errorf("%d orders and %d invalid authorizations", o, i)
		}
		return nil
	})
	orders := pb.OrderCount()
	if got := series(t, reg, "scafo_edge_tls_issuances_total", testsupport.Labels{"result": "failed", "kind": "new"}); got != 1 {
		t.Errorf("failed issuances = %v, want 1", got)
	}
	// A document change asks again; the name waits on.
	m.Prefetch([]string{"broken.test"})
	if en, ok := prefetchEntry(m, "broken.test"); !ok || en.State != prefetch.Failed {
		t.Errorf("broken.test after an unchanged document = %+v, %v; want still failed", en, ok)
	}
	if got := series(t, reg, "scafo_edge_tls_prefetch_turns_total", testsupport.Labels{"result": "removed"}); got != 0 {
		t.Errorf("removed turns = %v, want 0: the name never left the document", got)
	}
	if got := pb.OrderCount(); got != orders {
		t.Errorf("orders = %d, want %d: none during the back-off", got, orders)
	}
}

// publicDNS is public DNS and the internet as a reachability check sees
// them, per name: its A and AAAA records, a family whose query fails
// (SERVFAIL or a timeout), and where a connection to each address lands.
// An address it does not place refuses connections.
type publicDNS struct {
	records map[string][]netip.Addr
	fail    map[string]string // name -> the family ("ip4", "ip6") whose query fails
	at      map[netip.Addr]string
}

// lookup is prefetch.Options.LookupNetIP as the Go resolver with
// StrictErrors answers it: a failed family fails "ip" too.
func (d *publicDNS) lookup(_ context.Context, network, host string) ([]netip.Addr, error) {
	if f := d.fail[host]; f != "" && (network == f || network == "ip") {
		return nil, &net.DNSError{Err: "server misbehaving", Name: host, IsTemporary: true}
	}
	var out []netip.Addr
	for _, a := range d.records[host] {
		if network == "ip" || a.Is4() == (network == "ip4") {
			out = append(out, a)
		}
	}
	if len(out) == 0 {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return out, nil
}

func (d *publicDNS) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return nil, err
	}
	to, ok := d.at[ap.Addr()]
	if !ok {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	}
	return (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", to)
}

// TestPrefetchChecksWhatTheCAValidates: the reachability check looks at
// the addresses Let's Encrypt validates at (Boulder's bdns.LookupHost), so
// it holds back no name the CA would certify (issue 30): a private or
// reserved address beside the fleet's public one is ignored, and a name
// whose AAAA query fails while its A records reach the fleet is checked
// over IPv4, as the CA then validates it.
func TestPrefetchChecksWhatTheCAValidates(t *testing.T) {
	e := newTestEdge(t)
	pb := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: e.httpPort, TLSPort: e.httpsPort})
	fleetAddr := netip.MustParseAddr("93.184.215.14")
	dns := &publicDNS{
		records: map[string][]netip.Addr{
			"mixed.test":  {netip.MustParseAddr("10.20.30.40"), fleetAddr, netip.MustParseAddr("fd00::1")},
			"a-only.test": {fleetAddr, netip.MustParseAddr("2606:2800:21f:cb07:6820:80da:af6b:8b2c")},
		},
		fail: map[string]string{"a-only.test": "ip6"},
		// 10.20.30.40 is another network's private address: nothing of
		// the fleet answers there, from here or from the CA.
		at: map[netip.Addr]string{fleetAddr: e.httpLn.Addr().String()},
	}
	names := newNameSet()
	m := e.start(t, t.TempDir(), prefetchOptions(pb, names, prometheus.NewRegistry(), &prefetch.Options{
		RetryBase:   time.Hour, // one check each: a name held back is not certified in this test's time
		LookupNetIP: dns.lookup,
		DialContext: dns.dial,
	}))
	for _, tc := range []struct{ name, what string }{
		{"mixed.test", "a name with a private address beside the fleet's public one is certified with one order"},
		{"a-only.test", "a name whose AAAA query fails while its A record reaches the fleet is certified"},
	} {
		t.Run(tc.what, func(t *testing.T) {
			before := pb.OrderCount()
			names.set(tc.name, true)
			m.Prefetch([]string{tc.name})
			testsupport.WaitForNil(t, 30*time.Second, tc.name+" certified", func() error {
				if storedCert(m, tc.name) {
					return nil
				}
				en, _ := prefetchEntry(m, tc.name)
				return fmt.Errorf("not yet: %+v", en)
			})
			testsupport.WaitFor(t, 5*time.Second, "the queue to empty", func() bool { return len(m.PrefetchStatus()) == 0 })
			if got := pb.OrderCount() - before; got != 1 {
				t.Errorf("orders for %s = %d, want 1", tc.name, got)
			}
		})
	}
}

// TestPrefetchFleetDocumentLags: edges poll the routing document on their
// own clocks, so the edge a new name's DNS leads to may name it up to one
// poll interval after the edges that check it, and answer their checks
// with its 404 "no route for this host" (issue 30). Three edges on one
// fleet store, each answering port 80 through its Manager in front of a
// real edge.Handler on its own table: the names' DNS leads to edge C,
// which swaps in the new document last, up to one interval after A; C
// cannot reach its own public address (a box behind a 1:1 NAT without
// hairpinning, as the README notes), so A and B must check through it.
// Every name is certified within 15 s of the document reaching A, where a
// check that waited out the minute's back-off took more than a minute;
// and with two reachability checks a name in the fleet, the one too early
// for C and the one after (issue 47: one check a name, one more where a
// document lagged), where each edge used to check for itself, four a name.
func TestPrefetchFleetDocumentLags(t *testing.T) {
	const poll = prefetch.DefaultPollInterval
	n := nodetest.New(t, nodetest.Options{Token: fleetToken})
	type lagEdge struct {
		*fleetEdge
		live edge.Live
		m    *Manager
		reg  *prometheus.Registry
	}
	edges := make([]*lagEdge, 3)
	for i := range edges {
		edges[i] = &lagEdge{fleetEdge: newFleetEdge(t), reg: prometheus.NewRegistry()}
	}
	// checks counts the reachability checks of each name, fleet-wide: a
	// check looks its name's A record up once, just before storing its
	// token (and every look-up here answers).
	var checksMu sync.Mutex
	checks := map[string]int{}
	pb := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: edges[0].httpPort, TLSPort: edges[0].httpsPort})
	route := func(host string) node.Route {
		return node.Route{Host: host, Application: "shop", Upstreams: []node.Upstream{{Node: "n", Address: "127.0.0.1:1"}}}
	}
	compile := func(hosts ...string) *edge.Table {
		doc := &node.Document{V: 1}
		for _, h := range hosts {
			doc.Routes = append(doc.Routes, route(h))
		}
		tbl, drops := edge.Compile(doc)
		if len(drops) > 0 {
			t.Fatalf("compile: %v", drops)
		}
		return tbl
	}
	publicAddr := netip.MustParseAddr("93.184.215.20")
	checked := edges[2]
	routing := &edge.Handler{Table: &checked.live}
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		checked.cur.Load().HTTPHandler(routing).ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	for _, e := range edges {
		e.live.Store(compile()) // a document, naming none of the names yet
		dns := &publicDNS{at: map[netip.Addr]string{publicAddr: front.Listener.Addr().String()}}
		if e == checked {
			dns.at = nil // no hairpin: its own public address refuses it
		}
		opts := acmeOptions(pb)
		opts.Registerer = e.reg
		opts.Allowed = func(name string) bool { return e.live.Load().Certifiable(name) }
		opts.Prefetch = &prefetch.Options{
			PollInterval: poll,
			LookupNetIP: func(ctx context.Context, network, host string) ([]netip.Addr, error) {
				if network == "ip4" {
					checksMu.Lock()
					checks[host]++
					checksMu.Unlock()
				}
				if network == "ip6" {
					return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
				}
				return []netip.Addr{publicAddr}, nil
			},
			DialContext: dns.dial,
		}
		e.m = e.start(t, n, opts, FleetOptions{LockPollMax: 200 * time.Millisecond})
	}

	added := []string{"a.lag.test", "b.lag.test", "c.lag.test"}
	// A swaps the document in now, B within half an interval, C (the
	// checked edge) between half an interval and a whole one later.
	offsets := []time.Duration{0, rand.N(poll / 2), poll/2 + rand.N(poll/2+1)}
	var swaps sync.WaitGroup
	counts := n.StorageCounts()
	start := time.Now()
	for i, e := range edges {
		swaps.Add(1)
		timer := time.AfterFunc(offsets[i], func() {
			defer swaps.Done()
			e.live.Store(compile(added...))
			e.m.Prefetch(added)
		})
		t.Cleanup(func() {
			if timer.Stop() {
				swaps.Done()
			}
			swaps.Wait()
		})
	}
	t.Logf("document swapped in at A +0s, B +%v, C +%v", offsets[1].Round(time.Millisecond), offsets[2].Round(time.Millisecond))
	const within = 15 * time.Second
	certified := func() bool {
		for _, name := range added {
			if !storedCert(edges[0].m, name) {
				return false
			}
		}
		return true
	}
	if !pollBy(start.Add(within), 100*time.Millisecond, certified) {
		t.Fatalf("names not certified within %v of the document; queues: A %+v, B %+v, C %+v", within,
			edges[0].m.PrefetchStatus(), edges[1].m.PrefetchStatus(), edges[2].m.PrefetchStatus())
	}
	took := time.Since(start)
	t.Logf("every name certified %v after the document reached A (%d orders)", took.Round(10*time.Millisecond), pb.OrderCount())
	pb.WaitOrderCount(t, len(added))
	// Every queue empties: the edges that did not check took the checking
	// edge's verdict, and find the certificate stored when it stops
	// holding, without a check of their own. Before verdicts each name had
	// four checks (A's and B's, too early for C; C's own, which cannot
	// reach its public address and backed C off for a minute; the one
	// that passed), and C's queue kept the name for that minute.
	testsupport.WaitFor(t, 30*time.Second, "every queue empty", func() bool {
		for _, e := range edges {
			if len(e.m.PrefetchStatus()) > 0 {
				return false
			}
		}
		return true
	})
	tokens := make([]float64, len(edges))
	total := 0.0
	for i, e := range edges {
		tokens[i] = series(t, e.reg, "scafo_edge_tls_prefetch_reach_checks_total", nil)
		total += tokens[i]
	}
	checksMu.Lock()
	defer checksMu.Unlock()
	after := n.StorageCounts()
	t.Logf("reach tokens written: A %v, B %v, C %v; checks by name %v; node store: %d writes, %d deletes, %d reads, %d locks taken",
		tokens[0], tokens[1], tokens[2], checks, after.Puts-counts.Puts, after.Deletes-counts.Deletes,
		after.Gets+after.Stats+after.Lists-counts.Gets-counts.Stats-counts.Lists, after.LocksTaken-counts.LocksTaken)
	// One check a name, and one more as C's document lagged behind it.
	for _, name := range added {
		if checks[name] > 2 {
			t.Errorf("%s: %d reachability checks in the fleet, want at most 2", name, checks[name])
		}
	}
	if want := float64(2 * len(added)); total > want {
		t.Errorf("reach tokens written = %v, want at most %v", total, want)
	}
}

// pollBy checks cond every interval until it holds or deadline passes,
// and reports whether it held. For a condition too costly to check as
// often as testsupport.Poll does.
func pollBy(deadline time.Time, every time.Duration, cond func() bool) bool {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for !cond() {
		if !time.Now().Before(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}
