package e2e

import (
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
	"github.com/scafo/scafo-edge/node/nodetest"
)

// returningVisitor is a client that keeps its TLS sessions, as a browser
// does, and opens a new connection for every request.
type returningVisitor struct {
	tr *http.Transport
}

func newReturningVisitor(t *testing.T) *returningVisitor {
	tr := &http.Transport{DisableKeepAlives: true, TLSClientConfig: &tls.Config{
		// The session cache is keyed by server name: one name, whichever
		// edge the connection reaches.
		ServerName:         "shop.example",
		InsecureSkipVerify: true, // the internal CA's certificate; resumption is what is tested
		ClientSessionCache: tls.NewLRUClientSessionCache(8),
	}}
	t.Cleanup(tr.CloseIdleConnections)
	return &returningVisitor{tr: tr}
}

// visit requests / from the edge at httpsAddr and reports whether the TLS
// session was resumed.
func (v *returningVisitor) visit(t *testing.T, httpsAddr string) bool {
	t.Helper()
	req, _ := http.NewRequest("GET", "https://"+httpsAddr+"/", nil)
	req.Host = "shop.example"
	resp, err := (&http.Client{Transport: v.tr, Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("GET via %s: %v", httpsAddr, err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET via %s: %d", httpsAddr, resp.StatusCode)
	}
	return resp.TLS.DidResume
}

func shopNode(t *testing.T) *nodetest.Node {
	a := app(t, "A")
	n := nodetest.New(t, nodetest.Options{})
	n.SetDocument(&node.Document{V: 1, Routes: []node.Route{
		{Host: "shop.example", Application: "shop", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(a)}}},
	}})
	return n
}

// TestSessionResumesAfterAnUpgrade: the session ticket keys travel with the
// listening sockets, so a visitor who connected to the old edge resumes
// on the new one instead of paying a full handshake.
func TestSessionResumesAfterAnUpgrade(t *testing.T) {
	n := shopNode(t)
	httpPort, httpsPort, adminPort := testsupport.FreePort(t), testsupport.FreePort(t), testsupport.FreePort(t)
	args := []string{"serve", "--node", n.URL(), "--poll-interval", "100ms", "--state-dir", t.TempDir(),
		"--tls", "internal", "--cert-store", "local", "--shutdown-timeout", "2s",
		"--http-addr", fmt.Sprintf("127.0.0.1:%d", httpPort), "--https-addr", fmt.Sprintf("127.0.0.1:%d", httpsPort),
		"--admin-addr", fmt.Sprintf("127.0.0.1:%d", adminPort)}
	old := startEdgeBinary(t, edgeBinary, nil, args...)
	waitEdgeReady(t, old)
	v := newReturningVisitor(t)
	if v.visit(t, old.HTTPSAddr) {
		t.Fatal("the first visit resumed a session")
	}
	if !v.visit(t, old.HTTPSAddr) {
		t.Fatal("the second visit to the same edge did not resume")
	}

	newEdge := startEdgeBinary(t, edgeBinary, nil, args...)
	select {
	case <-old.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("old edge still running after the new one started\n%s", old.logText())
	}
	if !v.visit(t, newEdge.HTTPSAddr) {
		t.Errorf("the visit after the upgrade did not resume: the new edge lacks the old one's ticket keys\n%s", newEdge.logText())
	}
	for result, want := range map[string]float64{"known": 1, "unknown": 0} {
		if got := newEdge.metric(t, "scafo_edge_tls_tickets_presented_total", testsupport.Labels{"result": result}); got != want {
			t.Errorf(`new edge's scafo_edge_tls_tickets_presented_total{result=%q} = %v, want %v`, result, got, want)
		}
	}
}

// TestSessionResumesOnAnotherEdgeOfTheFleet: two edges of one fleet store
// share their ticket keys through it, so a session begun on one resumes
// on the other.
func TestSessionResumesOnAnotherEdgeOfTheFleet(t *testing.T) {
	n := shopNode(t)
	args := []string{"--node", n.URL(), "--tls", "internal", "--cert-store", "fleet"}
	first := startEdge(t, args...)
	waitEdgeReady(t, first)
	second := startEdge(t, args...)
	waitEdgeReady(t, second)
	v := newReturningVisitor(t)
	if v.visit(t, first.HTTPSAddr) {
		t.Fatal("the first visit resumed a session")
	}
	if !v.visit(t, second.HTTPSAddr) {
		t.Errorf("a session begun on one edge of the fleet did not resume on the other\n%s", second.logText())
	}
}
