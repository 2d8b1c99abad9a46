package certs

import (
	"bytes"
	"context"
	"crypto/x509"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

func TestInternalCA(t *testing.T) {
	e := newTestEdge(t)
	dir := t.TempDir()
	opts := Options{
		Mode:            ModeInternal,
		Allowed:         newNameSet("internal.test").Allowed,
		WildcardDomains: []string{"int.test"},
	}
	m := e.start(t, dir, opts)
	rootPEM := m.InternalRootPEM()
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(rootPEM) {
		t.Fatalf("InternalRootPEM is not PEM: %q", rootPEM)
	}

	var serial string
	t.Run("a named host is served a certificate that verifies against the internal root", func(t *testing.T) {
		status, body, _, err := e.get("internal.test", "/x", roots)
		if err != nil {
			t.Fatalf("HTTPS request: %v", err)
		}
		if status != http.StatusOK || !bytes.HasPrefix([]byte(body), []byte("inner internal.test")) {
			t.Errorf("GET = %d %q, want 200 from the inner handler", status, body)
		}
		leaf, err := e.handshake("internal.test", roots)
		if err != nil {
			t.Fatal(err)
		}
		serial = leaf.SerialNumber.String()
	})

	t.Run("an unnamed host fails the handshake", func(t *testing.T) {
		if _, err := e.handshake("stranger.test", roots); err == nil {
			t.Error("handshake succeeded")
		}
	})

	t.Run("a configured wildcard is issued internally and covers one label", func(t *testing.T) {
		testsupport.WaitFor(t, 10*time.Second, "the internal wildcard certificate", func() bool {
			_, err := e.handshake("x.int.test", roots)
			return err == nil
		})
		if _, err := e.handshake("a.b.int.test", roots); err == nil {
			t.Error("handshake two labels under the base succeeded")
		}
	})

	t.Run("a restart keeps the root and serves the stored certificate", func(t *testing.T) {
		m2 := e.restart(t, dir, opts)
		if got := m2.InternalRootPEM(); !bytes.Equal(got, rootPEM) {
			t.Error("the internal root changed across a restart")
		}
		leaf, err := e.handshake("internal.test", roots)
		if err != nil {
			t.Fatal(err)
		}
		if got := leaf.SerialNumber.String(); got != serial {
			t.Errorf("serial after restart = %s, want %s", got, serial)
		}
	})
}

func TestRedirect(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	for _, tc := range []struct {
		name      string
		httpsPort int
		host      string
		target    string
		wantCode  int
		wantLoc   string
	}{
		{"the default port is left out of the location", 0, "internal.test", "/p/a%2Fb?q=1&r", 308, "https://internal.test/p/a%2Fb?q=1&r"},
		{"another port is kept and the host is normalised", 8443, "Internal.Test.:8080", "/", 308, "https://internal.test:8443/"},
		{"a host that cannot have a certificate is passed on", 0, "other.test", "/", 200, ""},
		{"a wildcard key as a host is passed on", 0, "*.internal.test", "/", 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(context.Background(), Options{Mode: ModeInternal, DB: db, HTTPSPort: tc.httpsPort,
				Allowed: newNameSet("internal.test", "*.internal.test").Allowed})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			req := httptest.NewRequest(http.MethodGet, tc.target, nil)
			req.Host = tc.host
			rec := httptest.NewRecorder()
			m.HTTPHandler(inner).ServeHTTP(rec, req)
			if rec.Code != tc.wantCode || rec.Header().Get("Location") != tc.wantLoc {
				t.Errorf("GET http://%s%s = %d %q, want %d %q", tc.host, tc.target, rec.Code, rec.Header().Get("Location"), tc.wantCode, tc.wantLoc)
			}
		})
	}
}
