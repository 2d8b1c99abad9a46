package e2e

import (
	"context"
	"crypto/x509"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/scafo/scafo-edge/certs/certstest"
	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node/nodetest"
)

// caddyObtain has certmagic, configured as Caddy configures it with its
// default file storage, obtain each name from p into dir: the layout
// Caddy leaves in $XDG_DATA_HOME/caddy (or /data/caddy). It returns the
// serial of each certificate by name.
func caddyObtain(t *testing.T, p *certstest.Pebble, dir string, names ...string) map[string]string {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(p.RootPEM)
	cache := certmagic.NewCache(certmagic.CacheOptions{GetConfigForCert: func(certmagic.Certificate) (*certmagic.Config, error) {
		return nil, fmt.Errorf("no maintenance in this test")
	}})
	defer cache.Stop()
	cfg := certmagic.New(cache, certmagic.Config{Storage: &certmagic.FileStorage{Path: dir}})
	cfg.Issuers = []certmagic.Issuer{certmagic.NewACMEIssuer(cfg, certmagic.ACMEIssuer{
		CA: p.DirectoryURL, TrustedRoots: pool, Email: "caddy@example.test", Agreed: true,
		DisableHTTPChallenge: true, DisableTLSALPNChallenge: true, DNS01Solver: txtSolver{p},
	})}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	serials := map[string]string{}
	for _, name := range names {
		if err := cfg.ObtainCertSync(ctx, name); err != nil {
			t.Fatalf("certmagic obtain %s: %v", name, err)
		}
		crt, err := os.ReadFile(filepath.Join(dir, certmagic.StorageKeys.SiteCert((&certmagic.ACMEIssuer{CA: p.DirectoryURL}).IssuerKey(), name)))
		if err != nil {
			t.Fatalf("certmagic did not store %s where Caddy keeps it: %v", name, err)
		}
		serials[name] = serialOf(t, crt)
	}
	return serials
}

// plantCaddy writes a certificate into dir as certmagic's file storage
// lays it out, for the bad certificates certmagic would never store.
func plantCaddy(t *testing.T, dir, ca, name string, c pebbleCert, key []byte) {
	t.Helper()
	iss := (&certmagic.ACMEIssuer{CA: ca}).IssuerKey()
	for key, val := range map[string][]byte{
		certmagic.StorageKeys.SiteCert(iss, name):       c.chain,
		certmagic.StorageKeys.SitePrivateKey(iss, name): key,
		certmagic.StorageKeys.SiteMeta(iss, name):       []byte(`{"sans":["` + name + `"]}`),
	} {
		p := filepath.Join(dir, key)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, val, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestImportCaddyThroughTheBinary covers both of Caddy's layouts. Caddy's
// certmagic obtains three certificates from Pebble (two names and a
// wildcard). Local storage: scafo-edge import caddy DIR copies them and
// refuses an expired one and one with another's key, and the edge serves
// the three with no new order. Fleet store: the same files, put in the
// node's store under certmagic's keys as Caddy's scafo storage module
// writes them, are served by an edge on that store with no import and no
// order: the edge's certmagic files them under the same issuer key for
// the same directory URL.
func TestImportCaddyThroughTheBinary(t *testing.T) {
	p := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: testsupport.FreePort(t), TLSPort: testsupport.FreePort(t)})
	rootFile := pebbleRootFile(t, p)
	caddyDir := filepath.Join(t.TempDir(), "caddy")
	serials := caddyObtain(t, p, caddyDir, "single.example", "two.example", "*.tenant.example")
	fleetDir := t.TempDir()
	copyTree(t, filepath.Join(caddyDir, "certificates"), filepath.Join(fleetDir, "certificates"))

	iss := newPebbleIssuer(t, p)
	expired := iss.obtain(t, time.Now().Add(-72*time.Hour), time.Now().Add(-24*time.Hour), "expired.example")
	mismatch := iss.obtain(t, time.Time{}, time.Time{}, "mismatch.example")
	plantCaddy(t, caddyDir, p.DirectoryURL, "expired.example", expired, expired.key)
	plantCaddy(t, caddyDir, p.DirectoryURL, "mismatch.example", mismatch, expired.key)
	p.WaitOrderCount(t, 5)
	roots := importRoots(t, p, mismatch)
	issuerRoots := p.IssuerRoots(t)
	served := map[string]string{"single.example": serials["single.example"], "two.example": serials["two.example"], "x.tenant.example": serials["*.tenant.example"]}
	a := hostOf(app(t, "A"))

	t.Run("local storage through import caddy", func(t *testing.T) {
		n := nodetest.New(t, nodetest.Options{})
		n.SetDocument(importDocument(a))
		state := t.TempDir()
		store := []string{"--node", n.URL(), "--cert-store", "local", "--state-dir", state, "--acme-ca", p.DirectoryURL, "--acme-ca-root", roots}
		out, err := runImport(t, append([]string{"caddy", caddyDir}, store...)...)
		if code := exitCode(err); code != 1 {
			t.Errorf("import with two bad certificates: exit %d, want 1", code)
		}
		for _, want := range []string{
			`imported   "single.example":`, `imported   "two.example":`, `imported   "*.tenant.example":`,
			`refused    "expired.example": expired on`, `refused    "mismatch.example": key does not match the certificate`,
			"5 certificates: 3 imported, 0 unchanged, 0 kept, 2 refused",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("import output lacks %q", want)
			}
		}
		orders := p.OrderCount()
		e := startEdge(t, "--node", n.URL(), "--cert-store", "local", "--state-dir", state, "--tls", "acme",
			"--acme-ca", p.DirectoryURL, "--acme-ca-root", rootFile, "--cert-prefetch=false")
		for name, serial := range served {
			waitServed(t, e, name, serial, issuerRoots)
		}
		if got := p.OrderCount(); got != orders {
			t.Errorf("Pebble orders = %d after serving Caddy's certificates, want %d (no new order)", got, orders)
		}
	})

	t.Run("fleet store written by Caddy's scafo storage module", func(t *testing.T) {
		n := nodetest.New(t, nodetest.Options{Token: "fleet-token"})
		n.SetDocument(importDocument(a))
		keys := 0
		err := filepath.WalkDir(fleetDir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(fleetDir, path)
			n.PutStorageObject(filepath.ToSlash(rel), b) // the certmagic key, as the module stores it
			keys++
			return nil
		})
		if err != nil || keys != 9 {
			t.Fatalf("fleet store: %d keys put (%v), want 9 (3 certificates × crt, key, json)", keys, err)
		}
		orders := p.OrderCount()
		e := startEdge(t, "--node", n.URL(), "--ingress-token", "fleet-token", "--tls", "acme",
			"--acme-ca", p.DirectoryURL, "--acme-ca-root", rootFile, "--cert-prefetch=false")
		for name, serial := range served {
			waitServed(t, e, name, serial, issuerRoots)
		}
		if got := p.OrderCount(); got != orders {
			t.Errorf("Pebble orders = %d after serving the fleet store, want %d (no new order)", got, orders)
		}
		t.Logf("figures: Caddy fleet store (%d keys): 3 certificates served with %d new order(s)", keys, p.OrderCount()-orders)
	})

	t.Run("import into the fleet store beside a running edge", func(t *testing.T) {
		n := nodetest.New(t, nodetest.Options{Token: "fleet-token"})
		n.SetDocument(importDocument(a))
		e := startEdge(t, "--node", n.URL(), "--ingress-token", "fleet-token", "--tls", "acme",
			"--acme-ca", p.DirectoryURL, "--acme-ca-root", rootFile, "--cert-prefetch=false")
		out, _ := runImport(t, "caddy", caddyDir, "--node", n.URL(), "--ingress-token", "fleet-token", "--acme-ca", p.DirectoryURL, "--acme-ca-root", roots)
		if !strings.Contains(out, "5 certificates: 3 imported, 0 unchanged, 0 kept, 2 refused") {
			t.Errorf("fleet import beside a running edge did not import the three")
		}
		orders := p.OrderCount()
		// Exact names load from the store at their first handshake; a
		// wildcard is looked for again within a minute (not waited for here).
		for _, name := range []string{"single.example", "two.example"} {
			waitServed(t, e, name, served[name], issuerRoots)
		}
		if got := p.OrderCount(); got != orders {
			t.Errorf("Pebble orders = %d, want %d (no new order)", got, orders)
		}
	})
}

// copyTree copies the files under src to dst.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o700)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o600)
	})
	if err != nil {
		t.Fatal(err)
	}
}
