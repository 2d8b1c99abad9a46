package edge

import (
	"context"
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
		if got := v.verify(context.Background(), hash, pass+suffix); got != authPassed {
			t.Fatalf("verify(%q) = %d, want passed (bcrypt reads 72 bytes)", suffix, got)
		}
	}
	if n := len(v.passed); n != 1 {
		t.Errorf("%d pairs remembered for one password and its suffixes, want 1", n)
	}
}
