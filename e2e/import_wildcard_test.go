package e2e

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/certs/certstest"
	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
	"github.com/scafo/scafo-edge/node/nodetest"
)

// TestImportedWildcardRenewedByDNS01 is issue 47 item 5 through the
// binary: a "*.example.test" certificate imported from Traefik, due for
// renewal, is renewed by DNS-01 (rfc2136 into a real BIND, Pebble
// validating through it) by an edge started with --dns-provider and a
// document naming "*.example.test", with no --wildcard-domains. The
// import says so (and warns without a provider); a held wildcard the
// document does not name is never ordered, nor is the bare base; the
// challenge record is gone afterwards; status.json flags the wildcard
// not renewed only once the document drops its key.
func TestImportedWildcardRenewedByDNS01(t *testing.T) {
	bind := certstest.StartBIND(t, certstest.BINDConfig{Zones: map[string][]string{"example.test": nil}})
	httpPort, httpsPort := testsupport.FreePort(t), testsupport.FreePort(t)
	p := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: httpPort, TLSPort: httpsPort, DNSServer: bind.Addr})
	rootFile := pebbleRootFile(t, p)
	t.Setenv("RFC2136_NAMESERVER", bind.Addr)
	t.Setenv("RFC2136_TSIG_KEY", bind.KeyName)
	t.Setenv("RFC2136_TSIG_SECRET", bind.KeySecret)
	t.Setenv("RFC2136_TSIG_ALGORITHM", "hmac-sha256")

	// Valid for 70 minutes, 10 left: due by certmagic's renewal window
	// (the last third). A lab CA's, imported with --allow-untrusted.
	ca := newIssueCA(t)
	lapse := time.Now().Add(10 * time.Minute)
	wild := ca.issue(t, lapse, "*.example.test")
	unnamed := ca.issue(t, lapse, "*.unnamed.test")
	acmeFile := writeAcmeJSON(t, map[string][]map[string]any{"dns": {
		traefikEntry("*.example.test", wild), traefikEntry("*.unnamed.test", unnamed),
	}})
	state := t.TempDir()
	store := []string{"--cert-store", "local", "--state-dir", state, "--acme-ca", p.DirectoryURL, "--allow-untrusted"}

	out, err := runImport(t, append([]string{"traefik", acmeFile}, store...)...)
	if err != nil {
		t.Fatalf("import without a provider: %v", err)
	}
	if !strings.Contains(out, `warning    "*.example.test": no DNS-01 provider renews it`) || strings.Contains(out, "renewed    ") {
		t.Errorf("import without --dns-provider does not warn that nothing renews the wildcard:\n%s", out)
	}
	out, err = runImport(t, append([]string{"traefik", acmeFile, "--dns-provider", "rfc2136"}, store...)...)
	if err != nil {
		t.Fatalf("import with a provider: %v", err)
	}
	for _, want := range []string{
		`renewed    "*.example.test": by DNS-01 (--dns-provider rfc2136)`,
		`renewed    "*.unnamed.test": by DNS-01 (--dns-provider rfc2136)`,
		"2 certificates: 0 imported, 2 unchanged, 0 kept, 0 refused",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("import with --dns-provider lacks %q", want)
		}
	}
	if strings.Contains(out, "warning ") {
		t.Errorf("import with --dns-provider still warns:\n%s", out)
	}

	a := app(t, "A")
	n := nodetest.New(t, nodetest.Options{})
	wildRoute := node.Route{Host: "*.example.test", Application: "wild", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(a)}}}
	other := node.Route{Host: "shop.other.test", Application: "shop", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(a)}}}
	n.SetDocument(&node.Document{V: 1, Routes: []node.Route{wildRoute, other}})

	orders := p.OrderCount()
	e := startEdge(t, "--node", n.URL(), "--cert-store", "local", "--state-dir", state, "--tls", "acme",
		"--acme-ca", p.DirectoryURL, "--acme-ca-root", rootFile, "--cert-prefetch=false",
		"--dns-provider", "rfc2136", "--dns-resolvers", bind.Addr, "--dns-propagation-timeout", "30s",
		"--http-addr", fmt.Sprintf("127.0.0.1:%d", httpPort), "--https-addr", fmt.Sprintf("127.0.0.1:%d", httpsPort))
	httpsAddr := fmt.Sprintf("127.0.0.1:%d", httpsPort)
	roots := p.IssuerRoots(t)

	var renewed string
	testsupport.WaitForNil(t, 90*time.Second, "*.example.test renewed by Pebble", func() error {
		leaf, err := dns01Leaf(httpsAddr, "x.example.test", roots)
		if err != nil {
			return err
		}
		if !slices.Equal(leaf.DNSNames, []string{"*.example.test"}) {
			return fmt.Errorf("served names %v", leaf.DNSNames)
		}
		renewed = leaf.SerialNumber.String()
		return nil
	})
	if renewed == wild.serial {
		t.Errorf("served serial %s is the imported one", renewed)
	}
	t.Logf("imported serial %s, served after renewal %s", wild.serial, renewed)
	if code, body := httpsGetBody(t, httpsAddr, "shop.example.test", roots); code != 200 || !strings.HasPrefix(body, "A /") {
		t.Errorf("GET https://shop.example.test = %d %q, want 200 from the wildcard route", code, body)
	}
	p.WaitOrderCount(t, orders+1)
	testsupport.WaitForNil(t, 10*time.Second, "no TXT at _acme-challenge.example.test", func() error {
		if got := bind.TXT(t, "_acme-challenge.example.test"); len(got) > 0 {
			return fmt.Errorf("TXT = %q", got)
		}
		return nil
	})
	for _, want := range []string{"wildcard certificate from storage renewed by DNS-01 (--dns-provider rfc2136)", "certificate renewed successfully"} {
		if !e.logged(want) {
			t.Errorf("the edge did not log %q", want)
		}
	}
	if e.logged("wildcard certificate from storage served without renewal") {
		t.Errorf("the edge logged the renewed wildcard as not renewed")
	}
	if listed, flagged := certNotRenewed(t, e, "*.example.test"); !listed || flagged {
		t.Errorf("status.json: *.example.test listed %v, not_renewed %v; want listed and renewed", listed, flagged)
	}
	// Nothing for the held wildcard the document does not name, nor the
	// bare base: the one order is the renewal.
	if got := p.OrderCount() - orders; got != 1 {
		t.Errorf("Pebble orders = %d, want 1 (the renewal of *.example.test alone)", got)
	}

	t.Run("a key the document drops is no longer renewed", func(t *testing.T) {
		n.SetDocument(&node.Document{V: 1, Routes: []node.Route{other}})
		testsupport.WaitForNil(t, 20*time.Second, "status.json flagging *.example.test not renewed", func() error {
			if listed, flagged := certNotRenewed(t, e, "*.example.test"); !listed || !flagged {
				return fmt.Errorf("listed %v, not_renewed %v", listed, flagged)
			}
			return nil
		})
		if !e.logged("wildcard route key left the routing document") {
			t.Errorf("the edge did not log the release")
		}
	})
	if err := e.stop(t); err != nil {
		t.Fatalf("exit: %v", err)
	}
	if got := p.OrderCount() - orders; got != 1 {
		t.Errorf("Pebble orders = %d at the end, want 1", got)
	}
}

// certNotRenewed reports whether the edge's status.json lists a
// certificate for name, and whether it flags it not renewed.
func certNotRenewed(t *testing.T, e *runningEdge, name string) (listed, notRenewed bool) {
	t.Helper()
	_, body := e.admin(t, "/status.json")
	var st struct {
		Certificates []struct {
			Names      []string `json:"names"`
			NotRenewed bool     `json:"not_renewed"`
		} `json:"certificates"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("status.json: %v", err)
	}
	for _, c := range st.Certificates {
		if slices.Contains(c.Names, name) {
			listed = true
			notRenewed = notRenewed || c.NotRenewed
		}
	}
	return listed, notRenewed
}
