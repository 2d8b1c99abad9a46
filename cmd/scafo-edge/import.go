package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/rs/zerolog"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/scafo/scafo-edge/certs"
	"github.com/scafo/scafo-edge/certs/migrate"
	"github.com/scafo/scafo-edge/node"
)

// importFlags are the serve flags the import reads: where the certificate
// store is and which CA's key it files certificates under. The import
// takes every serve flag and variable, so it runs with serve's
// configuration as is; --help lists these.
var importFlags = []string{"node", "routes-file", "ingress-token", "ingress-token-file", "state-dir",
	"cert-store", "acme-ca", "acme-ca-root", "dns-provider", "wildcard-domains", "log-level"}

// allowUntrustedUsage documents --allow-untrusted, the one flag the import
// has beyond serve's. It has no environment variable: an environment
// set for the edge must not quietly turn the chain check off.
const allowUntrustedUsage = "import certificates whose chain leads to no trusted root (the system's or --acme-ca-root's), for a lab's self-signed ones; every other check still holds"

// importCommand copies the certificates of Traefik (acme.json) or Caddy
// (its data directory) into the edge's certificate store
// (certs/migrate). It fails when a certificate was refused, after
// writing the others.
func importCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c config
	fs := serveFlags(&c)
	allowUntrusted := fs.Bool("allow-untrusted", false, allowUntrustedUsage)
	fs.SetOutput(stderr)
	fs.Usage = func() { importUsage(fs, stderr) }
	if len(args) == 0 || (args[0] != "traefik" && args[0] != "caddy") {
		fs.Usage()
		return errors.New("import: want traefik PATH or caddy DIR")
	}
	from, rest := args[0], args[1:]
	path := ""
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		path, rest = rest[0], rest[1:]
	}
	if err := fs.parse(rest, getenv); err != nil {
		return err
	}
	if path == "" && fs.NArg() > 0 {
		path = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if path == "" {
		return fmt.Errorf("import %s: no path given", from)
	}
	if c.tlsMode != "acme" {
		return fmt.Errorf("--tls: %q: import files certificates for the ACME CA, want acme", c.tlsMode)
	}
	s, err := validate(&c, getenv)
	if err != nil {
		return err
	}

	roots, err := importRoots(c.acmeCARoot)
	if err != nil {
		return err
	}
	var cands []migrate.Candidate
	if from == "traefik" {
		cands, err = migrate.ReadTraefikFile(path)
	} else {
		cands, err = migrate.ReadCaddy(path)
	}
	if err != nil {
		return err
	}

	store, where, closeStore, err := importStore(&c, s, importLogger(s.logLevel, stderr))
	if err != nil {
		return err
	}
	defer closeStore()
	fmt.Fprintf(stdout, "importing %q into %s, for %s\n", path, where, c.acmeCA)
	sum, err := migrate.Run(ctx, cands, migrate.Options{
		Store:     store,
		IssuerKey: migrate.IssuerKey(c.acmeCA),
		// With a provider, the edge renews a held wildcard its document
		// names as it renews a --wildcard-domains base (certs.HeldWildcards).
		Renewed:     func(string) bool { return c.dnsProvider != "" },
		DNSProvider: c.dnsProvider,
		Policy:      migrate.Policy{Roots: roots, AllowUntrusted: *allowUntrusted},
	}, stdout)
	if err != nil {
		return err
	}
	if sum.Refused > 0 {
		return fmt.Errorf("import: %d certificate(s) refused, nothing written for them; the others are in place", sum.Refused)
	}
	return nil
}

// importStore opens the store serve would use. The fleet store is written
// through the node, which running edges read first: no edge need stop.
// The local store is edge.db, which a running edge holds locked: then
// the import says so rather than wait.
func importStore(c *config, s settings, log zerolog.Logger) (migrate.Store, string, func(), error) {
	if s.certStore == "fleet" {
		tok, warnings, err := node.LoadToken(c.token, c.tokenFile)
		if err != nil {
			return nil, "", nil, err
		}
		for _, w := range warnings {
			log.Warn().Str("file", c.tokenFile).Msg(w)
		}
		client := node.NewStorageClient(c.node, tok, nil)
		return migrate.NodeStore{Client: client}, "the fleet store through " + c.node, client.CloseIdleConnections, nil
	}
	db, err := node.OpenState(c.stateDir, log)
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, "", nil, fmt.Errorf("%s is in use by a running edge: stop it and import again (or import into the fleet store, --cert-store fleet, which running edges read at once): %w", c.stateDir, err)
	}
	if err != nil {
		return nil, "", nil, err
	}
	st, err := certs.NewBoltStorage(db)
	if err != nil {
		db.Close()
		return nil, "", nil, err
	}
	return st, "the local store " + db.Path(), func() { db.Close() }, nil
}

// importLogger writes console lines, each with its time (a logger
// without a timestamp printed "<nil>" there, issue 49), and without
// colours: its lines sit among the report's plain ones, which are often
// kept in a file, and the report promises no escape sequence.
func importLogger(level zerolog.Level, w io.Writer) zerolog.Logger {
	cw := zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339, NoColor: true}
	return zerolog.New(cw).Level(level).With().Timestamp().Logger()
}

// importRoots is the pool an imported chain must lead to: the system
// roots and those of --acme-ca-root, a PEM file or PEM text as serve
// reads it (a private ACME CA's root signs what it issues).
func importRoots(extra string) (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if extra == "" {
		return pool, nil
	}
	pemBytes := []byte(extra)
	if !strings.Contains(extra, "-----BEGIN") {
		if pemBytes, err = os.ReadFile(extra); err != nil {
			return nil, fmt.Errorf("--acme-ca-root: %w", err)
		}
	}
	if !pool.AppendCertsFromPEM(pemBytes) {
		return nil, errors.New("--acme-ca-root: no certificate in the PEM given")
	}
	return pool, nil
}

func importUsage(fs *flagSet, w io.Writer) {
	fmt.Fprintf(w, "Usage: scafo-edge import traefik PATH/acme.json [flags]\n       scafo-edge import caddy DIR [flags]\n\n"+
		"Copies the certificates into the store the edge serves from, under the key of --acme-ca.\n"+
		"A certificate is refused, and the others still imported, when its key does not match, it is\n"+
		"expired or not yet valid, valid for more than 398 days, names a DNS name that is no hostname,\n"+
		"is filed under another name's storage key or is a wildcard for a public suffix, or its chain\n"+
		"leads to no root of the system's or --acme-ca-root's (Let's Encrypt staging needs its root there).\n"+
		"Takes every serve flag and environment variable; these matter:\n\n")
	for _, d := range fs.docs {
		if slices.Contains(importFlags, d.Name) {
			fmt.Fprintf(w, "  --%s  [%s] (default %q)\n      %s\n", d.Name, d.Env, d.Default, d.Usage)
		}
	}
	fmt.Fprintf(w, "  --allow-untrusted  (default false)\n      %s\n", allowUntrustedUsage)
}
