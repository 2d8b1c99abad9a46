package certs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/scafo/scafo-edge/certs/certstest"
	"github.com/scafo/scafo-edge/certs/prefetch"
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
			err := tc.v.admit(ctx, name, tc.cost)
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
	if err := b.admit(ctx, "shop.example.com", 2); err != nil {
		t.Errorf("admit an hour after the failures = %v, want nil", err)
	}
}
