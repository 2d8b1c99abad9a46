package main

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/quic-go/quic-go/http3"
	bolt "go.etcd.io/bbolt"

	"github.com/scafo/scafo-edge/certs"
	"github.com/scafo/scafo-edge/internal/testsupport"
)

// TestSettingsAreTheEdges holds the floor to scafo-edge's own HTTPS
// listener settings, so that the go-tls row stays the floor of the edge's
// handshakes and not of some other configuration.
func TestSettingsAreTheEdges(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "edge.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	m, err := certs.New(context.Background(), certs.Options{Mode: certs.ModeInternal, DB: db})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	edge := m.TLSConfig()
	cert, _ := testsupport.SelfSigned(t)
	floor := tlsConfig(cert)

	// acme-tls/1 answers ACME challenges only; no benchmark client offers it.
	edgeProtos := slices.DeleteFunc(slices.Clone(edge.NextProtos), func(p string) bool { return p == "acme-tls/1" })
	for _, c := range []struct {
		what        string
		edge, floor any
	}{
		{"MinVersion", edge.MinVersion, floor.MinVersion},
		{"MaxVersion", edge.MaxVersion, floor.MaxVersion},
		{"CipherSuites", edge.CipherSuites, floor.CipherSuites},
		{"CurvePreferences", edge.CurvePreferences, floor.CurvePreferences},
		{"NextProtos but acme-tls/1", edgeProtos, floor.NextProtos},
		{"SessionTicketsDisabled", edge.SessionTicketsDisabled, floor.SessionTicketsDisabled},
		{"ClientAuth", edge.ClientAuth, floor.ClientAuth},
	} {
		if !equal(c.edge, c.floor) {
			t.Errorf("%s: the edge has %v, the floor %v", c.what, c.edge, c.floor)
		}
	}
}

func equal(a, b any) bool {
	switch a := a.(type) {
	case []uint16:
		return slices.Equal(a, b.([]uint16))
	case []tls.CurveID:
		return slices.Equal(a, b.([]tls.CurveID))
	case []string:
		return slices.Equal(a, b.([]string))
	}
	return a == b
}

// TestServes: the 1 KiB body over HTTPS (HTTP/1.1 and h2) and HTTP/3, a
// session resumed on a second connection, a CBC-only TLS 1.2 client
// refused as the edge refuses it, and 404 off the two paths.
func TestServes(t *testing.T) {
	// ECDSA P-256 for localhost: the key type of the benchmark's
	// certificate and of the edge's internal CA.
	cert, roots := testsupport.SelfSigned(t)
	s, err := listen("127.0.0.1:0", cert, true)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	addr := s.tcp.Addr().String()
	base := "https://" + addr

	cache := tls.NewLRUClientSessionCache(4)
	for i, c := range []struct {
		name      string
		h2        bool
		path      string
		wantProto string
		wantCode  int
		wantLen   int
	}{
		{"HTTP/1.1", false, "/1k", "HTTP/1.1", 200, 1024},
		{"h2", true, "/1k", "HTTP/2.0", 200, 1024},
		{"1 MiB", false, "/1m", "HTTP/1.1", 200, 1 << 20},
		{"elsewhere", false, "/nothing", "HTTP/1.1", 404, -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := &http.Transport{
				TLSClientConfig:   &tls.Config{ServerName: "localhost", RootCAs: roots, ClientSessionCache: cache},
				ForceAttemptHTTP2: c.h2,
				DisableKeepAlives: true,
			}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Get(base + c.path)
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatal(err)
			}
			if resp.Proto != c.wantProto || resp.StatusCode != c.wantCode || (c.wantLen >= 0 && len(b) != c.wantLen) {
				t.Errorf("%s %d, %d bytes; want %s %d, %d bytes", resp.Proto, resp.StatusCode, len(b), c.wantProto, c.wantCode, c.wantLen)
			}
			// Every request is a new connection; from the second on it
			// offers the ticket the first one got.
			if resumed := resp.TLS.DidResume; resumed != (i > 0) {
				t.Errorf("connection %d resumed: %v, want %v", i, resumed, i > 0)
			}
		})
	}

	t.Run("TLS 1.2 CBC only is refused", func(t *testing.T) {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", addr, &tls.Config{
			ServerName: "localhost", RootCAs: roots, MaxVersion: tls.VersionTLS12,
			CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA},
		})
		if err == nil {
			conn.Close()
			t.Fatal("handshake succeeded")
		}
	})

	t.Run("HTTP/3", func(t *testing.T) {
		tr := &http3.Transport{TLSClientConfig: &tls.Config{ServerName: "localhost", RootCAs: roots}}
		defer tr.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/1k", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || len(b) != 1024 || resp.ProtoMajor != 3 {
			t.Errorf("%s %d, %d bytes, %v; want HTTP/3 200, 1024 bytes", resp.Proto, resp.StatusCode, len(b), err)
		}
	})
}
