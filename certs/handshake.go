package certs

// The TLS side of the Manager: the listener's configuration, which config
// answers a handshake, the handshakes waiting on an issuance, and whether
// the certificate served for a name covers a Host (the 421 rule).

import (
	"context"
	"crypto/tls"
	"slices"
	"strings"

	"github.com/caddyserver/certmagic"

	"github.com/scafo/scafo-edge/internal/hostname"
)

// configFor tells certmagic's cache which config maintains a certificate.
func (m *Manager) configFor(c certmagic.Certificate) (*certmagic.Config, error) {
	if m.wcfg != nil && slices.ContainsFunc(c.Names, m.isBaseName) {
		return m.wcfg, nil
	}
	return m.cfg, nil
}

// isBaseName reports whether name is a wildcard base or its "*.<base>",
// or a held "*.<base>" renewed by DNS-01 (held.go).
func (m *Manager) isBaseName(name string) bool {
	b, wild := strings.CutPrefix(name, "*.")
	return m.bases[b] || (wild && m.adoptedBase(b))
}

// underBase reports whether a certificate for one of the wildcard bases
// would cover name: the base itself or one label under it; or one label
// under a held wildcard renewed by DNS-01.
func (m *Manager) underBase(name string) bool {
	if m.bases[name] {
		return true
	}
	i := strings.IndexByte(name, '.')
	return i > 0 && (m.bases[name[i+1:]] || m.adoptedBase(name[i+1:]))
}

// TLSConfig returns the configuration for the HTTPS listener: certificates
// through certmagic (on demand, gated by Allowed), ALPN h2 and http/1.1, and
// acme-tls/1 for TLS-ALPN-01 challenges; TLS 1.2 with ECDHE AEAD suites only,
// TLS 1.3 as Go sets it. Nil in ModeOff.
func (m *Manager) TLSConfig() *tls.Config {
	if m.mode == ModeOff {
		return nil
	}
	return &tls.Config{
		GetCertificate: m.getCertificate,
		NextProtos:     []string{"h2", "http/1.1", "acme-tls/1"},
		MinVersion:     tls.VersionTLS12,
		CipherSuites:   CipherSuites(),
	}
}

// CipherSuites are the TLS 1.2 suites the edge offers: AEAD only (Mozilla
// intermediate), as CBC suites are open to LUCKY13 timing (CVE-2013-0169).
// TLS 1.3's are Go's.
func CipherSuites() []uint16 {
	return []uint16{
		tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
		tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
		tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
		tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
		tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
		tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
	}
}

func (m *Manager) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if len(hello.SupportedProtos) == 1 && hello.SupportedProtos[0] == "acme-tls/1" {
		m.metrics.handshakes.WithLabelValues("challenge").Inc()
		return m.cfg.GetCertificate(hello)
	}
	name, _ := hostname.Normalise(hello.ServerName)
	cfg := m.cfg
	// A name a held wildcard covers is served by the config that manages
	// the wildcard: no on-demand maintenance, never an issuance.
	if m.wcfg != nil && m.underBase(name) && len(m.cache.AllMatchingCertificates(name)) > 0 {
		cfg = m.wcfg
	}
	ctx, cancel := context.WithCancel(context.WithValue(hello.Context(), handshakeKey{}, true))
	id := m.track(name, cancel)
	cert, err := cfg.GetCertificateWithContext(ctx, hello)
	m.untrack(name, id)
	cancel()
	if err != nil {
		m.metrics.handshakes.WithLabelValues("no_certificate").Inc()
		if reason, _ := m.refusal(hello.ServerName); reason == "not_named" || reason == "wildcard" {
			// A name this edge does not serve: neither a certificate nor
			// an error makes crypto/tls send unrecognized_name (RFC 6066
			// §3), as the config holds no certificate of its own. Any other
			// failure (the CA, a back-off) stays internal_error: the name
			// is served, its certificate is not there yet.
			return nil, nil
		}
		return nil, err
	}
	m.metrics.handshakes.WithLabelValues("ok").Inc()
	return cert, nil
}

func (m *Manager) track(name string, cancel context.CancelFunc) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.nextID++
	ps := m.pending[name]
	if ps == nil {
		ps = map[uint64]context.CancelFunc{}
		m.pending[name] = ps
	}
	ps[m.nextID] = cancel
	return m.nextID
}

func (m *Manager) untrack(name string, id uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.pending[name], id)
	if len(m.pending[name]) == 0 {
		delete(m.pending, name)
	}
}

// cancelPending ends the handshakes waiting on name's issuance.
func (m *Manager) cancelPending(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, cancel := range m.pending[name] {
		cancel()
	}
}

// Covers reports whether the certificate served for sni covers host, for
// the edge's 421 rule. Both are compared normalised (hostname.Normalise);
// equal names always cover each other, a malformed one covers nothing.
func (m *Manager) Covers(sni, host string) bool {
	sni, sniOK := hostname.Normalise(sni)
	host, hostOK := hostname.Normalise(host)
	if !sniOK || !hostOK {
		return false
	}
	if sni == host {
		return true
	}
	if m.mode == ModeOff {
		return false
	}
	for _, c := range m.cache.AllMatchingCertificates(sni) {
		if namesCover(c.Names, host) {
			return true
		}
	}
	return false
}

// namesCover reports whether a certificate for names is valid for host:
// an exact name, or a "*.<parent>" matching exactly one label (RFC 6125 §6.4.3).
func namesCover(names []string, host string) bool {
	for _, n := range names {
		n = strings.ToLower(n)
		if n == host {
			return true
		}
		if rest, ok := strings.CutPrefix(n, "*."); ok {
			if i := strings.IndexByte(host, '.'); i > 0 && host[i+1:] == rest {
				return true
			}
		}
	}
	return false
}
