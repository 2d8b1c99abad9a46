package e2e

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/admin"
	"github.com/scafo/scafo-edge/certs/certstest"
	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
	"github.com/scafo/scafo-edge/node/nodetest"
)

// TestPrefetchThroughTheBinary: with --tls acme the binary prefetches the
// names a document adds, but only once a name answers its reachability
// check through the system resolver on port 80. Here nothing of the fleet
// listens where the names resolve, so a new name costs no ACME order and
// is listed as not reaching the fleet; a visitor still gets a certificate
// on demand.
func TestPrefetchThroughTheBinary(t *testing.T) {
	p, acmeArgs := acmeEdge(t)
	a := app(t, "A")
	route := func(host string) node.Route {
		return node.Route{Host: host, Application: "shop", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(a)}}}
	}
	n := nodetest.New(t, nodetest.Options{})
	n.SetDocument(&node.Document{V: 1, Routes: []node.Route{route("first.example")}})
	e := startEdge(t, append(acmeArgs, "--node", n.URL(), "--state-dir", t.TempDir(), "--cert-store", "local")...)

	waiting := func() (map[string]admin.PrefetchStatus, error) {
		code, body := e.admin(t, "/status.json")
		var v admin.Status
		if err := json.Unmarshal([]byte(body), &v); code != 200 || err != nil {
			return nil, fmt.Errorf("status.json: %d %v", code, err)
		}
		out := map[string]admin.PrefetchStatus{}
		for _, s := range v.Prefetch {
			out[s.Name] = s
		}
		return out, nil
	}
	unreachable := func(names ...string) func() error {
		return func() error {
			w, err := waiting()
			if err != nil {
				return err
			}
			for _, name := range names {
				if w[name].State != "unreachable" {
					return fmt.Errorf("%s: %+v", name, w[name])
				}
			}
			return nil
		}
	}
	testsupport.WaitForNil(t, 30*time.Second, "first.example listed as not reaching the fleet", unreachable("first.example"))

	n.SetDocument(&node.Document{V: 1, Routes: []node.Route{route("first.example"), route("added.example")}})
	testsupport.WaitForNil(t, 30*time.Second, "the name the new document adds listed too", unreachable("first.example", "added.example"))
	_, metrics := e.admin(t, "/metrics")
	if !slices.Contains(strings.Split(metrics, "\n"), "scafo_edge_tls_prefetch_unreachable_names 2") {
		t.Errorf("metrics lack scafo_edge_tls_prefetch_unreachable_names 2")
	}
	if got := p.OrderCount(); got != 0 {
		t.Errorf("Pebble orders = %d, want 0: a name that does not reach the fleet costs none", got)
	}

	// Pebble's DNS sends every name to the edge: a visitor's handshake
	// obtains a certificate at once, whatever prefetch's back-off.
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 60 * time.Second}, Config: &tls.Config{ServerName: "added.example", RootCAs: p.IssuerRoots(t)}}
	conn, err := d.Dial("tcp", e.HTTPSAddr)
	if err != nil {
		t.Fatalf("handshake for a name in prefetch back-off: %v\n%s", err, e.logText())
	}
	conn.Close()
	p.WaitOrderCount(t, 1)
}

// acmeEdge starts a Pebble that validates on two free loopback ports and
// returns it with the flags that make an edge listen there and use it.
func acmeEdge(t *testing.T) (*certstest.Pebble, []string) {
	httpPort, httpsPort := testsupport.FreePort(t), testsupport.FreePort(t)
	p := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: httpPort, TLSPort: httpsPort})
	root := pebbleRootFile(t, p)
	return p, []string{"--tls", "acme", "--acme-ca", p.DirectoryURL, "--acme-ca-root", root,
		"--http-addr", fmt.Sprintf("127.0.0.1:%d", httpPort), "--https-addr", fmt.Sprintf("127.0.0.1:%d", httpsPort)}
}

// TestChallengeFloodForUnnamedHostsCostsBoundedNodeReads: with the fleet store, a reachability
// check or an HTTP-01 token costs a request to the node. Reachability
// checks for hosts the document does not name are answered without one;
// HTTP-01 tokens for such hosts (an edge whose document lags may be asked
// for a token another edge stored) cost at most 10 reads at once and 2 a
// second after (certs/http.go, unnamedChallengeBurst and Rate), however
// many hosts ask; a named host's still reads its token.
func TestChallengeFloodForUnnamedHostsCostsBoundedNodeReads(t *testing.T) {
	_, acmeArgs := acmeEdge(t)
	a := app(t, "A")
	n := nodetest.New(t, nodetest.Options{Token: "fleet-token"})
	n.SetDocument(&node.Document{V: 1, Routes: []node.Route{
		{Host: "shop.example", Application: "shop", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(a)}}},
	}})
	// Without prefetch, whose turns read the store in the background.
	e := startEdge(t, append(acmeArgs, "--node", n.URL(), "--ingress-token", "fleet-token", "--state-dir", t.TempDir(),
		"--cert-store", "fleet", "--cert-prefetch=false")...)
	testsupport.WaitForNil(t, 15*time.Second, "first document", func() error {
		if code, _ := e.get(t, "nobody.example", "/"); code != 404 {
			return fmt.Errorf("status %d", code)
		}
		return nil
	})
	paths := []string{"/.well-known/scafo-edge/reach/0123456789abcdef0123456789abcdef", "/.well-known/acme-challenge/evaGxfADs6pSRb2LAv9IZf17Dt3juxGJ-PCt92wr-oA"}
	reads := func() int { c := n.StorageCounts(); return c.Gets + c.Stats + c.Lists }
	// A named host's token not found is redirected to HTTPS: not followed.
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	get := func(host, path string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "http://"+e.HTTPAddr+path, nil)
		req.Host = host
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET http://%s%s: %v", host, path, err)
		}
		resp.Body.Close()
	}
	before, start := reads(), time.Now()
	for i := range 150 {
		for _, p := range paths {
			get(fmt.Sprintf("stranger%d.example", i), p)
		}
	}
	if got, bound := reads()-before, 10+2*int(math.Ceil(time.Since(start).Seconds())); got > bound {
		t.Errorf("300 challenge requests for hosts the document does not name cost %d storage reads at the node, want at most %d", got, bound)
	}
	for _, p := range paths {
		before := reads()
		get("shop.example", p)
		if got := reads() - before; got == 0 {
			t.Errorf("GET http://shop.example%s read nothing at the node, want its token looked up", p)
		}
	}
}
