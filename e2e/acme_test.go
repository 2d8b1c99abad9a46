package e2e

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/certs/certstest"
	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
	"github.com/scafo/scafo-edge/node/nodetest"
)

// TestACMEThroughTheBinary obtains a certificate from Pebble through the
// real binary, with the decision taken from the live document (docs/design.md
// rule 8), and serves it again after a restart with no new order.
func TestACMEThroughTheBinary(t *testing.T) {
	httpPort, httpsPort := testsupport.FreePort(t), testsupport.FreePort(t)
	p := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: httpPort, TLSPort: httpsPort})
	rootFile := pebbleRootFile(t, p)
	a := app(t, "A")
	n := nodetest.New(t, nodetest.Options{})
	n.SetDocument(&node.Document{V: 1, Routes: []node.Route{
		{Host: "shop.example", Application: "shop", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(a)}}},
		{Host: "*.tenant.example", Application: "tenant", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(a)}}},
	}})
	state := t.TempDir()
	args := []string{"--node", n.URL(), "--tls", "acme", "--acme-ca", p.DirectoryURL, "--acme-ca-root", rootFile,
		"--state-dir", state,
		"--http-addr", fmt.Sprintf("127.0.0.1:%d", httpPort), "--https-addr", fmt.Sprintf("127.0.0.1:%d", httpsPort)}
	e := startEdge(t, args...)
	testsupport.WaitForNil(t, 15*time.Second, "first document", func() error {
		if code, _ := e.get(t, "nobody.example", "/"); code != 404 {
			return fmt.Errorf("status %d", code)
		}
		return nil
	})
	roots := p.IssuerRoots(t)
	httpsGet := func(host string) (int, string, error) {
		c := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: host},
		}}
		defer c.CloseIdleConnections()
		req, _ := http.NewRequest("GET", fmt.Sprintf("https://127.0.0.1:%d/tls", httpsPort), nil)
		req.Host = host
		resp, err := c.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		serial := ""
		if resp.TLS != nil && len(resp.TLS.PeerCertificates) > 0 {
			serial = resp.TLS.PeerCertificates[0].SerialNumber.String()
		}
		if !strings.HasPrefix(string(b), "A /tls") {
			return resp.StatusCode, serial, fmt.Errorf("body %q", b)
		}
		return resp.StatusCode, serial, nil
	}

	code, serial, err := httpsGet("shop.example")
	if err != nil || code != 200 {
		t.Fatalf("first HTTPS request for a document-named host: %d %v\n%s", code, err, e.logText())
	}
	p.WaitOrderCount(t, 1)
	if _, again, err := httpsGet("shop.example"); err != nil || again != serial {
		t.Errorf("second request: serial %s err %v, want the same certificate %s", again, err, serial)
	}
	for _, name := range []string{"stranger.example", "x.tenant.example"} {
		if _, _, err := httpsGet(name); err == nil {
			t.Errorf("handshake for %s succeeded, want it refused", name)
		}
	}
	if got := p.OrderCount(); got != 1 {
		t.Errorf("Pebble orders = %d, want 1: names the document does not name exactly must place none", got)
	}
	status, _ := rawHTTP(t, e.HTTPAddr, "GET /x HTTP/1.1\r\nHost: shop.example\r\n\r\n")
	if status != http.StatusPermanentRedirect {
		t.Errorf("plain HTTP for a certifiable host: %d, want 308", status)
	}
	if status, _ := rawHTTP(t, e.HTTPAddr, "GET /x HTTP/1.1\r\nHost: y.tenant.example\r\n\r\n"); status != 200 {
		t.Errorf("plain HTTP for a wildcard host without a certificate: %d, want proxied (200)", status)
	}

	if err := e.stop(t); err != nil {
		t.Fatalf("exit: %v", err)
	}
	startEdge(t, args...)
	_, serial2, err := httpsGet("shop.example")
	if err != nil || serial2 != serial {
		t.Errorf("after restart: serial %s err %v, want %s from bbolt", serial2, err, serial)
	}
	if got := p.OrderCount(); got != 1 {
		t.Errorf("Pebble orders after restart = %d, want still 1", got)
	}
}

// TestFleetStoreThroughTheBinary: two edges polling one node share its
// certificate store (the default with --node). Asked for the same new name at
// the same moment, they place one ACME order between them and serve the same
// certificate. Both bind the same ports, on 127.0.0.1 and 127.0.0.2; Pebble
// validates at 127.0.0.1, whichever edge started the order, because
// challenge tokens live in the shared store.
func TestFleetStoreThroughTheBinary(t *testing.T) {
	httpPort, httpsPort := testsupport.FreePort(t), testsupport.FreePort(t)
	p := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: httpPort, TLSPort: httpsPort})
	rootFile := pebbleRootFile(t, p)
	a := app(t, "A")
	n := nodetest.New(t, nodetest.Options{Token: "fleet-token"})
	n.SetDocument(&node.Document{V: 1, Routes: []node.Route{
		{Host: "shared.example", Application: "shared", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(a)}}},
	}})
	var edges []*runningEdge
	for _, ip := range []string{"127.0.0.1", "127.0.0.2"} {
		e := startEdge(t, "--node", n.URL(), "--ingress-token", "fleet-token", "--tls", "acme",
			"--acme-ca", p.DirectoryURL, "--acme-ca-root", rootFile,
			"--http-addr", fmt.Sprintf("%s:%d", ip, httpPort), "--https-addr", fmt.Sprintf("%s:%d", ip, httpsPort))
		edges = append(edges, e)
	}
	for _, e := range edges {
		testsupport.WaitForNil(t, 15*time.Second, "first document", func() error {
			if code, _ := e.get(t, "nobody.example", "/"); code != 404 {
				return fmt.Errorf("status %d", code)
			}
			return nil
		})
	}
	roots := p.IssuerRoots(t)
	serials := make(chan string, len(edges))
	for _, e := range edges {
		go func() {
			conn, err := tls.Dial("tcp", e.HTTPSAddr, &tls.Config{RootCAs: roots, ServerName: "shared.example"})
			if err != nil {
				serials <- "error: " + err.Error()
				return
			}
			defer conn.Close()
			serials <- conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
		}()
	}
	first, second := <-serials, <-serials
	if strings.HasPrefix(first, "error") || first != second {
		t.Fatalf("the two edges served %q and %q, want one certificate\n%s\n%s", first, second, edges[0].logText(), edges[1].logText())
	}
	p.WaitOrderCount(t, 1)
	if got := p.OrderCount(); got != 1 {
		t.Errorf("Pebble orders = %d for two edges asking at once, want 1", got)
	}
	t.Logf("figures: 2 edges (binaries) sharing the fleet store, asked for one new name at once: %d ACME order(s), serial %s", p.OrderCount(), first)
}
