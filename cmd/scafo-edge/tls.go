package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	bolt "go.etcd.io/bbolt"

	"github.com/scafo/scafo-edge/certs"
	"github.com/scafo/scafo-edge/edge"
)

// internalRootFile is where --tls internal writes its root certificate, for
// clients to trust.
const internalRootFile = "internal-ca.pem"

// tlsSetup is what the TLS mode contributes to the listeners.
type tlsSetup struct {
	config       *tls.Config                     // nil: no HTTPS listener
	wrapHTTP     func(http.Handler) http.Handler // nil: the plain handler as is
	covers       func(sni, host string) bool     // the 421 rule's coverage test
	certificates func() []certSummary            // for the status page; nil: none
	stop         func()
}

type certSummary = certs.CertInfo

func (t tlsSetup) httpHandler(h http.Handler) http.Handler {
	if t.wrapHTTP == nil {
		return h
	}
	return t.wrapHTTP(h)
}

// setupTLS starts certificate management for --tls acme or internal. The
// decision is the live table's: a name the document names exactly, never a
// wildcard key, nothing before the first document (DESIGN.md rule 8).
func setupTLS(ctx context.Context, c *config, db *bolt.DB, live *edge.Live, httpPort, httpsPort int, log zerolog.Logger, reg prometheus.Registerer) (tlsSetup, error) {
	if c.tlsMode == "off" {
		return tlsSetup{stop: func() {}}, nil
	}
	var wildcards []string
	for _, d := range strings.Split(c.wildcardDomains, ",") {
		if d = strings.TrimSpace(d); d != "" {
			wildcards = append(wildcards, d)
		}
	}
	if len(wildcards) > 0 && c.tlsMode == "acme" && c.dnsProvider == "" {
		return tlsSetup{}, fmt.Errorf("--wildcard-domains needs --dns-provider (wildcard certificates are DNS-01 only)")
	}
	switch c.dnsProvider {
	case "", "cloudflare":
	default:
		return tlsSetup{}, fmt.Errorf("--dns-provider %q: only cloudflare is supported", c.dnsProvider)
	}
	cfToken := os.Getenv("CLOUDFLARE_API_TOKEN")
	if c.dnsProvider == "cloudflare" && cfToken == "" {
		return tlsSetup{}, fmt.Errorf("--dns-provider cloudflare needs CLOUDFLARE_API_TOKEN")
	}
	m, err := certs.New(ctx, certs.Options{
		Mode:            certs.Mode(c.tlsMode),
		DB:              db,
		Allowed:         func(name string) bool { return live.Load().Certifiable(name) },
		CA:              c.acmeCA,
		CARoot:          c.acmeCARoot,
		Email:           c.acmeEmail,
		DNSProvider:     c.dnsProvider,
		CloudflareToken: cfToken,
		WildcardDomains: wildcards,
		HTTPPort:        httpPort,
		HTTPSPort:       httpsPort,
		Log:             log.With().Str("component", "certs").Logger(),
		Registerer:      reg,
	})
	if err != nil {
		return tlsSetup{}, fmt.Errorf("tls %s: %w", c.tlsMode, err)
	}
	if root := m.InternalRootPEM(); len(root) > 0 {
		path := filepath.Join(c.stateDir, internalRootFile)
		if err := os.WriteFile(path, root, 0o644); err != nil {
			m.Stop()
			return tlsSetup{}, fmt.Errorf("write internal root: %w", err)
		}
		log.Info().Str("file", path).Msg("internal CA root written; trust it on clients of this edge")
	}
	return tlsSetup{
		config:       m.TLSConfig(),
		wrapHTTP:     m.HTTPHandler,
		covers:       m.Covers,
		certificates: m.Certificates,
		stop:         m.Stop,
	}, nil
}
