package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net/http"
	"os"
	"path/filepath"

	"github.com/caddyserver/certmagic"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/certs"
	"github.com/scafo/scafo-edge/certs/prefetch"
	"github.com/scafo/scafo-edge/edge"
	"github.com/scafo/scafo-edge/node"
	"github.com/scafo/scafo-edge/tickets"
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
	// tableChanged hands each new table to certificate prefetch; nil: none.
	tableChanged func(*edge.Table)
	prefetch     func() []prefetch.Entry // for the status page; nil: prefetch off
	// failedValidations is for the status page; nil: no ACME.
	failedValidations func() []certs.ValidationCount
	// notRenewed reports whether nothing renews a served certificate (a
	// wildcard imported, with no --dns-provider or its key gone from the
	// document), for the status page; nil: none.
	notRenewed func(names []string) bool
	// tickets are the session ticket keys config uses, offered to a
	// successor on a handover; nil with --tls off.
	tickets *tickets.Keys
	stop    func()
}

func (t tlsSetup) httpHandler(h http.Handler) http.Handler {
	if t.wrapHTTP == nil {
		return h
	}
	return t.wrapHTTP(h)
}

// setupTLS starts certificate management for --tls acme or internal. The
// decision is the live table's: a name the document names exactly, never a
// wildcard key, nothing before the first document (docs/design.md rule 8).
// Session tickets use the keys inherited from the edge this one replaces
// (nil: none), shared with the fleet through the fleet store if there is
// one (package tickets says why that is safe).
func setupTLS(ctx context.Context, c *config, s settings, p *parts, httpPort, httpsPort int, inheritedKeys []byte, log zerolog.Logger) (tlsSetup, error) {
	if c.tlsMode == "off" {
		return tlsSetup{stop: func() {}}, nil
	}
	store, closeStore, err := certStore(c, s, p, log)
	if err != nil {
		return tlsSetup{}, err
	}
	var pf *prefetch.Options
	if c.certPrefetch && c.tlsMode == "acme" {
		// The fleet shares one poll interval: a check that finds an edge
		// without a new name yet looks again one interval later.
		pf = &prefetch.Options{PerHour: c.prefetchPerHour, PollInterval: c.pollInterval}
	}
	m, err := certs.New(ctx, certs.Options{
		Mode:                  certs.Mode(c.tlsMode),
		DB:                    p.db,
		Storage:               store,
		Allowed:               func(name string) bool { return p.live.Load().Certifiable(name) },
		CA:                    c.acmeCA,
		CARoot:                c.acmeCARoot,
		Email:                 c.acmeEmail,
		DNSProvider:           c.dnsProvider,
		DNSEnv:                s.dnsEnv,
		DNSResolvers:          s.dnsResolvers,
		DNSPropagationTimeout: c.dnsTimeout,
		WildcardDomains:       s.wildcards,
		HTTPPort:              httpPort,
		HTTPSPort:             httpsPort,
		Prefetch:              pf,
		Log:                   log.With().Str("component", "certs").Logger(),
		Registerer:            p.reg,
	})
	if err != nil {
		closeStore()
		return tlsSetup{}, fmt.Errorf("tls %s: %w", c.tlsMode, err)
	}
	keys, err := tickets.New(ticketOptions(store, inheritedKeys, p, log))
	if err != nil {
		m.Close()
		closeStore()
		return tlsSetup{}, err
	}
	stop := func() {
		keys.Close()
		m.Close()
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
	ts := tlsSetup{
		config:       m.TLSConfig(),
		wrapHTTP:     m.HTTPHandler,
		covers:       m.Covers,
		certificates: m.Certificates,
		tickets:      keys,
		stop:         stop,
	}
	keys.Configure(ts.config)
	if c.tlsMode == "acme" {
		ts.failedValidations = m.FailedValidations
		// Wildcards imported from Traefik or Caddy (scafo-edge import)
		// serve their route keys, renewed by DNS-01 with --dns-provider
		// while the document names them; read off the poller's goroutine.
		held := certs.NewHeldWildcards(m)
		ts.notRenewed = held.NotRenewed
		ts.tableChanged = func(t *edge.Table) { held.Want(wildcardKeys(t)) }
	}
	if pf != nil {
		wildcards := ts.tableChanged
		ts.tableChanged = func(t *edge.Table) {
			wildcards(t)
			m.Prefetch(exactNames(t))
		}
		ts.prefetch = m.PrefetchStatus
	}
	if ts.tableChanged != nil {
		// The persisted or handed-over document is live already.
		ts.tableChanged(p.live.Load())
	}
	return ts, nil
}

// wildcardKeys lists the "*.<base>" route keys of t.
func wildcardKeys(t *edge.Table) []string {
	if t == nil {
		return nil
	}
	var keys []string
	for _, r := range t.Routes() {
		if r.Wildcard() {
			keys = append(keys, r.Host)
		}
	}
	return keys
}

// ticketOptions shares the keys through store when it is the fleet's (nil
// with --cert-store local: this edge and its successors only).
func ticketOptions(store certmagic.Storage, inherited []byte, p *parts, log zerolog.Logger) tickets.Options {
	return tickets.Options{Store: store, Inherited: inherited, Registerer: p.reg, Log: log.With().Str("component", "tls-tickets").Logger()}
}

// exactNames lists the names t names exactly, route hosts then API hosts,
// in document order: the names prefetch may obtain certificates for.
func exactNames(t *edge.Table) []string {
	if t == nil {
		return nil
	}
	var names []string
	for _, r := range t.Routes() {
		if !r.Wildcard() {
			names = append(names, r.Host)
		}
	}
	return append(names, t.APIHosts()...)
}

// certStore picks where certificates, keys and issuance locks live:
// "local" keeps them in edge.db only (nil: certs' default bbolt store);
// "fleet" shares them through the node's /v1/storage with bbolt as the local
// copy, so N edges asking for one name place one ACME order. validate has
// resolved the default (fleet when polling a node, local with --routes-file).
func certStore(c *config, s settings, p *parts, log zerolog.Logger) (certmagic.Storage, func(), error) {
	if s.certStore == "local" {
		return nil, func() {}, nil
	}
	local, err := certs.NewBoltStorage(p.db)
	if err != nil {
		return nil, nil, err
	}
	client := node.NewStorageClient(c.node, p.token, nil)
	fleet, err := certs.NewFleetStorage(client, local, certs.FleetOptions{
		Log:        log.With().Str("component", "cert-store").Logger(),
		Registerer: p.reg,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("fleet certificate store: %w", err)
	}
	return fleet, func() {
		fleet.Close()
		client.CloseIdleConnections()
	}, nil
}
