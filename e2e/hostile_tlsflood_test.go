package e2e

// A flood of TLS handshakes for names nobody serves, against the real
// binary and Pebble on loopback: it must cost no ACME order and no write to
// the state file (compared with the snapshots of state_snapshot_test.go).

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/certs/certstest"
	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

// TestTLSHandshakeFloodWithRandomNames sends a few hundred TLS handshakes
// for names the document does not name (random ones, subdomains of a named
// host, names a wildcard route covers): none completes, Pebble receives no
// ACME order, nothing is written to the state file, and each costs little
// CPU. A handshake for the named host then gets a certificate from the same
// Pebble (one order), so the zero is not vacuous.
func TestTLSHandshakeFloodWithRandomNames(t *testing.T) {
	httpPort, httpsPort := testsupport.FreePort(t), testsupport.FreePort(t)
	p := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: httpPort, TLSPort: httpsPort})
	dir := t.TempDir()
	caRoot := filepath.Join(dir, "pebble-root.pem")
	mustNil(t, os.WriteFile(caRoot, p.RootPEM, 0o600))
	a := app(t, "A")
	routes := writeRoutesFile(t, dir, &node.Document{V: 1, Routes: []node.Route{
		{Host: "named.example", Application: "a", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(a)}}},
		{Host: "*.wild.example", Application: "a", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(a)}}},
	}})
	state := t.TempDir()
	// Prefetch off: its own turn for named.example (a lock, a reachability
	// token) writes the state file whenever it comes, and this test holds
	// the flood to writing nothing.
	e := startEdge(t, "--routes-file", routes, "--tls", "acme", "--acme-ca", p.DirectoryURL, "--acme-ca-root", caRoot, "--state-dir", state,
		"--http-addr", fmt.Sprintf("127.0.0.1:%d", httpPort), "--https-addr", fmt.Sprintf("127.0.0.1:%d", httpsPort), "--cert-prefetch=false")
	waitEdgeReady(t, e)
	dbPath := filepath.Join(state, node.StateFile)
	waitDocumentPersisted(t, dbPath) // the edge's own write after start, not the flood's
	storeBefore := stateSnapshot(t, dbPath)
	refusalsBefore := e.metric(t, "scafo_edge_tls_on_demand_refusals_total", testsupport.Labels{"reason": "not_named"})
	cpuBefore := e.metric(t, "process_cpu_seconds_total", nil)

	randomName := func(i int) string {
		b := make([]byte, 6)
		rand.Read(b)
		r := hex.EncodeToString(b)
		switch i % 4 {
		case 0:
			return r + ".example"
		case 1:
			return r + ".named.example"
		case 2:
			return r + ".wild.example" // routed by the wildcard, never certified (rule 8)
		default:
			return "a" + r + "." + r[:4] + ".test"
		}
	}
	const handshakes, workers = 400, 8
	var tried, completed atomic.Int64
	var wg sync.WaitGroup
	next := make(chan int)
	go func() {
		for i := range handshakes {
			next <- i
		}
		close(next)
	}()
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 30 * time.Second}, Config: &tls.Config{ServerName: randomName(i), InsecureSkipVerify: true}}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				c, err := d.DialContext(ctx, "tcp", e.HTTPSAddr)
				cancel()
				tried.Add(1)
				if err == nil {
					completed.Add(1)
					c.Close()
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := e.metric(t, "process_cpu_seconds_total", nil) - cpuBefore
	refusals := e.metric(t, "scafo_edge_tls_on_demand_refusals_total", testsupport.Labels{"reason": "not_named"}) - refusalsBefore
	storeDiff := diffSnapshots(storeBefore, stateSnapshot(t, dbPath))
	storeChanged := len(storeDiff) > 0
	orders := p.OrderCount()
	perHandshake := time.Duration(cpu / float64(handshakes) * float64(time.Second))

	// The control: the name the document does name gets a certificate.
	d := &tls.Dialer{Config: &tls.Config{ServerName: "named.example", RootCAs: p.IssuerRoots(t)}}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", e.HTTPSAddr)
	if err != nil {
		t.Fatalf("control handshake for named.example: %v", err)
	}
	c.Close()
	p.WaitOrderCount(t, 1)

	t.Logf("figures: TLS handshake flood: %d handshakes tried with random SNI names in %v, %d completed, %.0f on-demand refusals, %d ACME orders placed, state file changed: %v; CPU %.3fs in all, %v per handshake (race-enabled build); control handshake for the named host: 1 order, certificate served",
		tried.Load(), elapsed.Round(time.Millisecond), completed.Load(), refusals, orders, storeChanged, cpu, perHandshake)
	if completed.Load() != 0 {
		t.Errorf("%d handshakes for names nobody serves completed", completed.Load())
	}
	if orders != 0 {
		t.Errorf("the flood placed %d ACME orders", orders)
	}
	if storeChanged {
		t.Errorf("the flood wrote to the state file: %v", storeDiff)
	}
	if refusals < handshakes {
		t.Errorf("%.0f on-demand refusals counted for %d handshakes", refusals, handshakes)
	}
	// A refused handshake costs a ClientHello parse and a map lookup; even
	// race-enabled on a loaded machine that is well under this bound.
	if perHandshake > 20*time.Millisecond {
		t.Errorf("%v of CPU per refused handshake", perHandshake)
	}
}
