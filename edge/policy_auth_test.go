package edge

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"golang.org/x/crypto/bcrypt"

	"github.com/scafo/scafo-edge/node"
)

// A user the route does not know is checked as slowly as its costliest
// user, and never faster than bcrypt's default cost, so that the time a refusal takes does not tell which users exist;
// and a password is remembered by the 72 bytes bcrypt reads, so that
// suffixes of one good password do not fill the cache.
func TestBasicAuthGivesNothingAwayAndCachesWhatBcryptReads(t *testing.T) {
	pass := strings.Repeat("p", 72)
	hash, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.MinCost+2)
	if err != nil {
		t.Fatal(err)
	}
	cheap, _ := bcrypt.GenerateFromPassword([]byte("x"), bcrypt.MinCost)
	v := newVerifier()
	p := newPolicy("tool.example", &node.OperatorRoute{BasicAuth: &node.BasicAuth{Users: []string{
		"ann:" + string(hash), "bob:" + string(cheap),
	}}}, v)
	if got, _ := bcrypt.Cost(p.auth.unknown); got != bcrypt.DefaultCost {
		t.Errorf("unknown users are checked at cost %d, want %d (the default, above every user's)", got, bcrypt.DefaultCost)
	}
	for _, suffix := range []string{"", "a", "bb", "ccc"} {
		if got := v.verify(context.Background(), netip.MustParseAddr("192.0.2.1"), hash, pass+suffix); got != authPassed {
			t.Fatalf("verify(%q) = %d, want passed (bcrypt reads 72 bytes)", suffix, got)
		}
	}
	if n := len(v.passed); n != 1 {
		t.Errorf("%d pairs remembered for one password and its suffixes, want 1", n)
	}
}

// A guesser's address gets its few checks and then 429, whatever the
// password; another address is still checked, and a pair that passed
// before is still let in without a check.
func TestBasicAuthChecksAreRatedByAddress(t *testing.T) {
	hash, _ := bcrypt.GenerateFromPassword([]byte("right"), bcrypt.MinCost)
	v := newVerifier()
	ctx := context.Background()
	guesser, other := netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("2001:db8::1")
	if got := v.verify(ctx, other, hash, "right"); got != authPassed {
		t.Fatalf("first check from another address = %d, want passed", got)
	}
	for i := range checksPerClientBurst {
		if got := v.verify(ctx, guesser, hash, "wrong"); got != authRefused {
			t.Fatalf("wrong password %d = %d, want refused", i+1, got)
		}
	}
	if got := v.verify(ctx, guesser, hash, "wrong"); got != authLimited {
		t.Errorf("a check past the address's burst = %d, want limited", got)
	}
	if got := v.verify(ctx, guesser, hash, "right"); got != authPassed {
		t.Errorf("a remembered pair from a limited address = %d, want passed without a check", got)
	}
	if got := v.verify(ctx, netip.MustParseAddr("2001:db8::2"), hash, "wrong"); got != authRefused {
		t.Errorf("a check from the other address's /64 = %d, want refused (that /64's burst not spent)", got)
	}
}
