package certs

// Where the Manager's configs get certificates: the internal CA, or an ACME
// CA through HTTP-01 and TLS-ALPN-01 (on demand), HTTP-01 alone (prefetch)
// and DNS-01 (wildcards).

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// useInternalCA makes every config issue from the internal CA kept in
// storage, loading it or creating it (ctx bounds that).
func (m *Manager) useInternalCA(ctx context.Context, storage certmagic.Storage) error {
	ca, err := loadOrCreateInternalCA(ctx, storage)
	if err != nil {
		return err
	}
	m.ca = ca
	m.cfg.Issuers = []certmagic.Issuer{m.ca}
	if m.wcfg != nil {
		m.wcfg.Issuers = []certmagic.Issuer{m.ca}
	}
	return nil
}

// useACME gives each config its ACME issuer: the on-demand config answers
// HTTP-01 and TLS-ALPN-01; with opts.Prefetch, a prefetch config (m.pcfg,
// sharing base) answers HTTP-01 only; the wildcard config uses DNS-01.
func (m *Manager) useACME(opts Options, base certmagic.Config, zl *zap.Logger) error {
	roots, err := trustedRoots(opts.CARoot)
	if err != nil {
		return err
	}
	tmpl := certmagic.ACMEIssuer{
		CA:           opts.CA,
		Email:        opts.Email,
		Agreed:       true,
		TrustedRoots: roots,
		// Point certmagic at our own listeners' ports: binding them
		// fails as "in use", and certmagic then relies on HTTPHandler
		// and TLSConfig to answer, instead of opening listeners of its own.
		AltHTTPPort:    orInt(opts.HTTPPort, 80),
		AltTLSALPNPort: m.httpsPort,
		// The ACME client's log is where each failed validation shows
		// (validations.go).
		Logger: zap.New(zapcore.NewTee(zl.Core(), &challengeFailedCore{failed: m.validationFailed})),
	}
	m.acme = newACMEIssuer(m.cfg, tmpl)
	m.cfg.Issuers = []certmagic.Issuer{m.acme}
	if opts.Prefetch != nil {
		m.pcfg = certmagic.New(m.cache, base)
		ptmpl := tmpl
		ptmpl.DisableTLSALPNChallenge = true
		m.pcfg.Issuers = []certmagic.Issuer{newACMEIssuer(m.pcfg, ptmpl)}
	}
	if m.wcfg != nil {
		solver, err := newDNS01SolverFor(opts)
		if err != nil {
			return err
		}
		wtmpl := tmpl
		wtmpl.DNS01Solver = solver
		m.wcfg.Issuers = []certmagic.Issuer{newACMEIssuer(m.wcfg, wtmpl)}
	}
	return nil
}

// newACMEIssuer is certmagic.NewACMEIssuer without its fallback to Let's
// Encrypt's staging CA. certmagic sends every retry of an issuance with
// the production CA to staging, then repeats it with production once
// staging succeeds. Staging's failed validations come through the same
// client log as production's (challengeFailedCore cannot tell them
// apart), so they would be counted against production's limit and hold
// names back for nothing; and the detour's purpose, sparing production's
// limits on retries, is the failed-validation budget's now, which counts
// what production sees. Retries therefore go to the configured CA.
func newACMEIssuer(cfg *certmagic.Config, tmpl certmagic.ACMEIssuer) *certmagic.ACMEIssuer {
	iss := certmagic.NewACMEIssuer(cfg, tmpl)
	// Empty, a retry's client uses the configured CA (acmeclient.go
	// newACMEClient) and is not taken for a test CA's (no ARI "replaces"
	// lost).
	iss.TestCA = ""
	return iss
}

// trustedRoots returns the system roots plus extra, which is PEM text or
// the path of a PEM file; nil when extra is empty (certmagic's default).
func trustedRoots(extra string) (*x509.CertPool, error) {
	if extra == "" {
		return nil, nil
	}
	pemBytes := []byte(extra)
	if !strings.Contains(extra, "-----BEGIN") {
		b, err := os.ReadFile(extra)
		if err != nil {
			return nil, fmt.Errorf("read acme ca root: %w", err)
		}
		pemBytes = b
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, errors.New("acme ca root: no certificate in the PEM given")
	}
	return pool, nil
}
