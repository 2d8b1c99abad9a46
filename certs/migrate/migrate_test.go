package migrate

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	bolt "go.etcd.io/bbolt"

	"github.com/scafo/scafo-edge/certs"
)

var now = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// issued is a test certificate: PEM chain (leaf, then its CA) and key.
type issued struct{ cert, key []byte }

// authority is a test CA: its certificate and key, and a pool of it.
type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

// testCA signs the test certificates; policy trusts it and checks at now.
var (
	testCA = newAuthority()
	policy = Policy{Now: now, Roots: testCA.pool}
)

func newAuthority() authority {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		panic(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: now.AddDate(-5, 0, 0), NotAfter: now.AddDate(100, 0, 0), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		panic(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		panic(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return authority{cert: cert, key: key, pool: pool}
}

// issue makes a certificate for names signed by testCA, valid from
// notBefore to notAfter, with an ECDSA key (rsaKey: RSA, PKCS #1).
func issue(t *testing.T, notBefore, notAfter time.Time, rsaKey bool, names ...string) issued {
	t.Helper()
	return sign(t, &testCA, notBefore, notAfter, rsaKey, names...)
}

// selfSigned makes a certificate for names that signs itself, as a lab
// makes one.
func selfSigned(t *testing.T, names ...string) issued {
	t.Helper()
	return sign(t, nil, now.Add(-time.Hour), now.Add(30*24*time.Hour), false, names...)
}

// sign makes a certificate for names signed by ca (nil: by itself).
func sign(t *testing.T, ca *authority, notBefore, notAfter time.Time, rsaKey bool, names ...string) issued {
	t.Helper()
	var pub any
	var signer crypto.Signer
	var keyPEM []byte
	if rsaKey {
		k, _ := rsa.GenerateKey(rand.Reader, 2048)
		signer, pub, keyPEM = k, k.Public(), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)})
	} else {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		der, _ := x509.MarshalECPrivateKey(k)
		signer, pub, keyPEM = k, k.Public(), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, DNSNames: names, NotBefore: notBefore, NotAfter: notAfter,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	parent, parentKey := tmpl, signer
	if ca != nil {
		parent, parentKey = ca.cert, ca.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	chain := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if ca != nil {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})...)
	}
	return issued{cert: chain, key: keyPEM}
}

func valid(t *testing.T, names ...string) issued {
	return issue(t, now.Add(-24*time.Hour), now.Add(60*24*time.Hour), false, names...)
}

func TestCheck(t *testing.T) {
	good := valid(t, "Shop.Example", "www.shop.example")
	other := valid(t, "other.example")
	rsaCert := issue(t, now.Add(-time.Hour), now.Add(time.Hour), true, "rsa.example")
	expired := issue(t, now.Add(-48*time.Hour), now.Add(-time.Hour), false, "old.example")
	noNames := issue(t, now.Add(-time.Hour), now.Add(time.Hour), false)
	pkcs8 := func(in issued) issued {
		b, _ := pem.Decode(in.key)
		k, _ := x509.ParseECPrivateKey(b.Bytes)
		der, _ := x509.MarshalPKCS8PrivateKey(k)
		return issued{cert: in.cert, key: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})}
	}(good)
	cases := []struct {
		name      string
		c         Candidate
		want      error
		wantNames []string
	}{
		{"a certificate with SANs is imported under every name, lower-cased", Candidate{CertPEM: good.cert, KeyPEM: good.key}, nil, []string{"shop.example", "www.shop.example"}},
		{"an RSA key in PKCS #1 is read", Candidate{CertPEM: rsaCert.cert, KeyPEM: rsaCert.key}, nil, []string{"rsa.example"}},
		{"a key in PKCS #8 is read", Candidate{CertPEM: pkcs8.cert, KeyPEM: pkcs8.key}, nil, []string{"shop.example", "www.shop.example"}},
		{"another certificate's key is refused", Candidate{CertPEM: good.cert, KeyPEM: other.key}, ErrKeyMismatch, nil},
		{"an expired certificate is refused", Candidate{CertPEM: expired.cert, KeyPEM: expired.key}, ErrExpired, nil},
		{"garbage for a certificate is refused", Candidate{CertPEM: []byte("not pem"), KeyPEM: good.key}, ErrUnparsable, nil},
		{"a CERTIFICATE block that is not DER is refused", Candidate{CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1, 2}}), KeyPEM: good.key}, ErrUnparsable, nil},
		{"a bad chain certificate is refused", Candidate{CertPEM: append(slices.Clone(good.cert), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte{1}})...), KeyPEM: good.key}, ErrUnparsable, nil},
		{"a missing key is refused", Candidate{CertPEM: good.cert}, ErrUnparsable, nil},
		{"a key block that is no key is refused", Candidate{CertPEM: good.cert, KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}})}, ErrUnparsable, nil},
		{"a certificate naming no DNS name is refused", Candidate{CertPEM: noNames.cert, KeyPEM: noNames.key}, ErrNoNames, nil},
		{"a source entry that could not be read is refused with its reason", Candidate{Err: ErrUnparsable}, ErrUnparsable, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Check(tc.c, policy)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Check() error = %v, want %v", err, tc.want)
			}
			if err == nil && !slices.Equal(got.Names, tc.wantNames) {
				t.Errorf("Check() names = %v, want %v", got.Names, tc.wantNames)
			}
		})
	}
}

func b64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

func TestReadTraefik(t *testing.T) {
	a, b := valid(t, "a.example"), valid(t, "b.example")
	v3 := map[string]any{
		"le": map[string]any{
			"Account": map[string]any{"Email": "ops@example.com"},
			"Certificates": []any{
				map[string]any{"domain": map[string]any{"main": "a.example"}, "certificate": b64(a.cert), "key": b64(a.key), "Store": "default"},
				map[string]any{"domain": map[string]any{"main": "bad.example"}, "certificate": "%%%", "key": b64(a.key)},
			},
		},
		"dns":   map[string]any{"Certificates": []any{map[string]any{"domain": map[string]any{"main": "b.example", "sans": []string{"www.b.example"}}, "certificate": b64(b.cert), "key": b64(b.key)}}},
		"empty": nil,
	}
	data, _ := json.Marshal(v3)
	got, err := ReadTraefik(data)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("ReadTraefik() = %d candidates, want 3", len(got))
	}
	if got[0].Source != "resolver dns #1" || !slices.Equal(got[0].Names, []string{"b.example", "www.b.example"}) || got[0].Err != nil {
		t.Errorf("first candidate = %s %v %v, want resolver dns #1 with its SANs", got[0].Source, got[0].Names, got[0].Err)
	}
	if _, err := Check(got[1], policy); err != nil {
		t.Errorf("Check(a.example) = %v", err)
	}
	if !errors.Is(got[2].Err, ErrUnparsable) {
		t.Errorf("bad base64 entry: Err = %v, want ErrUnparsable", got[2].Err)
	}

	v1, _ := json.Marshal(map[string]any{
		"Account":      map[string]any{"Email": "ops@example.com"},
		"Certificates": []any{map[string]any{"Domain": map[string]any{"Main": "a.example", "SANs": nil}, "Certificate": b64(a.cert), "Key": b64(a.key)}},
	})
	got, err = ReadTraefik(v1)
	if err != nil || len(got) != 1 || got[0].Names[0] != "a.example" {
		t.Fatalf("ReadTraefik(v1) = %v, %v; want one candidate for a.example", got, err)
	}

	for _, bad := range []string{``, `[]`, `{"le": []}`, `{"le": {"Certificates": {}}}`, `not json`} {
		if _, err := ReadTraefik([]byte(bad)); err == nil {
			t.Errorf("ReadTraefik(%q) = nil error, want one", bad)
		}
	}
}

func TestReadCaddy(t *testing.T) {
	dir := t.TempDir()
	a, w := valid(t, "a.example"), valid(t, "*.apps.example")
	put := func(rel string, b []byte) {
		p := filepath.Join(dir, rel)
		os.MkdirAll(filepath.Dir(p), 0o700)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	iss := "acme-v02.api.letsencrypt.org-directory"
	put("certificates/"+iss+"/a.example/a.example.crt", a.cert)
	put("certificates/"+iss+"/a.example/a.example.key", a.key)
	put("certificates/"+iss+"/a.example/a.example.json", []byte(`{}`))
	put("certificates/"+iss+"/wildcard_.apps.example/wildcard_.apps.example.crt", w.cert)
	put("certificates/"+iss+"/wildcard_.apps.example/wildcard_.apps.example.key", w.key)
	put("certificates/"+iss+"/nokey.example/nokey.example.crt", a.cert)
	put("certificates/"+iss+"/stray.crt", a.cert)
	put("acme/"+iss+"/users/ops/ops.key", a.key)

	for _, root := range []string{dir, filepath.Join(dir, "certificates")} {
		got, err := ReadCaddy(root)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, c := range got {
			names = append(names, c.Names[0])
		}
		if want := []string{"a.example", "nokey.example", "*.apps.example"}; !slices.Equal(names, want) {
			t.Fatalf("ReadCaddy(%s) names = %v, want %v", root, names, want)
		}
		if !errors.Is(got[1].Err, ErrUnparsable) {
			t.Errorf("certificate without its key: Err = %v, want ErrUnparsable", got[1].Err)
		}
		if c, err := Check(got[2], policy); err != nil || c.Names[0] != "*.apps.example" {
			t.Errorf("Check(wildcard) = %v, %v", c.Names, err)
		}
	}
	if _, err := ReadCaddy(t.TempDir()); err == nil {
		t.Error("ReadCaddy(empty dir) = nil error, want one")
	}
}

// TestWriteIsWhatCertmagicLoads writes into the edge's bbolt store and has
// certmagic, configured as the edge configures it for the same CA, load
// the certificate from there: no order needed.
func TestWriteIsWhatCertmagicLoads(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "edge.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	st, err := certs.NewBoltStorage(db)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const ca = "https://127.0.0.1:14000/dir"
	in := valid(t, "shop.example", "www.shop.example")
	c, err := Check(Candidate{CertPEM: in.cert, KeyPEM: in.key}, policy)
	if err != nil {
		t.Fatal(err)
	}
	out, err := Write(ctx, st, IssuerKey(ca), c)
	if err != nil || !slices.Equal(out.Written, c.Names) {
		t.Fatalf("Write() = %+v, %v; want both names written", out, err)
	}

	cache := certmagic.NewCache(certmagic.CacheOptions{GetConfigForCert: func(certmagic.Certificate) (*certmagic.Config, error) { return nil, nil }})
	t.Cleanup(cache.Stop)
	cfg := certmagic.New(cache, certmagic.Config{Storage: st})
	cfg.Issuers = []certmagic.Issuer{certmagic.NewACMEIssuer(cfg, certmagic.ACMEIssuer{CA: ca})}
	for _, name := range c.Names {
		got, err := cfg.CacheManagedCertificate(ctx, name)
		if err != nil {
			t.Fatalf("certmagic load %s: %v", name, err)
		}
		if got.Leaf.SerialNumber.Cmp(c.Leaf.SerialNumber) != 0 {
			t.Errorf("certmagic loaded serial %v for %s, want %v", got.Leaf.SerialNumber, name, c.Leaf.SerialNumber)
		}
	}

	again, err := Write(ctx, st, IssuerKey(ca), c)
	if err != nil || len(again.Written) != 0 || !slices.Equal(again.Unchanged, c.Names) {
		t.Errorf("second Write() = %+v, %v; want every name unchanged", again, err)
	}

	// A later certificate in the store (the edge renewed it) is kept; an
	// earlier one is replaced.
	later := issue(t, now.Add(-time.Hour), now.Add(80*24*time.Hour), false, "shop.example", "www.shop.example")
	lc, _ := Check(Candidate{CertPEM: later.cert, KeyPEM: later.key}, policy)
	if out, err := Write(ctx, st, IssuerKey(ca), lc); err != nil || !slices.Equal(out.Written, lc.Names) {
		t.Fatalf("Write(later) = %+v, %v", out, err)
	}
	if out, err := Write(ctx, st, IssuerKey(ca), c); err != nil || !slices.Equal(out.Kept, c.Names) || len(out.Written) != 0 {
		t.Errorf("Write(earlier over later) = %+v, %v; want every name kept", out, err)
	}
}

func TestIssuerKey(t *testing.T) {
	for ca, want := range map[string]string{
		"https://acme-v02.api.letsencrypt.org/directory": "acme-v02.api.letsencrypt.org-directory",
		"https://127.0.0.1:14000/dir":                    "127.0.0.1:14000-dir",
	} {
		if got := IssuerKey(ca); got != want {
			t.Errorf("IssuerKey(%q) = %q, want %q", ca, got, want)
		}
	}
}

// memStore is a Store in memory that can be told to fail.
type memStore struct {
	m    map[string][]byte
	fail error
}

func (s *memStore) Load(_ context.Context, key string) ([]byte, error) {
	if s.fail != nil {
		return nil, s.fail
	}
	if v, ok := s.m[key]; ok {
		return v, nil
	}
	return nil, fs.ErrNotExist
}

func (s *memStore) Store(_ context.Context, key string, v []byte) error {
	if s.fail != nil {
		return s.fail
	}
	s.m[key] = v
	return nil
}

func TestRun(t *testing.T) {
	single, wild, other := valid(t, "single.example"), valid(t, "*.apps.example"), valid(t, "other.example")
	expired := issue(t, now.Add(-48*time.Hour), now.Add(-time.Hour), false, "old.example")
	cands := []Candidate{
		{Source: "s1", Names: []string{"single.example"}, CertPEM: single.cert, KeyPEM: single.key},
		{Source: "s2", Names: []string{"*.apps.example"}, CertPEM: wild.cert, KeyPEM: wild.key},
		{Source: "s3", Names: []string{"old.example"}, CertPEM: expired.cert, KeyPEM: expired.key},
		{Source: "s4", Names: []string{"other.example"}, CertPEM: other.cert, KeyPEM: single.key},
		{Source: "s5", Names: []string{"junk.example"}, CertPEM: []byte("junk"), KeyPEM: []byte("junk")},
	}
	st := &memStore{m: map[string][]byte{}}
	var out strings.Builder
	sum, err := Run(context.Background(), cands, Options{Store: st, IssuerKey: "ca", Policy: policy}, &out)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Imported != 2 || sum.Refused != 3 || !slices.Equal(sum.Lapsing, []string{"*.apps.example"}) {
		t.Errorf("Run() = %+v, want 2 imported, 3 refused, *.apps.example lapsing", sum)
	}
	for _, want := range []string{
		`imported   "single.example": not after`, `imported   "*.apps.example":`, `warning    "*.apps.example": no DNS-01 provider renews it`,
		`refused    "old.example": expired on`, `refused    "other.example": key does not match`, `refused    "junk.example": unparsable PEM`,
		"5 certificates: 2 imported, 0 unchanged, 0 kept, 3 refused",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("Run() output lacks %q:\n%s", want, out.String())
		}
	}
	for _, refused := range []string{"old.example", "other.example", "junk.example"} {
		for k := range st.m {
			if strings.Contains(k, refused) {
				t.Errorf("refused %s was written: %s", refused, k)
			}
		}
	}

	out.Reset()
	sum, err = Run(context.Background(), cands, Options{Store: st, IssuerKey: "ca", Policy: policy, Renewed: func(b string) bool { return b == "apps.example" }}, &out)
	if err != nil || sum.Unchanged != 2 || sum.Imported != 0 || len(sum.Lapsing) != 0 {
		t.Errorf("second Run() = %+v, %v; want 2 unchanged and no lapse warning with DNS-01 renewing the base", sum, err)
	}

	st.fail = errors.New("node down")
	if _, err := Run(context.Background(), cands[:1], Options{Store: st, IssuerKey: "ca", Policy: policy}, &out); err == nil {
		t.Error("Run() with a failing store = nil error, want one")
	}
}

// TestCheckRefusesNamesThatAreNoHostname: certmagic files a name under
// KeyBuilder.Safe(name), which drops "/", "..", spaces and the like, so a
// certificate naming "a/b.example" would land on the keys of
// "ab.example" and replace that name's certificate.
func TestCheckRefusesNamesThatAreNoHostname(t *testing.T) {
	for _, name := range []string{"a/b.example", "../x.example", "x..y.example", "a b.example", "a*b.example", "*.*.example", "a+b.example", "a:b.example", "x.example/..", ".x.example"} {
		t.Run(name, func(t *testing.T) {
			in := valid(t, name)
			if c, err := Check(Candidate{CertPEM: in.cert, KeyPEM: in.key}, policy); !errors.Is(err, ErrBadName) {
				t.Errorf("Check(%q) = names %v, error %v; want %v", name, c.Names, err, ErrBadName)
			}
		})
	}
	for _, name := range []string{"Shop.Example.", "*.apps.example", "under_score.example", "xn--bcher-kva.example", "a-b.example"} {
		in := valid(t, name)
		if _, err := Check(Candidate{CertPEM: in.cert, KeyPEM: in.key}, policy); err != nil {
			t.Errorf("Check(%q) = %v, want it imported", name, err)
		}
	}
}

// failAfter is a memStore whose Store fails once, after n writes
// succeeded (a node that drops one request).
type failAfter struct {
	*memStore
	n int
}

func (s *failAfter) Store(ctx context.Context, key string, v []byte) error {
	s.n--
	if s.n == -1 {
		return errors.New("node down")
	}
	return s.memStore.Store(ctx, key, v)
}

// TestWriteCutShortKeepsTheStoredPair: replacing a name's certificate
// writes its key, then its certificate; a store that fails in between
// must not leave the new key beside the old certificate, a pair
// certmagic refuses to load (the name would lose HTTPS).
func TestWriteCutShortKeepsTheStoredPair(t *testing.T) {
	ctx := context.Background()
	old := valid(t, "shop.example")
	oc, err := Check(Candidate{CertPEM: old.cert, KeyPEM: old.key}, policy)
	if err != nil {
		t.Fatal(err)
	}
	mem := &memStore{m: map[string][]byte{}}
	if _, err := Write(ctx, mem, "ca", oc); err != nil {
		t.Fatal(err)
	}
	later := issue(t, now.Add(-time.Hour), now.Add(80*24*time.Hour), false, "shop.example")
	lc, err := Check(Candidate{CertPEM: later.cert, KeyPEM: later.key}, policy)
	if err != nil {
		t.Fatal(err)
	}
	st := &failAfter{memStore: mem, n: 1} // the key is written, the certificate is not
	if _, err := Write(ctx, st, "ca", lc); err == nil {
		t.Fatal("Write() with a store failing mid-way = nil error, want one")
	}
	certPEM := mem.m[certmagic.StorageKeys.SiteCert("ca", "shop.example")]
	keyPEM := mem.m[certmagic.StorageKeys.SitePrivateKey("ca", "shop.example")]
	if _, err := Check(Candidate{CertPEM: certPEM, KeyPEM: keyPEM}, policy); err != nil {
		t.Errorf("after a Write cut short, the stored pair does not load: %v", err)
	}
}
