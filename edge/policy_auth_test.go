package edge

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

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

// While the box's rate of checks is spent, a guesser's address gets its
// few checks and then 429, whatever the password; another address is
// still checked, and a pair that passed before is still let in without a
// check. On an idle box, an address past its own burst is still checked:
// an office behind one NAT logs in as fast as it types.
func TestBasicAuthChecksAreRatedByAddress(t *testing.T) {
	hash, _ := bcrypt.GenerateFromPassword([]byte("right"), bcrypt.MinCost)
	ctx := context.Background()
	office := netip.MustParseAddr("192.0.2.9")
	idle := newVerifier()
	for i := range checksPerClientBurst + 1 {
		if got := idle.verify(ctx, office, hash, "wrong"); got != authRefused {
			t.Fatalf("idle box, check %d from one address = %d, want refused (checked)", i+1, got)
		}
	}
	v := newVerifier()
	guesser, other := netip.MustParseAddr("198.51.100.7"), netip.MustParseAddr("2001:db8::1")
	if got := v.verify(ctx, other, hash, "right"); got != authPassed {
		t.Fatalf("first check from another address = %d, want passed", got)
	}
	v.rate.AllowN(time.Now(), int(v.rate.Tokens())) // the box's rate spent, as under a guesser
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
