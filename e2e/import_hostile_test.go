package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/certs"
	"github.com/scafo/scafo-edge/node"
)

// issueCA is a certificate authority made for a test, trusted by the
// import through --acme-ca-root: what an attacker who holds a publicly
// trusted certificate, or an operator's private CA, signs with.
type issueCA struct {
	cert     *x509.Certificate
	key      *ecdsa.PrivateKey
	rootFile string
}

func newIssueCA(t *testing.T) *issueCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "import test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().AddDate(200, 0, 0),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &issueCA{cert: cert, key: key, rootFile: filepath.Join(t.TempDir(), "root.pem")}
	if err := os.WriteFile(ca.rootFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return ca
}

// issue makes a certificate for names valid until notAfter, signed by ca
// (nil: by itself), with its serial.
func (ca *issueCA) issue(t *testing.T, notAfter time.Time, names ...string) pebbleCert {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, DNSNames: names, NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	parent, parentKey := tmpl, key
	if ca != nil {
		parent, parentKey = ca.cert, ca.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	if err != nil {
		t.Fatal(err)
	}
	return pebbleCert{chain: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), key: pemKey(t, key), serial: serial.String()}
}

// writeAcmeJSON writes a Traefik v3 acme.json with the given entries per
// resolver and returns its path.
func writeAcmeJSON(t *testing.T, resolvers map[string][]map[string]any) string {
	t.Helper()
	top := map[string]any{}
	for name, certs := range resolvers {
		top[name] = map[string]any{"Account": map[string]any{"Email": "old@example.test"}, "Certificates": certs}
	}
	b, err := json.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "acme.json")
	if err := os.WriteFile(file, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

func traefikEntry(main string, c pebbleCert) map[string]any {
	return map[string]any{"domain": map[string]any{"main": main}, "certificate": c.chain, "key": c.key, "Store": "default"}
}

// storedSerial is the serial of the certificate edge.db in state holds
// for name under the key of ca, "" when none is.
func storedSerial(t *testing.T, state, ca, name string) string {
	t.Helper()
	db, err := node.OpenState(state, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st, err := certs.NewBoltStorage(db)
	if err != nil {
		t.Fatal(err)
	}
	b, err := st.Load(context.Background(), certmagic.StorageKeys.SiteCert((&certmagic.ACMEIssuer{CA: ca}).IssuerKey(), name))
	if err != nil {
		return ""
	}
	return serialOf(t, b)
}

// TestImportRefusesHostileCertificatesThroughTheBinary is issue 50 item
// 3 as an attacker played it: an acme.json holding the real
// *.example.com and, after it, certificates that would take the name
// over: one for wildcard_.example.com (certmagic's storage key for
// *.example.com) valid for longer, one for *.example.com valid until
// 2126 (the later NotAfter "wins" and is never renewed), self-signed
// ones for bank.example.net and for *.com, one for *.co.uk. Each is
// refused with its name and reason, the real one is imported, and it is
// what the store holds. --allow-untrusted lets the self-signed
// bank.example.net in, and nothing else.
func TestImportRefusesHostileCertificatesThroughTheBinary(t *testing.T) {
	ca := newIssueCA(t)
	const acmeCA = "https://acme.invalid/directory"
	real := ca.issue(t, time.Now().Add(90*24*time.Hour), "*.example.com")
	acmeFile := writeAcmeJSON(t, map[string][]map[string]any{"le": {
		traefikEntry("*.example.com", real),
		traefikEntry("wildcard_.example.com", ca.issue(t, time.Now().Add(300*24*time.Hour), "wildcard_.example.com")),
		traefikEntry("*.example.com", ca.issue(t, time.Date(2126, 1, 1, 0, 0, 0, 0, time.UTC), "*.example.com")),
		traefikEntry("bank.example.net", (*issueCA)(nil).issue(t, time.Now().Add(30*24*time.Hour), "bank.example.net", "*.com")),
		traefikEntry("bank.example.net", (*issueCA)(nil).issue(t, time.Now().Add(30*24*time.Hour), "bank.example.net")),
		traefikEntry("*.co.uk", ca.issue(t, time.Now().Add(30*24*time.Hour), "*.co.uk")),
	}})
	state := t.TempDir()
	args := []string{"traefik", acmeFile, "--cert-store", "local", "--state-dir", state, "--acme-ca", acmeCA, "--acme-ca-root", ca.rootFile}

	out, err := runImport(t, args...)
	if code := exitCode(err); code != 1 {
		t.Errorf("import of hostile certificates: exit %d, want 1", code)
	}
	for _, want := range []string{
		`imported   "*.example.com":`,
		`refused    "wildcard_.example.com": certificate names a DNS name filed under another name's storage key: "wildcard_.example.com" is filed as "wildcard_.example.com", the key of "*.example.com"`,
		`refused    "*.example.com": valid for longer than a CA issues:`,
		`refused    "bank.example.net": certificate names a wildcard for a public suffix: "*.com"`,
		`refused    "bank.example.net": certificate chain is not trusted:`,
		`refused    "*.co.uk": certificate names a wildcard for a public suffix: "*.co.uk"`,
		"6 certificates: 1 imported, 0 unchanged, 0 kept, 5 refused",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("import output lacks %q", want)
		}
	}
	if got := storedSerial(t, state, acmeCA, "*.example.com"); got != real.serial {
		t.Errorf("the store holds serial %s for *.example.com, want %s (the real one)", got, real.serial)
	}
	if got := storedSerial(t, state, acmeCA, "bank.example.net"); got != "" {
		t.Errorf("the store holds a self-signed bank.example.net (serial %s)", got)
	}

	out, err = runImport(t, append(args, "--allow-untrusted")...)
	if code := exitCode(err); code != 1 {
		t.Errorf("import --allow-untrusted: exit %d, want 1 (four still refused)", code)
	}
	for _, want := range []string{
		`imported   "bank.example.net":`,
		`refused    "bank.example.net": certificate names a wildcard for a public suffix: "*.com"`,
		"6 certificates: 1 imported, 1 unchanged, 0 kept, 4 refused",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("import --allow-untrusted output lacks %q", want)
		}
	}
	if got := storedSerial(t, state, acmeCA, "*.example.com"); got != real.serial {
		t.Errorf("after --allow-untrusted the store holds serial %s for *.example.com, want %s", got, real.serial)
	}
}

// TestImportCaddyRefusesHostileFilesThroughTheBinary is issue 50 item 4:
// a Caddy directory with a good certificate beside a file an attacker
// planted. A FIFO hung the import (past SIGTERM), a link to /dev/zero
// would have read until memory ran out; each planted file is refused,
// named, within the bound, and the good certificate is still imported.
func TestImportCaddyRefusesHostileFilesThroughTheBinary(t *testing.T) {
	ca := newIssueCA(t)
	const acmeCA = "https://acme.invalid/directory"
	good := ca.issue(t, time.Now().Add(30*24*time.Hour), "good.example")
	bad := ca.issue(t, time.Now().Add(30*24*time.Hour), "bad.example")
	plant := map[string]func(t *testing.T, crt, key string){
		"a FIFO for the certificate": func(t *testing.T, crt, key string) { mkfifo(t, crt); writeFile(t, key, bad.key) },
		"a FIFO for the key":         func(t *testing.T, crt, key string) { writeFile(t, crt, bad.chain); mkfifo(t, key) },
		"a link to /dev/zero":        func(t *testing.T, crt, key string) { symlink(t, "/dev/zero", crt); writeFile(t, key, bad.key) },
		"a link to a certificate": func(t *testing.T, crt, key string) {
			target := filepath.Join(t.TempDir(), "bad.crt")
			writeFile(t, target, bad.chain)
			symlink(t, target, crt)
			writeFile(t, key, bad.key)
		},
		"a certificate of 2 MiB": func(t *testing.T, crt, key string) {
			writeFile(t, crt, append(bad.chain, make([]byte, 2<<20)...))
			writeFile(t, key, bad.key)
		},
	}
	wantReason := map[string]string{
		"a FIFO for the certificate": `bad.example.crt": not a regular file (a named pipe)`,
		"a FIFO for the key":         `bad.example.key": not a regular file (a named pipe)`,
		"a link to /dev/zero":        `bad.example.crt": not a regular file (a symbolic link)`,
		"a link to a certificate":    `bad.example.crt": not a regular file (a symbolic link)`,
		"a certificate of 2 MiB":     `bad.example.crt": file too large:`,
	}
	for name, planted := range plant {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "caddy")
			iss := (&certmagic.ACMEIssuer{CA: acmeCA}).IssuerKey()
			crt := func(n string) string { return filepath.Join(dir, certmagic.StorageKeys.SiteCert(iss, n)) }
			key := func(n string) string { return filepath.Join(dir, certmagic.StorageKeys.SitePrivateKey(iss, n)) }
			for _, n := range []string{"good.example", "bad.example"} {
				if err := os.MkdirAll(filepath.Dir(crt(n)), 0o700); err != nil {
					t.Fatal(err)
				}
			}
			writeFile(t, crt("good.example"), good.chain)
			writeFile(t, key("good.example"), good.key)
			planted(t, crt("bad.example"), key("bad.example"))

			out, err := runImportWithin(t, 20*time.Second, "caddy", dir, "--cert-store", "local", "--state-dir", t.TempDir(),
				"--acme-ca", acmeCA, "--acme-ca-root", ca.rootFile)
			if code := exitCode(err); code != 1 {
				t.Fatalf("import caddy with %s: exit %d (%v), want 1 within 20s", name, code, err)
			}
			for _, want := range []string{`imported   "good.example":`, `refused    "bad.example": read "`, wantReason[name],
				"2 certificates: 1 imported, 0 unchanged, 0 kept, 1 refused"} {
				if !strings.Contains(out, want) {
					t.Errorf("import output lacks %q", want)
				}
			}
		})
	}
}

// TestImportTraefikRefusesHostileFileThroughTheBinary: the acme.json
// given is read only when it is a regular file (a link to one will do: it
// is the operator's own path) of at most 64 MiB, refused at once
// otherwise, with its name.
func TestImportTraefikRefusesHostileFileThroughTheBinary(t *testing.T) {
	cases := map[string]struct {
		make func(t *testing.T, path string)
		want string
	}{
		"a FIFO":              {func(t *testing.T, path string) { mkfifo(t, path) }, "not a regular file (a named pipe)"},
		"a link to /dev/zero": {func(t *testing.T, path string) { symlink(t, "/dev/zero", path) }, "not a regular file (a device)"},
		"a file over 64 MiB": {func(t *testing.T, path string) {
			writeFile(t, path, nil)
			if err := os.Truncate(path, 64<<20+1); err != nil { // sparse: no disk spent
				t.Fatal(err)
			}
		}, "file too large: 67108865 bytes, more than 67108864"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "acme.json")
			tc.make(t, path)
			out, err := runImportWithin(t, 20*time.Second, "traefik", path, "--cert-store", "local", "--state-dir", t.TempDir())
			if code := exitCode(err); code != 1 {
				t.Fatalf("import traefik of %s: exit %d (%v), want 1 within 20s", name, code, err)
			}
			if want := `read "` + path + `": ` + tc.want; !strings.Contains(out, want) {
				t.Errorf("import output lacks %q", want)
			}
		})
	}
}

// TestImportQuotesWhatItPrintsThroughTheBinary is issue 50 item 4's
// second half: names, resolver names and Caddy directory names from
// another proxy's files reached the terminal raw, and an escape sequence
// cleared the screen. Nothing the files hold is printed unescaped.
func TestImportQuotesWhatItPrintsThroughTheBinary(t *testing.T) {
	ca := newIssueCA(t)
	const acmeCA = "https://acme.invalid/directory"
	const clear, title = "\x1b[2J\x1b[H", "\x1b]0;pwned\x07"
	good := ca.issue(t, time.Now().Add(30*24*time.Hour), "good.example")
	acmeFile := writeAcmeJSON(t, map[string][]map[string]any{clear: {
		traefikEntry(title+"good.example", good),
		traefikEntry(clear+"evil.example", ca.issue(t, time.Now().Add(30*24*time.Hour), "evil"+title+".example")),
		{"domain": map[string]any{"main": title}, "certificate": "%%%", "key": "%%%"},
	}})
	caddyDir := filepath.Join(t.TempDir(), "caddy")
	site := filepath.Join(caddyDir, "certificates", "acme", clear+"x.example")
	if err := os.MkdirAll(site, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(site, clear+"x.example.crt"), good.chain)

	for _, args := range [][]string{{"traefik", acmeFile}, {"caddy", caddyDir}} {
		out, err := runImport(t, append(args, "--cert-store", "local", "--state-dir", t.TempDir(), "--acme-ca", acmeCA, "--acme-ca-root", ca.rootFile)...)
		if code := exitCode(err); code != 1 {
			t.Errorf("import %s: exit %d, want 1", args[0], code)
		}
		if strings.ContainsAny(out, "\x1b\x07") {
			t.Errorf("import %s printed an escape sequence raw: %q", args[0], out)
		}
		if !strings.Contains(out, `\x1b[2J\x1b[H`) {
			t.Errorf("import %s output lacks the escaped sequence", args[0])
		}
	}
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func mkfifo(t *testing.T, path string) {
	t.Helper()
	if err := syscall.Mkfifo(path, 0o600); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, path string) {
	t.Helper()
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}
