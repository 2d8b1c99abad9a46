package e2e

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/certs/certstest"
	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
	"github.com/scafo/scafo-edge/node/nodetest"
)

// An operator's host is a named host (issue 45 item 5): its certificate
// comes from the CA on its first HTTPS visit, in one order, exactly as a
// node host's does; an operator wildcard approves none, and a name neither
// source names places no order.
func TestOperatorHostGetsItsCertificateInOneOrder(t *testing.T) {
	httpPort, httpsPort := testsupport.FreePort(t), testsupport.FreePort(t)
	p := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: httpPort, TLSPort: httpsPort})
	rootFile := pebbleRootFile(t, p)
	a, g := app(t, "A"), app(t, "GRAFANA")
	n := nodetest.New(t, nodetest.Options{})
	n.SetDocument(&node.Document{V: 1, Routes: []node.Route{
		{Host: "shop.example", Application: "shop", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(a)}}},
	}})
	opPath := filepath.Join(t.TempDir(), "operator.json")
	writeOperatorFile(t, opPath, fmt.Sprintf(`{"v": 1, "routes": [
  {"host": "grafana.ops.example", "upstreams": [{"address": %q}]},
  {"host": "*.tools.example", "upstreams": [{"address": %q}]}
]}`, hostOf(g), hostOf(g)))
	e := startEdge(t, "--node", n.URL(), "--tls", "acme", "--acme-ca", p.DirectoryURL, "--acme-ca-root", rootFile,
		"--operator-routes", opPath, "--cert-prefetch=false",
		"--http-addr", fmt.Sprintf("127.0.0.1:%d", httpPort), "--https-addr", fmt.Sprintf("127.0.0.1:%d", httpsPort))
	waitEdgeReady(t, e)
	roots := p.IssuerRoots(t)
	httpsGet := func(host string) (string, error) {
		c := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: host},
		}}
		defer c.CloseIdleConnections()
		req, _ := http.NewRequest("GET", fmt.Sprintf("https://127.0.0.1:%d/dash", httpsPort), nil)
		req.Host = host
		resp, err := c.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b), nil
	}
	body, err := httpsGet("grafana.ops.example")
	if err != nil || !strings.HasPrefix(body, "GRAFANA /dash") {
		t.Fatalf("first HTTPS request to the operator's host: %q, %v\n%s", body, err, e.logText())
	}
	p.WaitOrderCount(t, 1)
	for _, name := range []string{"x.tools.example", "stranger.example"} {
		if _, err := httpsGet(name); err == nil {
			t.Errorf("handshake for %s succeeded, want it refused", name)
		}
	}
	if got := p.OrderCount(); got != 1 {
		t.Errorf("Pebble orders = %d, want 1: one for the operator's host, none for a wildcard or a stranger", got)
	}
}
