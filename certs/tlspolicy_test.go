package certs

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"strings"
	"testing"
	"time"
)

// TestTLSPolicy does real handshakes against the HTTPS listener of an
// internal-CA Manager: TLS 1.2 offers ECDHE AEAD suites only (no CBC, so
// nothing for LUCKY13), TLS 1.3 is Go's. The internal CA issues ECDSA
// certificates, so the RSA variants of the allowed suites cannot be
// negotiated here; a client offering both kinds gets the ECDSA one.
func TestTLSPolicy(t *testing.T) {
	e := newTestEdge(t)
	m := e.start(t, t.TempDir(), Options{Mode: ModeInternal, Allowed: newNameSet("policy.test").Allowed})
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(m.InternalRootPEM()) {
		t.Fatal("InternalRootPEM is not PEM")
	}

	cbc := []uint16{
		tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA,
		tls.TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA,
		tls.TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256,
		tls.TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA,
		tls.TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA,
		tls.TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256,
		tls.TLS_RSA_WITH_AES_128_CBC_SHA,
		tls.TLS_RSA_WITH_AES_256_CBC_SHA,
		tls.TLS_RSA_WITH_AES_128_CBC_SHA256,
	}
	for _, tc := range []struct {
		name      string
		version   uint16 // the client's only version
		suites    []uint16
		refused   bool
		wantSuite uint16 // 0: any
	}{
		// First, so a refusal below cannot be a name the CA would not serve.
		{"a TLS 1.3 client is served", tls.VersionTLS13, nil, false, 0},
		{"a TLS 1.2 client offering only CBC suites is refused", tls.VersionTLS12, cbc, true, 0},
		{"a TLS 1.2 client offering CBC before ECDSA AES-128-GCM gets AES-128-GCM", tls.VersionTLS12,
			append(cbc[:len(cbc):len(cbc)], tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256), false, tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256},
		{"a TLS 1.2 client offering ECDSA AES-256-GCM is served", tls.VersionTLS12,
			[]uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384}, false, tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384},
		{"a TLS 1.2 client offering ECDSA ChaCha20-Poly1305 is served", tls.VersionTLS12,
			[]uint16{tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256}, false, tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256},
		{"a TLS 1.2 client offering RSA and ECDSA GCM gets the ECDSA one", tls.VersionTLS12,
			[]uint16{tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}, false, tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", e.httpsLn.Addr().String(), &tls.Config{
				ServerName:             "policy.test",
				RootCAs:                roots,
				MinVersion:             tc.version,
				MaxVersion:             tc.version,
				CipherSuites:           tc.suites,
				SessionTicketsDisabled: true,
			})
			if tc.refused {
				if err == nil {
					st := conn.ConnectionState()
					conn.Close()
					t.Fatalf("handshake succeeded with %s %s, want refused",
						tls.VersionName(st.Version), tls.CipherSuiteName(st.CipherSuite))
				}
				return
			}
			if err != nil {
				t.Fatalf("handshake: %v", err)
			}
			defer conn.Close()
			st := conn.ConnectionState()
			if st.Version != tc.version || (tc.wantSuite != 0 && st.CipherSuite != tc.wantSuite) {
				t.Errorf("handshake = %s %s, want %s %s",
					tls.VersionName(st.Version), tls.CipherSuiteName(st.CipherSuite),
					tls.VersionName(tc.version), tls.CipherSuiteName(tc.wantSuite))
			}
		})
	}
}

// TestHandshakeAlerts: a name the document does not name is one this edge
// does not serve, and its handshake ends with RFC 6066's unrecognized_name;
// a named name whose certificate cannot be had now (the CA failed, the name
// is backing off) ends with internal_error, as the name is served.
func TestHandshakeAlerts(t *testing.T) {
	e := newTestEdge(t)
	// Nothing listens at the CA: an issuance fails at once.
	e.start(t, t.TempDir(), Options{Allowed: newNameSet("named.test").Allowed, CA: "https://127.0.0.1:9/dir"})
	for _, tc := range []struct{ name, sni, want string }{
		{"a stranger's name is not recognised", "stranger.test", "unrecognized name"},
		{"a wildcard key is not recognised", "*.wild.test", "unrecognized name"},
		{"a named name whose issuance fails is an internal error", "named.test", "internal error"},
		{"a named name backing off is an internal error", "named.test", "internal error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.handshake(tc.sni, nil)
			if err == nil || !strings.Contains(err.Error(), "remote error: tls: "+tc.want) {
				t.Fatalf("handshake for %q = %v, want the alert %q", tc.sni, err, tc.want)
			}
		})
	}
}
