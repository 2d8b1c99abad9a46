package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/scafo/scafo-edge/node"
)

// TestDeniedPrefixSpellingsThroughTheBinary sends the spellings of the API
// apex's denied prefixes that a common server reads as the denied path
// (issue 50): a fragment, which RFC 9112 allows in no request target and
// Node's URL parser, Python's urlsplit and Rust's http::Uri drop, is 400;
// a NUL, a space, a tab or a trailing dot after the prefix is 403. Over
// HTTP/1.1 in plain and in TLS, HTTP/2 and HTTP/3, and none of them reaches
// the API; a plain API path does.
func TestDeniedPrefixSpellingsThroughTheBinary(t *testing.T) {
	api := newRecordingUpstream(t, "API")
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{},
		API: &node.API{Hosts: []string{"apps.example"}, Upstreams: []node.Upstream{{Node: "n", Address: api.addr}}}})
	plain := startEdge(t, "--routes-file", routes, "--tls", "off")
	secure := startEdge(t, "--routes-file", routes, "--tls", "internal")
	waitEdgeReady(t, plain)
	waitEdgeReady(t, secure)
	roots := x509.NewCertPool()
	pem, err := os.ReadFile(filepath.Join(secure.StateDir, internalRootFile))
	if err != nil || !roots.AppendCertsFromPEM(pem) {
		t.Fatalf("internal root: %v", err)
	}
	tlsConf := &tls.Config{RootCAs: roots, ServerName: "apps.example"}
	h2 := &http.Transport{TLSClientConfig: tlsConf.Clone(), ForceAttemptHTTP2: true}
	h3 := &http3.Transport{TLSClientConfig: tlsConf.Clone(),
		Dial: func(ctx context.Context, _ string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
			return quic.DialAddr(ctx, secure.HTTPSAddr, tc, qc)
		}}
	t.Cleanup(func() {
		h2.CloseIdleConnections()
		h3.Close()
	})
	// roundTrip sends target byte for byte as the :path.
	roundTrip := func(rt http.RoundTripper, target string) (int, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "https://apps.example/", nil)
		req.URL.Host = secure.HTTPSAddr
		req.URL.Opaque = target
		req.Host = "apps.example"
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatalf("%s: %v", target, err)
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Proto
	}
	protocols := []struct {
		name string
		send func(target string) int
	}{
		{"HTTP/1.1", func(target string) int {
			st, _ := rawExchange(t, plain.HTTPAddr, "", "GET "+target+" HTTP/1.1\r\nHost: apps.example\r\nConnection: close\r\n\r\n")
			return st
		}},
		{"HTTP/1.1 over TLS", func(target string) int {
			st, _ := rawExchange(t, secure.HTTPSAddr, "apps.example", "GET "+target+" HTTP/1.1\r\nHost: apps.example\r\nConnection: close\r\n\r\n")
			return st
		}},
		{"HTTP/2", func(target string) int {
			st, proto := roundTrip(h2, target)
			if proto != "HTTP/2.0" {
				t.Fatalf("%s went over %s, want HTTP/2.0", target, proto)
			}
			return st
		}},
		{"HTTP/3", func(target string) int {
			st, _ := roundTrip(h3, target)
			return st
		}},
	}
	cases := []struct {
		target string
		status int
	}{
		{"/v1/apps", 200},
		{"/v1/ingress/routes#x", 400},
		{"/v1/storage#/../x", 400},
		{"/v1/apps#x", 400},
		{"/v1/storage%00", 403},
		{"/v1/storage%00/objects/k1", 403},
		{"/v1/storage%20", 403},
		{"/v1/storage%09", 403},
		{"/v1/storage.", 403},
		{"/v1/storage./objects/k1", 403},
		{"/v1/ingress/routes%2e%20", 403},
		{"/v1/storage%23x", 403},
		{"/v1/storage%3fx", 403},
		{"/v1/storage%0d", 403},
		{"/v1/storage%c2%a0", 403},
		{"/v1/x/..%20/storage", 403},
	}
	for _, p := range protocols {
		t.Run(p.name, func(t *testing.T) {
			for _, c := range cases {
				before := api.count()
				got := p.send(c.target)
				if got != c.status {
					t.Errorf("%s: status %d, want %d", c.target, got, c.status)
				}
				want := 0
				if c.status == 200 {
					want = 1
				}
				if n := api.count() - before; n != want {
					t.Errorf("%s: the API received %d requests, want %d", c.target, n, want)
				}
			}
		})
	}
	if n := api.count(); n != len(protocols) {
		t.Errorf("the API received %d requests in all, want %d (the plain path once a protocol)", n, len(protocols))
	}
}
