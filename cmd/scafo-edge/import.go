package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

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
	"cert-store", "acme-ca", "dns-provider", "wildcard-domains"}

// importCommand copies the certificates of Traefik (acme.json) or Caddy
// (its data directory) into the edge's certificate store
// (certs/migrate). It fails when a certificate was refused, after
// writing the others.
func importCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c config
	fs := serveFlags(&c)
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

	var cands []migrate.Candidate
	if from == "traefik" {
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		cands, err = migrate.ReadTraefik(data)
		if err != nil {
			return err
		}
	} else if cands, err = migrate.ReadCaddy(path); err != nil {
		return err
	}

	store, where, closeStore, err := importStore(&c, s, zerolog.New(zerolog.ConsoleWriter{Out: stderr}))
	if err != nil {
		return err
	}
	defer closeStore()
	fmt.Fprintf(stdout, "importing %s into %s, for %s\n", path, where, c.acmeCA)
	sum, err := migrate.Run(ctx, cands, migrate.Options{
		Store:     store,
		IssuerKey: migrate.IssuerKey(c.acmeCA),
		Renewed:   func(base string) bool { return c.dnsProvider != "" && slices.Contains(s.wildcards, base) },
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

func importUsage(fs *flagSet, w io.Writer) {
	fmt.Fprintf(w, "Usage: scafo-edge import traefik PATH/acme.json [flags]\n       scafo-edge import caddy DIR [flags]\n\n"+
		"Copies the certificates into the store the edge serves from, under the key of --acme-ca.\n"+
		"Takes every serve flag and environment variable; these matter:\n\n")
	for _, d := range fs.docs {
		if slices.Contains(importFlags, d.Name) {
			fmt.Fprintf(w, "  --%s  [%s] (default %q)\n      %s\n", d.Name, d.Env, d.Default, d.Usage)
		}
	}
}
