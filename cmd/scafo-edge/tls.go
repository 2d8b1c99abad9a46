package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	bolt "go.etcd.io/bbolt"

	"github.com/scafo/scafo-edge/certs"
	"github.com/scafo/scafo-edge/edge"
	"github.com/scafo/scafo-edge/node"
)

// internalRootFile is where --tls internal writes its root certificate, for
// clients to trust.
const internalRootFile = "internal-ca.pem"

// tlsSetup is what the TLS mode contributes to the listeners.
type tlsSetup struct {
	config       *tls.Config                     // nil: no HTTPS listener
	wrapHTTP     func(http.Handler) http.Handler // nil: the plain handler as is
	covers       func(sni, host string) bool     // the 421 rule's coverage test
	certificates func() []certs.CertInfo         // for the status page; nil: none
	stop         func()
}

func (t tlsSetup) httpHandler(h http.Handler) http.Handler {
	if t.wrapHTTP == nil {
		return h
	}
	return t.wrapHTTP(h)
}

// setupTLS starts certificate management for --tls acme or internal. The
// decision is the live table's: a name the document names exactly, never a
// wildcard key, nothing before the first document (DESIGN.md rule 8).
func setupTLS(ctx context.Context, c *config, db *bolt.DB, live *edge.Live, token string, httpPort, httpsPort int, log zerolog.Logger, reg prometheus.Registerer) (tlsSetup, error) {
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
	store, closeStore, err := certStore(c, db, token, log, reg)
	if err != nil {
		return tlsSetup{}, err
	}
	m, err := certs.New(ctx, certs.Options{
		Mode:            certs.Mode(c.tlsMode),
		DB:              db,
		Storage:         store,
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
		closeStore()
		return tlsSetup{}, fmt.Errorf("tls %s: %w", c.tlsMode, err)
	}
	stop := func() {
		m.Stop()
		closeStore()
	}
	if root := m.InternalRootPEM(); len(root) > 0 {
		path := filepath.Join(c.stateDir, internalRootFile)
		if err := os.WriteFile(path, root, 0o644); err != nil {
			stop()
			return tlsSetup{}, fmt.Errorf("write internal root: %w", err)
		}
		log.Info().Str("file", path).Msg("internal CA root written; trust it on clients of this edge")
	}
	return tlsSetup{
		config:       m.TLSConfig(),
		wrapHTTP:     m.HTTPHandler,
		covers:       m.Covers,
		certificates: m.Certificates,
		stop:         stop,
	}, nil
}

// certStore picks where certificates, keys and issuance locks live:
// "local" keeps them in edge.db only (nil: certs' default bbolt store);
// "fleet" shares them through the node's /v1/storage with bbolt as the local
// copy, so N edges asking for one name place one ACME order. The default is
// fleet when polling a node and local with --routes-file.
func certStore(c *config, db *bolt.DB, token string, log zerolog.Logger, reg prometheus.Registerer) (certmagic.Storage, func(), error) {
	mode := c.certStore
	if mode == "" {
		mode = "fleet"
		if c.routesFile != "" {
			mode = "local"
		}
	}
	switch mode {
	case "local":
		return nil, func() {}, nil
	case "fleet":
	default:
		return nil, nil, fmt.Errorf("--cert-store %q: want local or fleet", c.certStore)
	}
	if c.routesFile != "" {
		return nil, nil, fmt.Errorf("--cert-store fleet needs a node (--node), not --routes-file")
	}
	local, err := certs.NewBoltStorage(db)
	if err != nil {
		return nil, nil, err
	}
	client := node.NewStorageClient(c.node, token, nil)
	fleet, err := certs.NewFleetStorage(client, local, certs.FleetOptions{
		Log:        log.With().Str("component", "cert-store").Logger(),
		Registerer: reg,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("fleet certificate store: %w", err)
	}
	return fleet, func() {
		fleet.Close()
		client.CloseIdleConnections()
	}, nil
}
