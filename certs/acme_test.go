package certs

import (
	"context"
	"encoding/json"
	"net/http"
	"path"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/mholt/acmez/v3/acme"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/scafo/scafo-edge/certs/certstest"
	"github.com/scafo/scafo-edge/internal/testsupport"
)

// TestOnDemandACME runs one edge against one Pebble through the life of a
// few names; the steps build on each other, in order.
func TestOnDemandACME(t *testing.T) {
	e := newTestEdge(t)
	pb := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: e.httpPort, TLSPort: e.httpsPort})
	dir := t.TempDir()
	names := newNameSet("app.test", "api.test", "removed.test")
	reg := prometheus.NewRegistry()
	opts := Options{
		Mode:       ModeACME,
		Allowed:    names.Allowed,
		CA:         pb.DirectoryURL,
		CARoot:     string(pb.RootPEM),
		Email:      "ops@example.test",
		Registerer: reg,
	}
	m := e.start(t, dir, opts)
	roots := pb.IssuerRoots(t)

	var appSerial string
	t.Run("a document-named host gets a certificate from Pebble and a second request reuses it", func(t *testing.T) {
		status, body, ttfb, err := e.get("app.test", "/hello", roots)
		if err != nil {
			t.Fatalf("first HTTPS request: %v", err)
		}
		if status != http.StatusOK || body != "inner app.test:"+strconv.Itoa(e.httpsPort)+" /hello" {
			t.Fatalf("first request = %d %q, want 200 from the inner handler", status, body)
		}
		t.Logf("time to first byte of the first HTTPS request for a new name: %v", ttfb)
		pb.WaitOrderCount(t, 1)
		leaf, err := e.handshake("app.test", roots)
		if err != nil {
			t.Fatalf("second handshake: %v", err)
		}
		appSerial = leaf.SerialNumber.Text(16)
		if st, err := pb.CertStatus(leaf.SerialNumber); err != nil || st != "Valid" {
			t.Errorf("Pebble status of the served certificate = %q, %v; want Valid", st, err)
		}
		if _, _, _, err := e.get("app.test", "/again", roots); err != nil {
			t.Fatalf("third request: %v", err)
		}
		if got := pb.OrderCount(); got != 1 {
			t.Errorf("orders after three requests = %d, want 1", got)
		}
		if got := series(t, reg, "scafo_edge_tls_issuances_total", testsupport.Labels{"result": "obtained", "kind": "new"}); got != 1 {
			t.Errorf("obtained issuances metric = %v, want 1", got)
		}
		if got := series(t, reg, "scafo_edge_tls_certificate_expiry_seconds", testsupport.Labels{"name": "app.test"}); got < 24*3600 {
			t.Errorf("expiry metric for app.test = %v seconds, want days", got)
		}
		if got := series(t, reg, "scafo_edge_tls_handshake_certificates_total", testsupport.Labels{"result": "ok"}); got < 3 {
			t.Errorf("handshakes served = %v, want at least 3", got)
		}
	})

	t.Run("an API host gets a certificate", func(t *testing.T) {
		before := pb.OrderCount()
		leaf, err := e.handshake("api.test", roots)
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		if err := leaf.VerifyHostname("api.test"); err != nil {
			t.Errorf("served certificate: %v", err)
		}
		pb.WaitOrderCount(t, before+1)
	})

	t.Run("names the document does not name fail the handshake and place no order", func(t *testing.T) {
		for _, name := range []string{"stranger.test", "x.wild.test", "app.test.evil.test"} {
			before := pb.OrderCount()
			if _, err := e.handshake(name, roots); err == nil {
				t.Errorf("handshake for %s succeeded, want failure", name)
			}
			if got := pb.OrderCount(); got != before {
				t.Errorf("orders after a handshake for %s = %d, want %d", name, got, before)
			}
		}
		if got := series(t, reg, "scafo_edge_tls_on_demand_refusals_total", testsupport.Labels{"reason": "not_named"}); got < 3 {
			t.Errorf("not_named refusals = %v, want at least 3", got)
		}
	})

	t.Run("a wildcard key never approves issuance even when the decision function says yes", func(t *testing.T) {
		names.set("*.wild.test", true)
		defer names.set("*.wild.test", false)
		before := pb.OrderCount()
		if err := m.decide(context.Background(), "*.wild.test"); err == nil {
			t.Fatal("decide(*.wild.test) approved")
		}
		if _, err := e.handshake("*.wild.test", roots); err == nil {
			t.Error("handshake with SNI *.wild.test succeeded")
		}
		if got := pb.OrderCount(); got != before {
			t.Errorf("orders = %d, want %d", got, before)
		}
	})

	t.Run("plain HTTP redirects hosts that may have a certificate and proxies the rest", func(t *testing.T) {
		resp, _, err := e.getHTTP("app.test", "/a%2Fb/c?q=1")
		if err != nil {
			t.Fatal(err)
		}
		want := "https://app.test:" + strconv.Itoa(e.httpsPort) + "/a%2Fb/c?q=1"
		if resp.StatusCode != http.StatusPermanentRedirect || resp.Header.Get("Location") != want {
			t.Errorf("GET http://app.test = %d Location %q, want 308 %q", resp.StatusCode, resp.Header.Get("Location"), want)
		}
		resp, body, err := e.getHTTP("plain.other.test", "/x")
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(body, "inner plain.other.test") {
			t.Errorf("GET http://plain.other.test = %d %q, want the inner handler", resp.StatusCode, body)
		}
	})

	t.Run("an HTTP-01 challenge in progress is answered, not redirected", func(t *testing.T) {
		// Another edge sharing the store started this challenge; its token
		// is in storage where certmagic's distributed solver looks.
		chal := acme.Challenge{Type: "http-01", Token: "tok-123", KeyAuthorization: "tok-123.thumbprint",
			Identifier: acme.Identifier{Type: "dns", Value: "app.test"}}
		b, _ := json.Marshal(chal)
		key := path.Join("acme", certmagic.StorageKeys.Safe(m.acme.IssuerKey()), "challenge_tokens", "app.test.json")
		if err := m.cfg.Storage.Store(context.Background(), key, b); err != nil {
			t.Fatal(err)
		}
		defer m.cfg.Storage.Delete(context.Background(), key)
		resp, body, err := e.getHTTP("app.test", "/.well-known/acme-challenge/tok-123")
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK || body != "tok-123.thumbprint" {
			t.Errorf("challenge request = %d %q, want 200 with the key authorization", resp.StatusCode, body)
		}
		resp, _, err = e.getHTTP("app.test", "/.well-known/acme-challenge/unknown-token")
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode == http.StatusOK {
			t.Errorf("a token not in progress was answered 200")
		}
	})

	t.Run("the served certificate covers its own name and no other", func(t *testing.T) {
		for _, tc := range []struct {
			sni, host string
			want      bool
		}{
			{"app.test", "app.test", true},
			{"app.test", "APP.test:443", true},
			{"app.test", "api.test", false},
			{"app.test", "", false},
		} {
			if got := m.Covers(tc.sni, tc.host); got != tc.want {
				t.Errorf("Covers(%q, %q) = %v, want %v", tc.sni, tc.host, got, tc.want)
			}
		}
	})

	t.Run("a host removed from the document gets no certificate", func(t *testing.T) {
		names.set("removed.test", false)
		before := pb.OrderCount()
		if _, err := e.handshake("removed.test", roots); err == nil {
			t.Fatal("handshake for a removed host succeeded")
		}
		if got := pb.OrderCount(); got != before {
			t.Errorf("orders = %d, want %d", got, before)
		}
	})

	t.Run("a restarted edge serves from bbolt with no new order", func(t *testing.T) {
		before := pb.OrderCount()
		opts.Registerer = nil
		e.restart(t, dir, opts)
		leaf, err := e.handshake("app.test", roots)
		if err != nil {
			t.Fatalf("handshake after restart: %v", err)
		}
		if got := leaf.SerialNumber.Text(16); got != appSerial {
			t.Errorf("serial after restart = %s, want %s", got, appSerial)
		}
		if got := pb.OrderCount(); got != before {
			t.Errorf("orders after restart = %d, want %d", got, before)
		}
	})

	t.Run("a name removed from the document is not loaded from storage after a restart", func(t *testing.T) {
		names.set("api.test", false)
		before := pb.OrderCount()
		if _, err := e.handshake("api.test", roots); err == nil {
			t.Error("handshake for a removed name succeeded from storage")
		}
		if got := pb.OrderCount(); got != before {
			t.Errorf("orders = %d, want %d", got, before)
		}
	})

	t.Run("the status list shows the held certificates with issuer and expiry", func(t *testing.T) {
		got := e.cur.Load().Certificates()
		if len(got) != 1 || got[0].Names[0] != "app.test" || got[0].NotAfter.Before(time.Now()) || got[0].Issuer == "" {
			t.Errorf("Certificates() = %+v, want app.test with an issuer and a future expiry", got)
		}
	})
}

func TestFailedIssuanceBacksOff(t *testing.T) {
	e := newTestEdge(t)
	pb := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: e.httpPort, TLSPort: e.httpsPort})
	// Pebble's validator resolves broken.test to an address nothing listens
	// on, so neither HTTP-01 nor TLS-ALPN-01 can be answered.
	pb.SetA(t, "broken.test", "127.0.0.2")
	reg := prometheus.NewRegistry()
	e.start(t, t.TempDir(), Options{
		Allowed:            newNameSet("broken.test").Allowed,
		CA:                 pb.DirectoryURL,
		CARoot:             string(pb.RootPEM),
		FailureBackoffBase: time.Hour,
		Registerer:         reg,
	})
	roots := pb.IssuerRoots(t)

	start := time.Now()
	if _, err := e.handshake("broken.test", roots); err == nil {
		t.Fatal("handshake for a name that cannot be validated succeeded")
	}
	t.Logf("failed issuance ended the handshake after %v", time.Since(start))
	testsupport.WaitFor(t, 10*time.Second, "the failure to be counted", func() bool {
		return series(t, reg, "scafo_edge_tls_issuances_total", testsupport.Labels{"result": "failed", "kind": "new"}) == 1
	})
	ordersAfterFailure := pb.OrderCount()
	if ordersAfterFailure < 1 {
		t.Fatalf("orders after the failed attempt = %d, want at least 1", ordersAfterFailure)
	}

	start = time.Now()
	if _, err := e.handshake("broken.test", roots); err == nil {
		t.Fatal("second handshake succeeded")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("a handshake during the back-off took %v, want an immediate refusal", d)
	}
	if got := pb.OrderCount(); got != ordersAfterFailure {
		t.Errorf("orders after a handshake during the back-off = %d, want %d", got, ordersAfterFailure)
	}
	if got := series(t, reg, "scafo_edge_tls_on_demand_refusals_total", testsupport.Labels{"reason": "backoff"}); got != 1 {
		t.Errorf("backoff refusals = %v, want 1", got)
	}
	if got := series(t, reg, "scafo_edge_tls_backoff_names", nil); got != 1 {
		t.Errorf("backed-off names gauge = %v, want 1", got)
	}
	if got := series(t, reg, "scafo_edge_tls_issuances_in_flight", nil); got != 0 {
		t.Errorf("issuances in flight = %v, want 0", got)
	}
}

// wildcardOptions are a Manager's options with the wildcard base
// apps.example.test, issued by pb through cf's DNS, and a document naming
// no host exactly.
func wildcardOptions(pb *certstest.Pebble, cf *certstest.FakeCloudflare) Options {
	return Options{
		Allowed:              newNameSet().Allowed,
		CA:                   pb.DirectoryURL,
		CARoot:               string(pb.RootPEM),
		DNSProvider:          "cloudflare",
		CloudflareToken:      "cf-token",
		CloudflareHTTPClient: cf.Client,
		DNSPropagationDelay:  -1,
		WildcardDomains:      []string{"apps.example.test"},
	}
}

func TestWildcardByDNS01(t *testing.T) {
	e := newTestEdge(t)
	pb := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: e.httpPort, TLSPort: e.httpsPort})
	cf := certstest.NewFakeCloudflare(t, "cf-token", []string{"example.test"}, pb)
	m := e.start(t, t.TempDir(), wildcardOptions(pb, cf))
	roots := pb.IssuerRoots(t)

	testsupport.WaitFor(t, 60*time.Second, "the wildcard and base certificates", func() bool {
		return len(m.Certificates()) == 2
	})
	if got := pb.OrderCount(); got != 2 {
		t.Errorf("orders = %d, want 2 (the wildcard and the base)", got)
	}
	if cf.RecordsCreated() < 2 {
		t.Errorf("TXT records created through the Cloudflare API = %d, want at least 2", cf.RecordsCreated())
	}

	t.Run("a host under the wildcard route is served the wildcard certificate", func(t *testing.T) {
		leaf, err := e.handshake("x.apps.example.test", roots)
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		if len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != "*.apps.example.test" {
			t.Errorf("served names %v, want [*.apps.example.test]", leaf.DNSNames)
		}
		status, _, _, err := e.get("y.apps.example.test", "/", roots)
		if err != nil || status != http.StatusOK {
			t.Errorf("GET https://y.apps.example.test = %d, %v; want 200", status, err)
		}
	})

	t.Run("the bare base is served its own certificate", func(t *testing.T) {
		leaf, err := e.handshake("apps.example.test", roots)
		if err != nil {
			t.Fatalf("handshake: %v", err)
		}
		if err := leaf.VerifyHostname("apps.example.test"); err != nil {
			t.Error(err)
		}
	})

	t.Run("a host two labels under the base gets nothing and places no order", func(t *testing.T) {
		before := pb.OrderCount()
		if _, err := e.handshake("a.b.apps.example.test", roots); err == nil {
			t.Error("handshake succeeded")
		}
		if got := pb.OrderCount(); got != before {
			t.Errorf("orders = %d, want %d", got, before)
		}
	})

	t.Run("the wildcard certificate covers sibling hosts for the 421 rule", func(t *testing.T) {
		for _, tc := range []struct {
			sni, host string
			want      bool
		}{
			{"x.apps.example.test", "y.apps.example.test", true},
			{"x.apps.example.test", "apps.example.test", false},
			{"x.apps.example.test", "a.b.apps.example.test", false},
			{"x.apps.example.test", "other.test", false},
		} {
			if got := m.Covers(tc.sni, tc.host); got != tc.want {
				t.Errorf("Covers(%q, %q) = %v, want %v", tc.sni, tc.host, got, tc.want)
			}
		}
	})

	t.Run("plain HTTP redirects a covered host and proxies an uncovered one", func(t *testing.T) {
		resp, _, err := e.getHTTP("x.apps.example.test", "/")
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusPermanentRedirect {
			t.Errorf("GET http://x.apps.example.test = %d, want 308", resp.StatusCode)
		}
		resp, _, err = e.getHTTP("x.uncovered.test", "/")
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET http://x.uncovered.test = %d, want 200 from the inner handler", resp.StatusCode)
		}
	})
}

func TestConcurrentNamesWithOneIssuanceSlot(t *testing.T) {
	e := newTestEdge(t)
	pb := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: e.httpPort, TLSPort: e.httpsPort})
	e.start(t, t.TempDir(), Options{
		Allowed:              newNameSet("c1.test", "c2.test", "c3.test").Allowed,
		CA:                   pb.DirectoryURL,
		CARoot:               string(pb.RootPEM),
		MaxIssuancesInFlight: 1,
	})
	roots := pb.IssuerRoots(t)
	errs := make(chan error, 3)
	for _, name := range []string{"c1.test", "c2.test", "c3.test"} {
		go func() {
			_, err := e.handshake(name, roots)
			errs <- err
		}()
	}
	for range 3 {
		if err := <-errs; err != nil {
			t.Errorf("handshake: %v", err)
		}
	}
	if got := pb.OrderCount(); got != 3 {
		t.Errorf("orders = %d, want 3", got)
	}
}
