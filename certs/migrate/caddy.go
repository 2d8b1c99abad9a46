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
// without its key is a Candidate with Err set; a directory with no
// certificates directory is an error.
func ReadCaddy(dir string) ([]Candidate, error) {
	root := filepath.Join(dir, "certificates")
	if filepath.Base(filepath.Clean(dir)) == "certificates" {
		root = dir
	}
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("caddy storage %s: no certificates directory (want Caddy's data directory, e.g. /data/caddy)", dir)
	}
	var out []Candidate
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
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
		c := Candidate{Source: path, Names: []string{strings.ReplaceAll(site, "wildcard_", "*")}}
		if c.CertPEM, err = os.ReadFile(path); err != nil {
			return err
		}
		keyPath := strings.TrimSuffix(path, ".crt") + ".key"
		if c.KeyPEM, err = os.ReadFile(keyPath); err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			c.Err = fmt.Errorf("%w: no key file %s", ErrUnparsable, keyPath)
		}
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("caddy storage %s: %w", dir, err)
	}
	slices.SortFunc(out, func(a, b Candidate) int { return strings.Compare(a.Source, b.Source) })
	return out, nil
}
