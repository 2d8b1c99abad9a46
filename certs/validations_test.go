package certs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/certs/certstest"
	"github.com/scafo/scafo-edge/certs/prefetch"
	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/testsupport"
)

// TestFailedValidationsStayUnderTheCALimit runs an hour, on a fake clock,
// of a name whose validation always fails at the CA although it answers
// prefetch's reachability check (Pebble's DNS sends the validator to an
// address where nothing listens, as an AAAA record still pointing at the
// old host would): prefetch retries it on its schedule and a visitor
// asks for it every minute. Let's Encrypt refuses a name for the rest of
// the hour after 5 failed validations per account and hostname, so the
// edge must spend fewer, however many paths ask.
func TestFailedValidationsStayUnderTheCALimit(t *testing.T) {
	e := newTestEdge(t)
	pb := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: e.httpPort, TLSPort: e.httpsPort})
	pb.SetA(t, "broken.test", "127.0.0.2")
	clk := newFakeClock()
	reg := prometheus.NewRegistry()
	opts := prefetchOptions(pb, newNameSet("broken.test"), reg, &prefetch.Options{
		LookupNetIP: lookupTestDNS,
		DialContext: dialRoutes(e.httpLn.Addr().String(), nil),
	})
	opts.Clock = clk
	// A back-off of minutes, not the default's hour-long doubling: the
	// budget, not the back-off, must be what keeps the name under the
	// CA's limit. With the default, attempts at 0, 5, 15 and 35 minutes
	// may all be prefetch's, one failure each, and the next comes after
	// the hour, so which of the two holds the name back depended on
	// whether prefetch or a visitor won each race (1 run in 40).
	opts.FailureBackoffBase, opts.FailureBackoffMax = time.Minute, 4*time.Minute
	m := e.start(t, t.TempDir(), opts)
	m.Prefetch([]string{"broken.test"})

	// settled reports whether nothing is being issued or checked, so that
	// the clock moves only between attempts.
	settled := func() bool {
		en, queued := prefetchEntry(m, "broken.test")
		return (!queued || en.State != prefetch.Working) && series(t, reg, "scafo_edge_tls_issuances_in_flight", nil) == 0
	}
	testsupport.WaitFor(t, 60*time.Second, "prefetch's first attempt", func() bool {
		en, ok := prefetchEntry(m, "broken.test")
		return ok && en.Failures > 0 && settled()
	})
	for minute := range 60 {
		if minute > 0 {
			clk.Advance(time.Minute)
			testsupport.WaitFor(t, 60*time.Second, "the edge to settle", settled)
		}
		if _, err := e.handshake("broken.test", nil); err == nil {
			t.Fatalf("minute %d: handshake for broken.test succeeded", minute)
		}
		testsupport.WaitFor(t, 60*time.Second, "the edge to settle", settled)
	}
	// Pebble logs an invalid authorization a moment after the client sees
	// it; the edge has counted each by then.
	testsupport.WaitFor(t, 5*time.Second, "Pebble's log to catch up with the edge's count", func() bool {
		return pb.InvalidAuthzCount() == int(series(t, reg, "scafo_edge_tls_failed_validations_total", nil))
	})
	invalid := pb.InvalidAuthzCount()
	t.Logf("one simulated hour: %d invalid authorizations and %d orders at the CA for broken.test", invalid, pb.OrderCount())
	if invalid >= FailedValidationLimit {
		t.Errorf("invalid authorizations in one hour = %d, want fewer than Let's Encrypt's %d", invalid, FailedValidationLimit)
	}
	if got := series(t, reg, "scafo_edge_tls_failed_validations_total", nil); int(got) != invalid {
		t.Errorf("failed validations metric = %v, want %d (Pebble's count)", got, invalid)
	}
	if got := series(t, reg, "scafo_edge_tls_failed_validations_last_hour", testsupport.Labels{"name": "broken.test"}); int(got) != invalid {
		t.Errorf("failed validations in the last hour for broken.test = %v, want %d", got, invalid)
	}
	if got := series(t, reg, "scafo_edge_tls_on_demand_refusals_total", testsupport.Labels{"reason": "validations"}); got == 0 {
		t.Error("no issuance refused for the failed-validation budget")
	}
	vc := m.FailedValidations()
	if len(vc) != 1 || vc[0].Name != "broken.test" || vc[0].Failed != invalid || !vc[0].HeldUntil.After(clk.Now()) {
		t.Errorf("FailedValidations = %+v, want broken.test with %d, held back", vc, invalid)
	}
}

// TestFailedValidationsCountAcrossTheFleet: failures one edge records in
// the shared storage hold back another edge's issuance of the name, and
// leave the count an hour later.
func TestFailedValidationsCountAcrossTheFleet(t *testing.T) {
	shared := &certmagic.FileStorage{Path: t.TempDir()}
	clk := newFakeClock()
	a, b := newValidations(shared, clk), newValidations(shared, clk)
	ctx := context.Background()
	for range 3 {
		if err := a.failed(ctx, "shop.example.com"); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(10 * time.Minute)
	for _, tc := range []struct {
		name string
		v    *validations
		cost int
		ok   bool
	}{
		{"the edge that failed may still try one challenge type", a, 1, true},
		{"another edge may still try one challenge type", b, 1, true},
		{"another edge may not try two, which could reach the CA's limit", b, 2, false},
		{"a name with no failures may try two", b, 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "shop.example.com"
			if tc.name == "a name with no failures may try two" {
				name = "other.example.com"
			}
			err := tc.v.admit(ctx, name, name, tc.cost)
			if tc.ok && err != nil {
				t.Fatalf("admit(%s, %d) = %v, want nil", name, tc.cost, err)
			}
			if !tc.ok && !errors.Is(err, errValidationBudget) {
				t.Fatalf("admit(%s, %d) = %v, want errValidationBudget", name, tc.cost, err)
			}
		})
	}
	if until, held := b.heldUntil("shop.example.com"); !held || !until.Equal(clk.Now().Add(50*time.Minute)) {
		t.Errorf("held until %v (%v), want an hour after the first failure, 50 minutes from now", until, held)
	}
	clk.Advance(50 * time.Minute)
	if err := b.admit(ctx, "shop.example.com", "shop.example.com", 2); err != nil {
		t.Errorf("admit an hour after the failures = %v, want nil", err)
	}
}

// TestBudgetRefusalIsRetriedOutsideHandshakes: a refusal for the budget
// ends only a handshake's issuance for good (ErrNoRetry: the visitor is not
// kept waiting for certmagic's retry); certmagic's retry loop (the wildcard
// certificates, renewals) gets an error it retries on its schedule, and
// its retries while the name is held cost no storage read.
func TestBudgetRefusalIsRetriedOutsideHandshakes(t *testing.T) {
	e := newTestEdge(t)
	store := &countingStorage{Storage: &certmagic.FileStorage{Path: t.TempDir()}}
	clk := newFakeClock()
	// The CA is never contacted: every issuance here is refused.
	m := e.start(t, t.TempDir(), Options{Allowed: newNameSet("named.test").Allowed, CA: "https://127.0.0.1:9/dir", Storage: store, Clock: clk})
	seedFailures(t, store, "named.test", clk.Now(), failedValidationBudget)
	obtaining := func(ctx context.Context) error {
		return m.onEvent(ctx, "cert_obtaining", map[string]any{"identifier": "named.test"})
	}
	var noRetry certmagic.ErrNoRetry
	attempts := 0
	retrying := context.WithValue(context.Background(), certmagic.AttemptsCtxKey, &attempts)
	err := obtaining(retrying)
	if !errors.Is(err, errValidationBudget) || errors.As(err, &noRetry) {
		t.Fatalf("cert_obtaining in certmagic's retry loop = %#v, want a retryable errValidationBudget", err)
	}
	before := store.reads.Load()
	if err := obtaining(retrying); !errors.Is(err, errValidationBudget) || errors.As(err, &noRetry) {
		t.Fatalf("cert_obtaining retried = %#v, want a retryable errValidationBudget", err)
	}
	if got := store.reads.Load() - before; got != 0 {
		t.Errorf("a retry while the name is held cost %d storage reads, want 0", got)
	}
	if err := obtaining(context.WithValue(retrying, handshakeKey{}, true)); !errors.As(err, &noRetry) || !errors.Is(err, errValidationBudget) {
		t.Errorf("cert_obtaining for a handshake = %#v, want ErrNoRetry wrapping errValidationBudget", err)
	}
}

// TestNoStagingFallback: certmagic retries an issuance with Let's
// Encrypt's production CA at its staging CA, whose failed validations the
// budget would count against production's. Every issuer retries at the
// configured CA.
func TestNoStagingFallback(t *testing.T) {
	e := newTestEdge(t)
	// CA empty: Let's Encrypt production, for which certmagic sets staging
	// as the test CA. Nothing is issued here.
	m := e.start(t, t.TempDir(), Options{Allowed: newNameSet().Allowed, Prefetch: &prefetch.Options{}})
	for _, cfg := range []*certmagic.Config{m.cfg, m.pcfg} {
		for _, iss := range cfg.Issuers {
			if a, ok := iss.(*certmagic.ACMEIssuer); !ok || a.CA != certmagic.LetsEncryptProductionCA || a.TestCA != "" {
				t.Errorf("issuer %T CA %q, test CA %q; want Let's Encrypt production and no test CA", iss, a.CA, a.TestCA)
			}
		}
	}
}

// failingLists is a storage whose List fails while fail is set.
type failingLists struct {
	certmagic.Storage
	fail atomic.Bool
}

func (s *failingLists) List(ctx context.Context, dir string, recursive bool) ([]string, error) {
	if s.fail.Load() {
		return nil, fmt.Errorf("list %s: %w", dir, syscall.ECONNREFUSED)
	}
	return s.Storage.List(ctx, dir, recursive)
}

// TestUnreadableCountIsLoggedOnceAndCounted: while the storage cannot be
// read, admit counts this edge's own failures only; every such admission
// is counted, the first of a cause is logged, and so is the recovery.
func TestUnreadableCountIsLoggedOnceAndCounted(t *testing.T) {
	store := &failingLists{Storage: &certmagic.FileStorage{Path: t.TempDir()}}
	v := newValidations(store, newFakeClock())
	var logs bytes.Buffer
	v.log = zerolog.New(&logs)
	v.unread = prometheus.NewCounter(prometheus.CounterOpts{Name: "unread"})
	reg := prometheus.NewRegistry()
	reg.MustRegister(v.unread)
	ctx := context.Background()
	admit := func(name string) {
		t.Helper()
		if err := v.admit(ctx, name, name, 1); err != nil {
			t.Fatalf("admit(%s) = %v", name, err)
		}
	}
	store.fail.Store(true)
	for _, name := range []string{"a.example", "b.example", "c.example"} {
		admit(name)
	}
	if got := series(t, reg, "unread", nil); got != 3 {
		t.Errorf("unread admissions = %v, want 3", got)
	}
	if got := strings.Count(logs.String(), "not readable"); got != 1 {
		t.Errorf("%d log lines for one cause, want 1:\n%s", got, logs.String())
	}
	store.fail.Store(false)
	admit("a.example")
	admit("b.example")
	if got := strings.Count(logs.String(), "read from the certificate storage again"); got != 1 {
		t.Errorf("%d log lines for the recovery, want 1:\n%s", got, logs.String())
	}
	if got := series(t, reg, "unread", nil); got != 3 {
		t.Errorf("unread admissions after the recovery = %v, want still 3", got)
	}
}

// TestOldFailuresAreSwept: the records of a name never issued again leave
// the storage once out of the hour, at the next admission of any name, at
// most once an hour; a directory named like a record's time is not one.
func TestOldFailuresAreSwept(t *testing.T) {
	store, clk, v := newTestValidations(t)
	ctx := context.Background()
	seedFailures(t, store, "gone.example", clk.Now(), 2)
	seedFailures(t, store, "1-2.example", clk.Now(), 1)
	clk.Advance(failedValidationWindow)
	seedFailures(t, store, "recent.example", clk.Now(), 1)
	if err := v.admit(ctx, "other.example", "other.example", 1); err != nil {
		t.Fatal(err)
	}
	left, err := store.List(ctx, strings.TrimSuffix(failedValidationsPrefix, "/"), true)
	if err != nil {
		t.Fatal(err)
	}
	var records []string
	for _, k := range left {
		if strings.Count(strings.TrimPrefix(k, failedValidationsPrefix), "/") == 1 {
			records = append(records, path.Dir(strings.TrimPrefix(k, failedValidationsPrefix)))
		}
	}
	if !slices.Equal(records, []string{"recent.example"}) {
		t.Errorf("records left after the sweep under %v, want recent.example's only (all keys: %v)", records, left)
	}
}

// TestValidationNamesStayBounded: the in-memory table keeps at most
// maxValidationNames names, even when every one has a failure in the hour.
func TestValidationNamesStayBounded(t *testing.T) {
	_, clk, v := newTestValidations(t)
	v.mu.Lock()
	defer v.mu.Unlock()
	for i := range maxValidationNames + 10 {
		nf := v.entryLocked(fmt.Sprintf("n%d.example", i), clk.Now())
		nf.counted = append(nf.counted, clk.Now())
	}
	if got := len(v.names); got > maxValidationNames {
		t.Errorf("%d names in memory, want at most %d", got, maxValidationNames)
	}
}

// TestReservationsShareTheIdentifier: "*.b" and "b" are two certificates
// of one identifier; what an issuance of one may spend is reserved until
// certmagic reports its outcome, and counted when the other asks.
func TestReservationsShareTheIdentifier(t *testing.T) {
	store, clk, v := newTestValidations(t)
	ctx := context.Background()
	seedFailures(t, store, "b.example", clk.Now(), 1)
	if err := v.admit(ctx, "b.example", "*.b.example", 2); err != nil {
		t.Fatalf("admit *.b.example = %v, want nil", err)
	}
	if err := v.admit(ctx, "b.example", "b.example", 2); !errors.Is(err, errValidationBudget) {
		t.Fatalf("admit b.example while *.b.example is in flight = %v, want errValidationBudget", err)
	}
	if _, held := v.heldUntil("b.example"); held {
		t.Error("held back for an issuance in flight; want only refused until it ends")
	}
	v.release("*.b.example")
	if err := v.admit(ctx, "b.example", "b.example", 2); err != nil {
		t.Fatalf("admit b.example once *.b.example ended = %v, want nil", err)
	}
}

// newTestValidations returns validations on a storage of their own and a
// fake clock.
func newTestValidations(t *testing.T) (certmagic.Storage, *clock.Fake, *validations) {
	store := &certmagic.FileStorage{Path: t.TempDir()}
	clk := newFakeClock()
	return store, clk, newValidations(store, clk)
}
