package certs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.uber.org/zap"

	"github.com/scafo/scafo-edge/certs/certstest"
)

func TestBackoff(t *testing.T) {
	clk := newFakeClock()
	b := newIssuanceBackoff(time.Minute, 5*time.Minute, clk)

	steps := []struct {
		name    string
		advance time.Duration
		fail    bool
		want    time.Duration // back-off returned by fail
		active  bool
	}{
		{"a first failure holds the name back for the base", 0, true, time.Minute, true},
		{"the name is free once the back-off ends", time.Minute, false, 0, false},
		{"a second failure in a row doubles it", 0, true, 2 * time.Minute, true},
		{"a third doubles again", 2 * time.Minute, true, 4 * time.Minute, true},
		{"a fourth is capped at the maximum", 4 * time.Minute, true, 5 * time.Minute, true},
		{"after a quiet spell longer than the maximum it starts over", 11 * time.Minute, true, time.Minute, true},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			clk.Advance(st.advance)
			if st.fail {
				if got := b.fail("a.test"); got != st.want {
					t.Errorf("fail = %v, want %v", got, st.want)
				}
			}
			if _, got := b.active("a.test"); got != st.active {
				t.Errorf("active = %v, want %v", got, st.active)
			}
		})
	}
	t.Run("success clears the name", func(t *testing.T) {
		if !b.clear("a.test") {
			t.Error("clear reported no earlier failures")
		}
		if _, active := b.active("a.test"); active || b.count() != 0 {
			t.Error("name still held back after clear")
		}
	})
}

func TestDecide(t *testing.T) {
	m := &Manager{allowed: newNameSet("app.test", "*.wild.test", "backoff.test").Allowed, backoff: newIssuanceBackoff(time.Hour, time.Hour, nil)}
	var err error
	if m.metrics, err = newMetrics(nil, m); err != nil {
		t.Fatal(err)
	}
	m.backoff.fail("backoff.test")
	for _, tc := range []struct {
		name string
		want error
	}{
		{"app.test", nil},
		{"APP.test.", nil},
		{"other.test", errNotNamed},
		{"*.wild.test", errWildcardKey},
		{"x.wild.test", errNotNamed},
		{"backoff.test", errBackingOff},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := m.decide(context.Background(), tc.name)
			if (tc.want == nil) != (err == nil) || (tc.want != nil && !errorsIs(err, tc.want)) {
				t.Errorf("decide(%q) = %v, want %v", tc.name, err, tc.want)
			}
		})
	}
	t.Run("nil Allowed refuses everything", func(t *testing.T) {
		m2 := &Manager{backoff: m.backoff, metrics: m.metrics}
		if err := m2.decide(context.Background(), "app.test"); err == nil {
			t.Error("decide approved with a nil Allowed")
		}
	})
}

func TestNamesCover(t *testing.T) {
	for _, tc := range []struct {
		names []string
		host  string
		want  bool
	}{
		{[]string{"a.test"}, "a.test", true},
		{[]string{"*.a.test"}, "x.a.test", true},
		{[]string{"*.a.test"}, "a.test", false},
		{[]string{"*.a.test"}, "x.y.a.test", false},
		{[]string{"*.a.test"}, "xa.test", false},
		{[]string{"b.test", "*.a.test"}, "b.test", true},
	} {
		if got := namesCover(tc.names, tc.host); got != tc.want {
			t.Errorf("namesCover(%q, %q) = %v, want %v", tc.names, tc.host, got, tc.want)
		}
	}
}

func TestZoneCandidates(t *testing.T) {
	got := zoneCandidates("*.apps.example.test")
	want := []string{"apps.example.test", "example.test"}
	if !slices.Equal(got, want) {
		t.Errorf("zoneCandidates = %q, want %q", got, want)
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	db := openTestDB(t, t.TempDir())
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"an unknown mode", Options{Mode: "sometimes", DB: db}},
		{"no database", Options{Mode: ModeACME}},
		{"an unknown DNS provider", Options{DB: db, DNSProvider: "route53"}},
		{"cloudflare without a token", Options{DB: db, DNSProvider: "cloudflare"}},
		{"wildcards without a DNS provider", Options{DB: db, WildcardDomains: []string{"example.test"}}},
		{"a wildcard base that is a single label", Options{DB: db, DNSProvider: "cloudflare", CloudflareToken: "x", WildcardDomains: []string{"test"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if m, err := New(context.Background(), tc.opts); err == nil {
				m.Close()
				t.Error("New accepted the options")
			}
		})
	}
}

// TestFailedNewLeavesTheRegistryAsItFoundIt: New registers its metrics
// before parts that can still fail; a failure unregisters them, so the
// caller may build another Manager on the same registry.
func TestFailedNewLeavesTheRegistryAsItFoundIt(t *testing.T) {
	reg := prometheus.NewRegistry()
	db := openTestDB(t, t.TempDir())
	if m, err := New(context.Background(), Options{Mode: ModeACME, DB: db, CARoot: "-----BEGIN nothing", Registerer: reg}); err == nil {
		m.Close()
		t.Fatal("New accepted a CA root without a certificate")
	}
	if mfs, err := reg.Gather(); err != nil || len(mfs) != 0 {
		t.Fatalf("after a failed New the registry holds %d families (%v), want none", len(mfs), err)
	}
	m, err := New(context.Background(), Options{Mode: ModeInternal, DB: db, Registerer: reg})
	if err != nil {
		t.Fatalf("a second New on the registry: %v", err)
	}
	m.Close()
}

func TestModeOff(t *testing.T) {
	m, err := New(context.Background(), Options{Mode: ModeOff})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.TLSConfig() != nil {
		t.Error("TLSConfig in ModeOff is not nil")
	}
	if !m.Covers("a.test", "A.test:80") || m.Covers("a.test", "b.test") {
		t.Error("Covers in ModeOff is not host equality")
	}
	if len(m.Certificates()) != 0 {
		t.Error("Certificates in ModeOff is not empty")
	}
}

// TestAccountStaysLocal checks the storage wrapper used with a shared store:
// it behaves as one storage, and ACME account keys never reach the shared one.
func TestAccountStaysLocal(t *testing.T) {
	newSplit := func(t *testing.T) (*accountLocal, *BoltStorage, *BoltStorage) {
		shared, err := NewBoltStorage(openTestDB(t, t.TempDir()))
		if err != nil {
			t.Fatal(err)
		}
		local, err := NewBoltStorage(openTestDB(t, t.TempDir()))
		if err != nil {
			t.Fatal(err)
		}
		shared.LockTTL, shared.LockPollInterval = 700*time.Millisecond, 20*time.Millisecond
		return &accountLocal{shared: shared, local: local}, shared, local
	}
	certstest.StorageConformance(t, func(t *testing.T) certmagic.Storage {
		s, _, _ := newSplit(t)
		return s
	})
	t.Run("account keys go to the local store and certificates to the shared one", func(t *testing.T) {
		ctx := context.Background()
		s, shared, local := newSplit(t)
		account := "acme/ca.example-dir/users/ops@example.test/ops.key"
		cert := "certificates/ca.example-dir/a.test/a.test.crt"
		for _, k := range []string{account, cert} {
			if err := s.Store(ctx, k, []byte("v")); err != nil {
				t.Fatal(err)
			}
		}
		if shared.Exists(ctx, account) || !local.Exists(ctx, account) {
			t.Error("the account key is not kept only locally")
		}
		if !shared.Exists(ctx, cert) || local.Exists(ctx, cert) {
			t.Error("the certificate is not kept only in the shared store")
		}
		keys, err := s.List(ctx, "acme/ca.example-dir", false)
		if err != nil || !slices.Equal(keys, []string{"acme/ca.example-dir/users"}) {
			t.Errorf("List(acme/ca) = %q, %v; want the local users directory", keys, err)
		}
	})
}

func TestZapBridge(t *testing.T) {
	var buf bytes.Buffer
	zl := newZapLogger(zerolog.New(&buf).Level(zerolog.InfoLevel))
	zl.Named("obtain").Debug("dropped")
	zl.Named("obtain").Info("certificate obtained", zap.String("identifier", "a.test"), zap.Int("attempt", 2))
	var got map[string]any
	if err := json.Unmarshal(bytes.TrimSpace(buf.Bytes()), &got); err != nil {
		t.Fatalf("one JSON line expected, got %q: %v", buf.String(), err)
	}
	if got["level"] != "info" || got["message"] != "certificate obtained" || got["logger"] != "certmagic.obtain" ||
		got["identifier"] != "a.test" || got["attempt"] != float64(2) {
		t.Errorf("bridged event = %v", got)
	}
	if zl := newZapLogger(zerolog.Logger{}); zl.Core().Enabled(zap.ErrorLevel) {
		t.Error("the zero zerolog.Logger should make a no-op zap logger")
	}
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }

func TestIssuanceSlots(t *testing.T) {
	m := &Manager{slots: make(chan struct{}, 1), held: map[string]int{}, backoff: newIssuanceBackoff(time.Minute, time.Minute, nil)}
	var err error
	if m.metrics, err = newMetrics(nil, m); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := m.onEvent(ctx, "cert_obtaining", map[string]any{"identifier": "a.test"}); err != nil {
		t.Fatalf("first issuance refused a free slot: %v", err)
	}
	t.Run("an issuance beyond the bound waits and gives up with its context", func(t *testing.T) {
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		err := m.onEvent(short, "cert_obtaining", map[string]any{"identifier": "b.test"})
		var noRetry certmagic.ErrNoRetry
		if !errors.As(err, &noRetry) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("second issuance = %v, want ErrNoRetry wrapping the deadline", err)
		}
	})
	t.Run("a finished issuance frees its slot for the next", func(t *testing.T) {
		done := make(chan error, 1)
		go func() { done <- m.onEvent(ctx, "cert_obtaining", map[string]any{"identifier": "c.test"}) }()
		m.onEvent(ctx, "cert_failed", map[string]any{"identifier": "a.test", "renewal": true})
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("waiting issuance = %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("waiting issuance never got the freed slot")
		}
		m.onEvent(ctx, "cert_obtained", map[string]any{"identifier": "c.test"})
		if len(m.slots) != 0 || len(m.held) != 0 {
			t.Errorf("slots in use = %d, held = %v; want none", len(m.slots), m.held)
		}
	})
	t.Run("an outcome for a name that took no slot frees nothing", func(t *testing.T) {
		m.onEvent(ctx, "cert_obtaining", map[string]any{"identifier": "d.test"})
		m.onEvent(ctx, "cert_obtained", map[string]any{"identifier": "never-started.test"})
		if len(m.slots) != 1 {
			t.Errorf("slots in use = %d, want 1", len(m.slots))
		}
	})
}
