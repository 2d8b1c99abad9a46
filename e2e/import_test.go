package e2e

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mholt/acmez/v3"
	"github.com/mholt/acmez/v3/acme"

	"github.com/scafo/scafo-edge/certs/certstest"
	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
	"github.com/scafo/scafo-edge/node/nodetest"
)

// pebbleCert is a certificate Pebble issued: its chain and key as PEM.
type pebbleCert struct {
	chain, key []byte
	serial     string
}

// txtSolver answers DNS-01 through Pebble's challenge server, so a test
// obtains any name, wildcards included, with no listener of its own.
type txtSolver struct{ p *certstest.Pebble }

func (s txtSolver) Present(_ context.Context, ch acme.Challenge) error {
	return s.p.SetTXT(ch.DNS01TXTRecordName(), ch.DNS01KeyAuthorization())
}

func (s txtSolver) CleanUp(_ context.Context, ch acme.Challenge) error {
	return s.p.ClearTXT(ch.DNS01TXTRecordName())
}

// pebbleIssuer obtains certificates from p with an account of its own, as
// Traefik would have.
type pebbleIssuer struct {
	client  acmez.Client
	account acme.Account
}

func newPebbleIssuer(t *testing.T, p *certstest.Pebble) *pebbleIssuer {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(p.RootPEM)
	iss := &pebbleIssuer{client: acmez.Client{
		Client: &acme.Client{Directory: p.DirectoryURL, HTTPClient: &http.Client{Timeout: 30 * time.Second,
			Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}},
		ChallengeSolvers: map[string]acmez.Solver{acme.ChallengeTypeDNS01: txtSolver{p}},
	}}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	acct, err := iss.client.NewAccount(context.Background(), acme.Account{
		Contact: []string{"mailto:old-proxy@example.test"}, TermsOfServiceAgreed: true, PrivateKey: key})
	if err != nil {
		t.Fatalf("pebble account: %v", err)
	}
	iss.account = acct
	return iss
}

// obtain orders a certificate for names; non-zero notBefore and notAfter
// are asked of Pebble, which honours them (an already expired certificate
// is one Pebble issued with both in the past).
func (iss *pebbleIssuer) obtain(t *testing.T, notBefore, notAfter time.Time, names ...string) pebbleCert {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	csr, err := acmez.NewCSR(key, names)
	if err != nil {
		t.Fatal(err)
	}
	params, err := acmez.OrderParametersFromCSR(iss.account, csr)
	if err != nil {
		t.Fatal(err)
	}
	params.NotBefore, params.NotAfter = notBefore, notAfter
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got, err := iss.client.ObtainCertificate(ctx, params)
	if err != nil || len(got) == 0 {
		t.Fatalf("obtain %v from pebble: %v", names, err)
	}
	return pebbleCert{chain: got[0].ChainPEM, key: pemKey(t, key), serial: serialOf(t, got[0].ChainPEM)}
}

func pemKey(t *testing.T, k crypto.Signer) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

func serialOf(t *testing.T, chain []byte) string {
	t.Helper()
	b, _ := pem.Decode(chain)
	if b == nil {
		t.Fatalf("chain is not PEM: %q", chain)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c.SerialNumber.String()
}

// runImport runs the binary's import command with args and returns what it
// printed and its error (an *exec.ExitError on exit 1).
func runImport(t *testing.T, args ...string) (string, error) {
	t.Helper()
	return runImportWithin(t, 60*time.Second, args...)
}

// runImportWithin is runImport killing the import after d: an import
// still running then is a hung one (its error says "signal: killed").
func runImportWithin(t *testing.T, d time.Duration, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, edgeBinary, append([]string{"import"}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("scafo-edge import %s:\n%s", strings.Join(args, " "), out.String())
	return out.String(), err
}

// servedSerial is the serial of the certificate the edge serves for name,
// verified against Pebble's issuing root; an error when the handshake
// fails.
func servedSerial(addr, name string, roots *x509.CertPool) (string, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, &tls.Config{RootCAs: roots, ServerName: name})
	if err != nil {
		return "", err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
}

// waitServed waits until the edge serves name with the certificate of
// serial (the held wildcard loads after the first document).
func waitServed(t *testing.T, e *runningEdge, name, serial string, roots *x509.CertPool) {
	t.Helper()
	testsupport.WaitForNil(t, 20*time.Second, "edge serving "+name, func() error {
		got, err := servedSerial(e.HTTPSAddr, name, roots)
		if err != nil {
			return err
		}
		if got != serial {
			return fmt.Errorf("serial %s, want %s (the imported one)", got, serial)
		}
		return nil
	})
}

// importDocument routes every name the import tests use to a.
func importDocument(a string) *node.Document {
	var routes []node.Route
	for _, h := range []string{"single.example", "san.example", "www.san.example", "two.example", "*.tenant.example", "expired.example", "mismatch.example"} {
		routes = append(routes, node.Route{Host: h, Application: "app", Upstreams: []node.Upstream{{Node: "n", Address: a}}})
	}
	return &node.Document{V: 1, Routes: routes}
}

// TestImportTraefikThroughTheBinary imports a Traefik acme.json of five
// certificates Pebble issued (one name, one with SANs, a wildcard, an
// expired one, one stored with another certificate's key): the import
// writes three and refuses two, and the edge, pointed at the same Pebble,
// serves the three (same serials) with no new order.
func TestImportTraefikThroughTheBinary(t *testing.T) {
	p := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: testsupport.FreePort(t), TLSPort: testsupport.FreePort(t)})
	rootFile := pebbleRootFile(t, p)
	iss := newPebbleIssuer(t, p)
	var zero time.Time
	single := iss.obtain(t, zero, zero, "single.example")
	sans := iss.obtain(t, zero, zero, "san.example", "www.san.example")
	wild := iss.obtain(t, zero, zero, "*.tenant.example")
	expired := iss.obtain(t, time.Now().Add(-72*time.Hour), time.Now().Add(-24*time.Hour), "expired.example")
	mismatch := iss.obtain(t, zero, zero, "mismatch.example")
	p.WaitOrderCount(t, 5)

	type tcert struct {
		Domain      map[string]any `json:"domain"`
		Certificate []byte         `json:"certificate"`
		Key         []byte         `json:"key"`
		Store       string         `json:"Store"`
	}
	entry := func(main string, sans []string, c pebbleCert, key []byte) tcert {
		return tcert{Domain: map[string]any{"main": main, "sans": sans}, Certificate: c.chain, Key: key, Store: "default"}
	}
	acmeJSON, _ := json.MarshalIndent(map[string]any{
		"le": map[string]any{
			"Account": map[string]any{"Email": "old-proxy@example.test", "KeyType": "4096"},
			"Certificates": []tcert{
				entry("single.example", nil, single, single.key),
				entry("san.example", []string{"www.san.example"}, sans, sans.key),
				entry("expired.example", nil, expired, expired.key),
				entry("mismatch.example", nil, mismatch, single.key),
			},
		},
		"dns": map[string]any{"Account": nil, "Certificates": []tcert{entry("*.tenant.example", nil, wild, wild.key)}},
	}, "", "  ")
	acmeFile := filepath.Join(t.TempDir(), "acme.json")
	if err := os.WriteFile(acmeFile, acmeJSON, 0o600); err != nil {
		t.Fatal(err)
	}

	n := nodetest.New(t, nodetest.Options{})
	n.SetDocument(importDocument(hostOf(app(t, "A"))))
	state := t.TempDir()
	store := []string{"--node", n.URL(), "--cert-store", "local", "--state-dir", state, "--acme-ca", p.DirectoryURL,
		"--acme-ca-root", importRoots(t, p, single)}

	out, err := runImport(t, append([]string{"traefik", acmeFile}, store...)...)
	if code := exitCode(err); code != 1 {
		t.Errorf("import with two bad certificates: exit %d, want 1", code)
	}
	for _, want := range []string{
		`imported   "single.example":`, `imported   "san.example", "www.san.example":`, `imported   "*.tenant.example":`,
		`refused    "expired.example": expired on`, `refused    "mismatch.example": key does not match the certificate`,
		`warning    "*.tenant.example": no DNS-01 provider renews it`,
		"5 certificates: 3 imported, 0 unchanged, 0 kept, 2 refused",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("import output lacks %q", want)
		}
	}
	out, _ = runImport(t, append([]string{"traefik", acmeFile}, store...)...)
	if !strings.Contains(out, "5 certificates: 0 imported, 3 unchanged, 0 kept, 2 refused") {
		t.Errorf("second import changed something:\n%s", out)
	}

	orders := p.OrderCount()
	e := startEdge(t, "--node", n.URL(), "--cert-store", "local", "--state-dir", state, "--tls", "acme",
		"--acme-ca", p.DirectoryURL, "--acme-ca-root", rootFile, "--cert-prefetch=false")
	roots := p.IssuerRoots(t)
	for name, serial := range map[string]string{
		"single.example": single.serial, "san.example": sans.serial, "www.san.example": sans.serial, "x.tenant.example": wild.serial,
	} {
		waitServed(t, e, name, serial, roots)
	}
	if got := p.OrderCount(); got != orders {
		t.Errorf("Pebble orders = %d after serving the imported certificates, want %d (no new order)", got, orders)
	}
	if !e.logged("wildcard certificate from storage served without renewal") {
		t.Errorf("the edge did not log that the imported wildcard lapses")
	}
	if !statusFlagsNotRenewed(t, e, "*.tenant.example") {
		t.Errorf("status.json does not flag the unrenewed wildcard")
	}

	// The running edge holds edge.db: a local import says so.
	out, err = runImport(t, append([]string{"traefik", acmeFile}, store...)...)
	if exitCode(err) != 1 || !strings.Contains(out, "in use by a running edge: stop it") {
		t.Errorf("import beside a running edge: %v, want a clear refusal", err)
	}
	t.Logf("figures: Traefik acme.json of 5 Pebble certificates: 3 imported, 2 refused; the edge served the 3 with %d new order(s)", p.OrderCount()-orders)
}

// importRoots writes the roots an import of p's certificates is run with
// (--acme-ca-root): p's HTTPS root, as serve is given it, and the
// intermediate that signed c. Pebble makes a new issuing root at every
// start and serves it only on its management port, which certstest
// hands out as a pool; the intermediate every chain it issues ends in is
// as good an anchor for the chain check.
func importRoots(t *testing.T, p *certstest.Pebble, c pebbleCert) string {
	t.Helper()
	var last *pem.Block
	for rest := c.chain; ; {
		b, r := pem.Decode(rest)
		if b == nil {
			break
		}
		last, rest = b, r
	}
	if last == nil {
		t.Fatal("pebble chain has no certificate")
	}
	file := filepath.Join(t.TempDir(), "import-roots.pem")
	if err := os.WriteFile(file, append(slices.Clone(p.RootPEM), pem.EncodeToMemory(last)...), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}

// statusFlagsNotRenewed reports whether the edge's status.json lists the
// certificate for name as one nothing renews.
func statusFlagsNotRenewed(t *testing.T, e *runningEdge, name string) bool {
	t.Helper()
	_, body := e.admin(t, "/status.json")
	var st struct {
		Certificates []struct {
			Names      []string `json:"names"`
			NotRenewed bool     `json:"not_renewed"`
		} `json:"certificates"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("status.json: %v", err)
	}
	for _, c := range st.Certificates {
		if slices.Contains(c.Names, name) {
			return c.NotRenewed
		}
	}
	return false
}

// TestImportLogsTheTimeThroughTheBinary is issue 49: the import's console
// log printed "<nil>" where each line's time belongs. A state directory
// open to others makes the import log a warning.
func TestImportLogsTheTimeThroughTheBinary(t *testing.T) {
	state := filepath.Join(t.TempDir(), "state")
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}
	ca := newIssueCA(t)
	acmeFile := writeAcmeJSON(t, map[string][]map[string]any{"le": {
		traefikEntry("shop.example", ca.issue(t, time.Now().Add(30*24*time.Hour), "shop.example")),
	}})
	out, err := runImport(t, "traefik", acmeFile, "--cert-store", "local", "--state-dir", state, "--acme-ca-root", ca.rootFile)
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	var warning string
	for line := range strings.Lines(out) {
		if strings.Contains(line, "state directory is accessible") {
			warning = line
		}
	}
	if warning == "" || strings.Contains(warning, "<nil>") || !regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d`).MatchString(warning) {
		t.Errorf("import logged %q, want the state directory warning with its time", warning)
	}
}
