package certs

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	bolt "go.etcd.io/bbolt"

	"github.com/scafo/scafo-edge/certs/certstest"
	"github.com/scafo/scafo-edge/internal/testsupport"
)

// storeHeldWildcard writes a self-signed certificate for name, valid from
// an hour ago until notAfter, into the bbolt store at dir under the key
// of the ACME issuer for ca, as `scafo-edge import` files one. It returns
// the certificate's serial.
func storeHeldWildcard(t *testing.T, dir, ca, name string, notAfter time.Time) *big.Int {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, DNSNames: []string{name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(filepath.Join(dir, "edge.db"), 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st, err := NewBoltStorage(db)
	if err != nil {
		t.Fatal(err)
	}
	iss := (&certmagic.ACMEIssuer{CA: ca}).IssuerKey()
	ctx := context.Background()
	for k, v := range map[string][]byte{
		certmagic.StorageKeys.SiteCert(iss, name):       pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		certmagic.StorageKeys.SitePrivateKey(iss, name): pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		certmagic.StorageKeys.SiteMeta(iss, name):       []byte(`{"sans":["` + name + `"]}`),
	} {
		if err := st.Store(ctx, k, v); err != nil {
			t.Fatal(err)
		}
	}
	return serial
}

// cachedFor returns the certificate certmagic holds for name exactly.
func cachedFor(t *testing.T, m *Manager, name string) certmagic.Certificate {
	t.Helper()
	for _, c := range m.cache.AllMatchingCertificates(name) {
		if slices.Contains(c.Names, name) {
			return c
		}
	}
	t.Fatalf("no certificate for %s in the cache", name)
	return certmagic.Certificate{}
}

// TestHeldWildcardRenewedByDNS01WhileNamed: with a DNS provider and no
// WildcardDomains, a held "*.<base>" the document names is adopted (not
// flagged, managed by the DNS-01 config, served through it), renewed at
// once when due (one order: the bare base is never ordered), and released
// when the document drops its key (flagged, back to the on-demand
// config, whose maintenance renews nothing in the background).
func TestHeldWildcardRenewedByDNS01WhileNamed(t *testing.T) {
	const key, base = "*.apps.example.test", "apps.example.test"
	e := newTestEdge(t)
	pb := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: e.httpPort, TLSPort: e.httpsPort})
	cf := certstest.NewFakeCloudflare(t, "cf-token", []string{"example.test"}, pb)
	dir := t.TempDir()
	// 10 minutes left of 70: in certmagic's renewal window.
	imported := storeHeldWildcard(t, dir, pb.DirectoryURL, key, time.Now().Add(10*time.Minute))
	opts := wildcardOptions(pb, cf)
	opts.WildcardDomains = nil
	m := e.start(t, dir, opts)
	h := NewHeldWildcards(m)
	if m.wcfg == nil {
		t.Fatal("no DNS-01 config with a DNS provider set")
	}

	h.Load([]string{key, "shop.example.test"})
	if !m.adoptedBase(base) || h.NotRenewed([]string{key}) || len(h.Lapsing()) != 0 {
		t.Errorf("after Load: adopted %v, NotRenewed %v, Lapsing %v; want adopted and renewed", m.adoptedBase(base), h.NotRenewed([]string{key}), h.Lapsing())
	}
	if !m.underBase("x.apps.example.test") || m.underBase(base) || m.underBase("a.b.apps.example.test") {
		t.Errorf("underBase: x. %v, the base %v, two labels under %v; want true, false, false",
			m.underBase("x.apps.example.test"), m.underBase(base), m.underBase("a.b.apps.example.test"))
	}

	roots := pb.IssuerRoots(t)
	var served *big.Int
	testsupport.WaitForNil(t, 60*time.Second, "the wildcard renewed by Pebble", func() error {
		leaf, err := e.handshake("x.apps.example.test", roots) // the imported one does not verify
		if err != nil {
			return err
		}
		served = leaf.SerialNumber
		return nil
	})
	if served.Cmp(imported) == 0 {
		t.Errorf("served serial %v is the imported one", served)
	}
	if got := pb.OrderCount(); got != 1 {
		t.Errorf("orders = %d, want 1 (the wildcard's renewal, never the bare base)", got)
	}
	if cfg, _ := m.configFor(cachedFor(t, m, key)); cfg != m.wcfg {
		t.Error("the renewed wildcard is not maintained by the DNS-01 config")
	}

	h.Load([]string{"shop.example.test"}) // the document dropped the key
	if m.adoptedBase(base) || !h.NotRenewed([]string{key}) || len(h.Lapsing()) != 1 {
		t.Errorf("after the key left: adopted %v, NotRenewed %v, Lapsing %v; want released and flagged", m.adoptedBase(base), h.NotRenewed([]string{key}), h.Lapsing())
	}
	if cfg, _ := m.configFor(cachedFor(t, m, key)); cfg != m.cfg {
		t.Error("a released wildcard is still maintained by the DNS-01 config")
	}
	h.Load([]string{key}) // named again: adopted again, from memory
	if !m.adoptedBase(base) || h.NotRenewed([]string{key}) {
		t.Errorf("named again: adopted %v, NotRenewed %v; want adopted", m.adoptedBase(base), h.NotRenewed([]string{key}))
	}
}

// TestHeldWildcardNotRenewedWithoutAProvider: without a DNS provider a
// held wildcard is served and flagged as before, and no DNS-01 config
// exists to renew it.
func TestHeldWildcardNotRenewedWithoutAProvider(t *testing.T) {
	const key = "*.apps.example"
	const ca = "https://127.0.0.1:1/dir"
	dir := t.TempDir()
	storeHeldWildcard(t, dir, ca, key, time.Now().Add(10*time.Minute))
	m, err := New(context.Background(), Options{Mode: ModeACME, DB: openTestDB(t, dir), CA: ca})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	h := NewHeldWildcards(m)
	h.Load([]string{key})
	if m.wcfg != nil || m.adoptedBase("apps.example") {
		t.Errorf("DNS-01 config %v, adopted %v; want none without a provider", m.wcfg != nil, m.adoptedBase("apps.example"))
	}
	if !h.NotRenewed([]string{key}) || len(h.Lapsing()) != 1 {
		t.Errorf("NotRenewed %v, Lapsing %v; want the wildcard flagged", h.NotRenewed([]string{key}), h.Lapsing())
	}
	if cfg, _ := m.configFor(cachedFor(t, m, key)); cfg != m.cfg {
		t.Error("a held wildcard without a provider is not left to the on-demand config")
	}
}
