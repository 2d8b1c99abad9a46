package certs

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"

	"github.com/scafo/scafo-edge/certs/prefetch"
)

// countingStorage counts the reads that reach a certificate storage: with
// the fleet store, each is a request to the node.
type countingStorage struct {
	certmagic.Storage
	reads atomic.Int64
}

func (s *countingStorage) Load(ctx context.Context, key string) ([]byte, error) {
	s.reads.Add(1)
	return s.Storage.Load(ctx, key)
}

func (s *countingStorage) Exists(ctx context.Context, key string) bool {
	s.reads.Add(1)
	return s.Storage.Exists(ctx, key)
}

// TestChallengePathsReadStorageOnlyForNamedHosts: a reachability check
// for a host the live document does not name costs no storage read
// (docs/design.md rule 8: no certificate, so no check, for such a name);
// HTTP-01 tokens for such hosts, which an edge with a newer document may
// have stored, cost at most unnamedChallengeBurst reads at once and
// unnamedChallengeRate a second after, however many hosts ask; a named
// host's still reads its token.
func TestChallengePathsReadStorageOnlyForNamedHosts(t *testing.T) {
	e := newTestEdge(t)
	store := &countingStorage{Storage: &certmagic.FileStorage{Path: t.TempDir()}}
	// The rate is read on the Manager's clock, which moves only here.
	clk := newFakeClock()
	// The CA is never contacted: no name is issued here.
	e.start(t, t.TempDir(), Options{Allowed: newNameSet("named.test").Allowed, CA: "https://127.0.0.1:9/dir", Storage: store, Clock: clk})
	const (
		reachToken = "0123456789abcdef0123456789abcdef"
		acmeToken  = "evaGxfADs6pSRb2LAv9IZf17Dt3juxGJ-PCt92wr-oA"
	)
	paths := []string{prefetch.ReachPath + reachToken, "/.well-known/acme-challenge/" + acmeToken}
	get := func(host, path string) {
		t.Helper()
		// What is answered is the routing's affair (here the test's
		// inner handler); what matters is the storage reads.
		if _, _, err := e.getHTTP(host, path); err != nil {
			t.Fatalf("GET http://%s%s: %v", host, path, err)
		}
	}
	flood := func(round int) int64 {
		t.Helper()
		before := store.reads.Load()
		for i := range 150 {
			for _, p := range paths {
				get(fmt.Sprintf("stranger%d-%d.test", round, i), p)
			}
		}
		return store.reads.Load() - before
	}
	if got := flood(0); got != unnamedChallengeBurst {
		t.Errorf("300 challenge requests for hosts the document does not name cost %d storage reads, want %d (the burst of HTTP-01 look-ups, no reachability check)", got, unnamedChallengeBurst)
	}
	clk.Advance(time.Second)
	if got := flood(1); got != unnamedChallengeRate {
		t.Errorf("300 more a second later cost %d storage reads, want %d (the rate)", got, unnamedChallengeRate)
	}
	for _, p := range paths {
		before := store.reads.Load()
		get("named.test", p)
		if got := store.reads.Load() - before; got != 1 {
			t.Errorf("GET http://named.test%s cost %d storage reads, want 1 (its token is looked up)", p, got)
		}
	}
}
