package certs

// Review of 921790b (issue 23). Each test here fails on 921790b.

import (
	"context"
	"encoding/json"
	"errors"
	"path"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/mholt/acmez/v3/acme"

	"github.com/scafo/scafo-edge/certs/certstest"
	"github.com/scafo/scafo-edge/certs/internal/stamps"
	"github.com/scafo/scafo-edge/internal/testsupport"
)

// seedFailures records n failed validations of name in storage at t, as
// other edges of the fleet (or this edge before a restart) would have.
func seedFailures(t *testing.T, s certmagic.Storage, name string, at time.Time, n int) {
	t.Helper()
	for range n {
		if err := stamps.Record(context.Background(), s, failedValidationsPrefix+name, at, nil); err != nil {
			t.Fatal(err)
		}
	}
}

// The wildcard and base certificates are obtained once, through
// ManageAsync and certmagic's retry loop: a budget refusal must be an
// error that loop retries (certmagic.ErrNoRetry ends it for good, and
// nothing would ask for them again until a restart).
func TestAWildcardRefusedForItsBudgetIsObtainedOnceTheHourAllows(t *testing.T) {
	e := newTestEdge(t)
	pb := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: e.httpPort, TLSPort: e.httpsPort})
	cf := certstest.NewFakeCloudflare(t, "cf-token", []string{"example.test"}, pb)
	clk := newFakeClock()
	dir := t.TempDir()
	db := openTestDB(t, dir)
	local, err := NewBoltStorage(db)
	if err != nil {
		t.Fatal(err)
	}
	// Four failed DNS-01 validations of the base a minute ago (two rounds
	// of "*.b" + "b" failing, e.g. on another edge, or before a restart).
	seedFailures(t, local, "apps.example.test", clk.Now().Add(-time.Minute), 4)

	opts := wildcardOptions(pb, cf)
	opts.DB, opts.Clock = db, clk
	opts.HTTPPort, opts.HTTPSPort = e.httpPort, e.httpsPort
	m, err := New(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	e.cur.Store(m)
	testsupport.WaitFor(t, 30*time.Second, "both start-up obtains refused", func() bool {
		_, held := m.validations.heldUntil("apps.example.test")
		return held
	})
	// certmagic's non-interactive obtain (what ManageAsync runs) must keep
	// retrying on its schedule (first retry after a minute), not give up.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	err = m.wcfg.ObtainCertAsync(ctx, "*.apps.example.test")
	if errors.Is(err, errValidationBudget) {
		t.Fatalf("ObtainCertAsync returned at once with %v: the refusal is ErrNoRetry, so certmagic's retry loop (ManageAsync's) ends and the wildcard is never obtained until a restart", err)
	}
}

// certmagic's issuance lock is per certificate name while the CA counts
// per authorization identifier: "*.b" and "b" (both identifier "b") are
// issued at once against the same count, and must not together reach the
// CA's limit.
func TestAWildcardAndItsBaseTogetherStayUnderTheLimit(t *testing.T) {
	e := newTestEdge(t)
	pb := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: e.httpPort, TLSPort: e.httpsPort})
	cf := certstest.NewFakeCloudflare(t, "cf-token", []string{"example.test"}, pb)
	m := e.start(t, t.TempDir(), wildcardOptions(pb, cf))
	const base = "apps.example.test"
	testsupport.WaitFor(t, 60*time.Second, "the start-up certificates", func() bool { return len(m.Certificates()) == 2 })
	seedFailures(t, m.cfg.Storage, base, time.Now(), 3)
	ctx := context.Background()
	var admitted int
	for _, name := range []string{"*." + base, base} {
		// cert_obtaining for each, as two jobs of ManageAsync (or two
		// edges) run them concurrently: neither has failed yet.
		if err := m.onEvent(ctx, "cert_obtaining", map[string]any{"identifier": name}); err == nil {
			admitted++
			defer m.onEvent(ctx, "cert_failed", map[string]any{"identifier": name})
		}
	}
	if worst := 3 + admitted; worst >= FailedValidationLimit {
		t.Errorf("3 failures recorded, %d DNS-01 issuances admitted at once: up to %d failed validations, the CA's limit is %d", admitted, worst, FailedValidationLimit)
	}
}

// certmagic drops an on-demand certificate from its cache when its
// renewal fails, and asks the decision function before it loads one from
// storage: a renewal refused for the budget must not stop the name's
// still valid certificate being served.
func TestARefusedRenewalKeepsServingTheValidCertificate(t *testing.T) {
	e := newTestEdge(t)
	pb := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: e.httpPort, TLSPort: e.httpsPort})
	m := e.start(t, t.TempDir(), Options{
		Allowed: newNameSet("app.test").Allowed,
		CA:      pb.DirectoryURL,
		CARoot:  string(pb.RootPEM),
		Email:   "ops@example.test",
	})
	roots := pb.IssuerRoots(t)
	if _, err := e.handshake("app.test", roots); err != nil {
		t.Fatalf("first handshake: %v", err)
	}
	// Two earlier renewal attempts failed HTTP-01 and TLS-ALPN-01 (say the
	// AAAA record moved): 3 recorded (one has left the hour).
	seedFailures(t, m.cfg.Storage, "app.test", time.Now(), 3)
	// certmagic's maintenance renews (renewCertOnce == RenewCertSync minus
	// force); the edge refuses in cert_obtaining.
	err := m.cfg.RenewCertSync(context.Background(), "app.test", true)
	if !errors.Is(err, errValidationBudget) {
		t.Fatalf("renewal = %v, want the budget refusal", err)
	}
	// What certmagic does next (maintain.go queueRenewalTask, and
	// handshake.go renewDynamicCertificate): on-demand, a failed renewal
	// removes the certificate from the cache.
	m.cache.RemoveManaged([]certmagic.SubjectIssuer{{Subject: "app.test"}})

	leaf, err := e.handshake("app.test", roots)
	if err != nil {
		t.Fatalf("handshake after a refused renewal: %v; the certificate in storage is valid until the end of its life, it should be served", err)
	}
	if leaf.NotAfter.Before(time.Now()) {
		t.Fatal("expired")
	}
}

// Edges fetch the document on their own, so while a new name propagates,
// the edge the CA's validator reaches may not name it yet: it must still
// answer the token another edge stored, or a validation is spent (and
// prefetch's HTTP-01-only order fails). (certmagic's in-memory challenge map is per process,
// so two Managers in one test process would see each other's; the token
// is written to the shared store as another process's Present does.)
func TestHTTP01IsAnsweredByAnEdgeWhoseDocumentLags(t *testing.T) {
	b := newTestEdge(t)
	shared := &certmagic.FileStorage{Path: t.TempDir()}
	mb := b.start(t, t.TempDir(), Options{
		CA:      "https://127.0.0.1:1/dir",
		Storage: shared,
		Allowed: newNameSet().Allowed, // has not fetched the document naming new.test yet
	})
	chal := acme.Challenge{
		Type:             acme.ChallengeTypeHTTP01,
		Token:            "tK3n_tK3n_tK3n_tK3n_tK3n_tK3n_tK3n_tK3n_tK3",
		KeyAuthorization: "tK3n_tK3n_tK3n_tK3n_tK3n_tK3n_tK3n_tK3n_tK3.thumbprint",
		Identifier:       acme.Identifier{Type: "dns", Value: "new.test"},
	}
	js, _ := json.Marshal(chal)
	key := path.Join("acme", certmagic.StorageKeys.Safe(mb.acme.IssuerKey()), "challenge_tokens", certmagic.StorageKeys.Safe("new.test")+".json")
	if err := shared.Store(context.Background(), key, js); err != nil {
		t.Fatal(err)
	}
	resp, body, err := b.getHTTP("new.test", "/.well-known/acme-challenge/"+chal.Token)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 || body != chal.KeyAuthorization {
		t.Errorf("HTTP-01 at an edge whose document lags = %d %q, want 200 with the key authorization another edge stored", resp.StatusCode, body)
	}
}
