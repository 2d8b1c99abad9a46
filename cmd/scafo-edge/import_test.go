package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// selfSigned returns a certificate for name and its key, as PEM.
func selfSigned(t *testing.T, name string) (cert, key []byte) {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, k.Public(), k)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(k)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

func TestImportCommand(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cert, key := selfSigned(t, "shop.example")
	good, _ := json.Marshal(map[string]any{"le": map[string]any{"Certificates": []any{
		map[string]any{"domain": map[string]any{"main": "shop.example"}, "certificate": cert, "key": key},
	}}})
	goodFile := write("acme.json", good)
	badJSON := write("bad.json", []byte("{not json"))
	local := func(args ...string) []string {
		return append(args, "--cert-store", "local", "--state-dir", filepath.Join(dir, "state"))
	}

	cases := []struct {
		name    string
		args    []string
		wantErr string // "" for success
		wantOut string
	}{
		{"no source is an error", nil, "want traefik PATH or caddy DIR", ""},
		{"an unknown source is an error", []string{"nginx", "x"}, "want traefik PATH or caddy DIR", ""},
		{"a source without a path is an error", local("traefik"), "no path given", ""},
		{"two paths are an error", local("traefik", goodFile, "extra"), "unexpected arguments", ""},
		{"a missing file is an error", local("traefik", filepath.Join(dir, "none.json")), "no such file", ""},
		{"a file that is not acme.json is an error", local("traefik", badJSON), "acme.json:", ""},
		{"a directory without Caddy's certificates is an error", local("caddy", dir), "no certificates directory", ""},
		{"--tls other than acme is refused", local("traefik", goodFile, "--tls", "internal"), "--tls", ""},
		{"a bad serve flag is refused as serve refuses it", []string{"traefik", goodFile, "--cert-store", "bucket"}, "--cert-store", ""},
		{"a self-signed certificate is refused without --allow-untrusted", local("traefik", goodFile), "1 certificate(s) refused", "certificate chain is not trusted"},
		{"a missing --acme-ca-root is an error", local("traefik", goodFile, "--acme-ca-root", filepath.Join(dir, "none.pem")), "--acme-ca-root", ""},
		{"a self-signed certificate is trusted as --acme-ca-root", local("traefik", goodFile, "--acme-ca-root", string(cert)), "", "1 certificates: 1 imported"},
		{"flags may come before the path", append(local("traefik", "--allow-untrusted"), goodFile), "", "1 certificates: 0 imported, 1 unchanged"},
		{"a second run changes nothing", local("traefik", goodFile, "--allow-untrusted"), "", "1 certificates: 0 imported, 1 unchanged"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			err := importCommand(context.Background(), tc.args, &out, &errOut)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("import %v: %v\n%s", tc.args, err, errOut.String())
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("import %v: error %v, want one containing %q", tc.args, err, tc.wantErr)
			}
			if !strings.Contains(out.String(), tc.wantOut) {
				t.Errorf("import %v printed:\n%s\nwant %q", tc.args, out.String(), tc.wantOut)
			}
		})
	}
}

// TestImportLogsTheTime: the import's console log stamps each line with
// its time (issue 49: a logger without a timestamp printed "<nil>").
func TestImportLogsTheTime(t *testing.T) {
	dir := t.TempDir()
	state := filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o755); err != nil { // loose: OpenState warns
		t.Fatal(err)
	}
	cert, key := selfSigned(t, "shop.example")
	data, _ := json.Marshal(map[string]any{"le": map[string]any{"Certificates": []any{
		map[string]any{"domain": map[string]any{"main": "shop.example"}, "certificate": cert, "key": key},
	}}})
	file := filepath.Join(dir, "acme.json")
	if err := os.WriteFile(file, data, 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	args := []string{"traefik", file, "--cert-store", "local", "--state-dir", state, "--allow-untrusted"}
	if err := importCommand(context.Background(), args, &out, &errOut); err != nil {
		t.Fatalf("import: %v\n%s", err, errOut.String())
	}
	line, _, _ := strings.Cut(errOut.String(), "\n")
	if !strings.Contains(line, "state directory is accessible") || strings.Contains(line, "<nil>") {
		t.Fatalf("import logged %q, want the state directory warning with its time", line)
	}
	if !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d`).MatchString(line) {
		t.Errorf("import logged %q, want it to start with an RFC 3339 time", line)
	}
}

func TestImportUsageListsItsFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	err := importCommand(context.Background(), []string{"traefik", "--help"}, &out, &errOut)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("import --help = %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{"--allow-untrusted  (default false)", "--acme-ca-root", "valid for more than 398 days"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("import --help lacks %q:\n%s", want, errOut.String())
		}
	}
}
