package certs

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/certs/certstest"
)

// BenchmarkTLSHandshake measures full handshakes (no session resumption)
// against the HTTPS listener on loopback, with a certificate already held.
//
//	go test -run '^$' -bench TLSHandshake -benchtime 3s ./certs/
func BenchmarkTLSHandshake(b *testing.B) {
	e := newTestEdge(b)
	m := e.start(b, b.TempDir(), Options{Mode: ModeInternal, Allowed: newNameSet("bench.test").Allowed})
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(m.InternalRootPEM())
	if _, err := e.handshake("bench.test", roots); err != nil {
		b.Fatalf("warm-up handshake: %v", err)
	}
	cfg := &tls.Config{ServerName: "bench.test", RootCAs: roots, SessionTicketsDisabled: true, NextProtos: []string{"http/1.1"}}
	addr := e.httpsLn.Addr().String()
	handshake := func() error {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
		if err != nil {
			return err
		}
		if conn.ConnectionState().DidResume {
			return fmt.Errorf("session resumed")
		}
		return conn.Close()
	}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := handshake(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "handshakes/s")
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := handshake(); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "handshakes/s")
	})
}

// BenchmarkFirstRequestNewName measures the time to first byte of the first
// HTTPS request for a name the edge has no certificate for yet, issued by
// Pebble on loopback (HTTP-01 or TLS-ALPN-01, no validation sleep).
//
//	go test -run '^$' -bench FirstRequestNewName -benchtime 10x ./certs/
func BenchmarkFirstRequestNewName(b *testing.B) {
	e := newTestEdge(b)
	pb := certstest.StartPebble(b, certstest.PebbleConfig{HTTPPort: e.httpPort, TLSPort: e.httpsPort})
	names := newNameSet()
	e.start(b, b.TempDir(), Options{Allowed: names.Allowed, CA: pb.DirectoryURL, CARoot: string(pb.RootPEM)})
	roots := pb.IssuerRoots(b)
	// The first issuance also registers the ACME account; keep it out.
	names.set("warmup.test", true)
	if _, _, _, err := e.get("warmup.test", "/", roots); err != nil {
		b.Fatalf("warm-up: %v", err)
	}
	var total time.Duration
	i := 0
	for b.Loop() {
		i++
		name := fmt.Sprintf("n%d.bench.test", i)
		names.set(name, true)
		status, _, ttfb, err := e.get(name, "/", roots)
		if err != nil || status != 200 {
			b.Fatalf("GET %s = %d, %v", name, status, err)
		}
		total += ttfb
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms-to-first-byte")
}
