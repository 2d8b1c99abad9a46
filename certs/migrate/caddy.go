package migrate

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// ReadCaddy returns the certificates of a Caddy data directory kept by
// certmagic's file storage ($XDG_DATA_HOME/caddy, /data/caddy in Caddy's
// image): certificates/<issuer>/<name>/<name>.crt beside <name>.key. dir
// may be the data directory or its certificates directory. A certificate
// whose files cannot be read (no key file; a link, a FIFO, a device, or
// more than MaxPEMFile bytes) is a Candidate with Err set; a directory
// with no certificates directory is an error.
func ReadCaddy(dir string) ([]Candidate, error) {
	root := filepath.Join(dir, "certificates")
	if filepath.Base(filepath.Clean(dir)) == "certificates" {
		root = dir
	}
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("caddy storage %q: no certificates directory (want Caddy's data directory, e.g. /data/caddy)", dir)
	}
	var out []Candidate
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("walk %q: %w", path, bare(err))
		}
		if d.IsDir() || !strings.HasSuffix(path, ".crt") {
			return nil
		}
		// certificates/<issuer>/<name>/<name>.crt: the file is named as
		// its directory; anything else is not certmagic's.
		site := filepath.Base(filepath.Dir(path))
		if filepath.Base(path) != site+".crt" {
			return nil
		}
		out = append(out, readCaddyPair(path, site))
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("caddy storage %q: %w", dir, err)
	}
	slices.SortFunc(out, func(a, b Candidate) int { return strings.Compare(a.Source, b.Source) })
	return out, nil
}

// readCaddyPair reads the certificate at crtPath and the key beside it.
// The directory is another proxy's, maybe an attacker's: only regular
// files are read, links not followed, each at most MaxPEMFile bytes.
func readCaddyPair(crtPath, site string) Candidate {
	c := Candidate{Source: crtPath, Names: []string{siteName(site)}}
	var err error
	if c.CertPEM, err = readRegular(crtPath, MaxPEMFile, true); err != nil {
		c.Err = err
		return c
	}
	keyPath := strings.TrimSuffix(crtPath, ".crt") + ".key"
	if c.KeyPEM, err = readRegular(keyPath, MaxPEMFile, true); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			err = fmt.Errorf("%w: no key file %q", ErrUnparsable, keyPath)
		}
		c.Err = err
	}
	return c
}

// siteName is the name certmagic filed a site directory under, for the
// report: its key with a leftmost "wildcard_" read as "*".
func siteName(site string) string {
	if base, ok := strings.CutPrefix(site, "wildcard_."); ok {
		return "*." + base
	}
	return site
}
