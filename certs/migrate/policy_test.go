package migrate

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/certmagic"
)

func TestCheckPolicy(t *testing.T) {
	other := newAuthority()
	otherIssued := sign(t, &other, now.Add(-time.Hour), now.Add(30*24*time.Hour), false, "shop.example")
	lifetime := func(d time.Duration) issued {
		return issue(t, now.Add(-time.Hour), now.Add(-time.Hour+d), false, "shop.example")
	}
	untrusted := Policy{Now: now, Roots: testCA.pool, AllowUntrusted: true}
	cases := []struct {
		name string
		in   issued
		p    Policy
		want error
	}{
		{"a chain to a trusted root is imported", valid(t, "shop.example"), policy, nil},
		{"a self-signed certificate is refused", selfSigned(t, "bank.example.net"), policy, ErrUntrusted},
		{"a self-signed certificate is imported with AllowUntrusted", selfSigned(t, "bank.example.net"), untrusted, nil},
		{"a chain to another root is refused", otherIssued, policy, ErrUntrusted},
		{"the system roots trust no test CA", valid(t, "shop.example"), Policy{Now: now}, ErrUntrusted},
		{"a self-signed *.com is refused for its name even with AllowUntrusted", selfSigned(t, "bank.example.net", "*.com"), untrusted, ErrSuffixWildcard},
		{"a trusted wildcard_ name is refused for its key", valid(t, "wildcard_.example.com"), policy, ErrSharedKey},
		{"398 days of validity are imported", lifetime(MaxLifetime), policy, nil},
		{"398 days and a second are refused", lifetime(MaxLifetime + time.Second), policy, ErrTooLong},
		{"a century of validity is refused", issue(t, now.Add(-time.Hour), time.Date(2126, 1, 1, 0, 0, 0, 0, time.UTC), false, "shop.example"), policy, ErrTooLong},
		{"a century is refused with AllowUntrusted too", issue(t, now.Add(-time.Hour), time.Date(2126, 1, 1, 0, 0, 0, 0, time.UTC), false, "shop.example"), untrusted, ErrTooLong},
		{"a certificate valid from next year is refused", issue(t, now.AddDate(1, 0, 0), now.AddDate(1, 1, 0), false, "shop.example"), untrusted, ErrNotYetValid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Check(Candidate{CertPEM: tc.in.cert, KeyPEM: tc.in.key}, tc.p)
			if !errors.Is(err, tc.want) {
				t.Errorf("Check() = %v, want %v", err, tc.want)
			}
		})
	}
}

// TestHostileWildcardKeepsNothingOut is the attack of issue 50 item 3:
// after the real *.example.com is stored, a certificate for
// wildcard_.example.com (certmagic's key for *.example.com) valid until
// 2126 would have replaced it, being "later", and kept every renewal
// out. It is refused, and so is a long-lived one for *.example.com
// itself; a stored certificate valid for longer than a CA issues
// (imported before these checks) does not keep a real one out either.
func TestHostileWildcardKeepsNothingOut(t *testing.T) {
	ctx := context.Background()
	st := &memStore{m: map[string][]byte{}}
	real := valid(t, "*.example.com")
	century := time.Date(2126, 1, 1, 0, 0, 0, 0, time.UTC)
	cands := []Candidate{
		{Source: "real", Names: []string{"*.example.com"}, CertPEM: real.cert, KeyPEM: real.key},
		hostile(t, "wildcard_.example.com", now.Add(300*24*time.Hour)),
		hostile(t, "wildcard_.example.com", century),
		hostile(t, "*.example.com", century),
	}
	var out strings.Builder
	sum, err := Run(ctx, cands, Options{Store: st, IssuerKey: "ca", Policy: policy}, &out)
	if err != nil || sum.Imported != 1 || sum.Refused != 3 {
		t.Fatalf("Run() = %+v, %v; want 1 imported, 3 refused:\n%s", sum, err, out.String())
	}
	for _, want := range []string{
		`refused    "wildcard_.example.com": certificate names a DNS name filed under another name's storage key: "wildcard_.example.com" is filed as "wildcard_.example.com", the key of "*.example.com"`,
		`refused    "*.example.com": valid for longer than a CA issues:`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("Run() output lacks %q:\n%s", want, out.String())
		}
	}
	if got := string(st.m[certmagic.StorageKeys.SiteCert("ca", "*.example.com")]); got != string(real.cert) {
		t.Errorf("the store's *.example.com is not the real certificate")
	}

	// A century-long certificate already in the store, under the keys of
	// a name: the real one replaces it.
	long := issue(t, now.Add(-time.Hour), century, false, "shop.example")
	for key, val := range map[string][]byte{
		certmagic.StorageKeys.SiteCert("ca", "shop.example"):       long.cert,
		certmagic.StorageKeys.SitePrivateKey("ca", "shop.example"): long.key,
		certmagic.StorageKeys.SiteMeta("ca", "shop.example"):       []byte(`{"sans":["shop.example"]}`),
	} {
		st.m[key] = val
	}
	shop := valid(t, "shop.example")
	c, err := Check(Candidate{CertPEM: shop.cert, KeyPEM: shop.key}, policy)
	if err != nil {
		t.Fatal(err)
	}
	if o, err := Write(ctx, st, "ca", c); err != nil || len(o.Written) != 1 {
		t.Errorf("Write() over a stored century-long certificate = %+v, %v; want it written", o, err)
	}
}

// hostile is a candidate an attacker made: a certificate for name from
// the trusted test CA, valid from now until notAfter.
func hostile(t *testing.T, name string, notAfter time.Time) Candidate {
	in := issue(t, now.Add(-time.Hour), notAfter, false, name)
	return Candidate{Source: "attacker", Names: []string{name}, CertPEM: in.cert, KeyPEM: in.key}
}

// TestRunEscapesWhatItPrints: names, sources and reasons come from
// another proxy's files; none reaches the terminal raw.
func TestRunEscapesWhatItPrints(t *testing.T) {
	const esc = "\x1b[2J\x1b[H"
	good := valid(t, "shop.example")
	evil := valid(t, esc+"evil.example")
	cands := []Candidate{
		{Source: "resolver " + esc + " #1", Names: []string{esc + "shop.example"}, CertPEM: good.cert, KeyPEM: good.key},
		{Source: "dir/" + esc, Names: []string{esc + "x"}, CertPEM: evil.cert, KeyPEM: evil.key},
		{Source: "\u202e", Names: []string{"\u202ex"}, Err: errors.New("reason " + esc + " \xff")},
	}
	var out strings.Builder
	if _, err := Run(context.Background(), cands, Options{Store: &memStore{m: map[string][]byte{}}, IssuerKey: "ca", Policy: policy}, &out); err != nil {
		t.Fatal(err)
	}
	if strings.ContainsAny(out.String(), "\x1b\u202e\ufffd") {
		t.Errorf("Run() printed a control character raw:\n%q", out.String())
	}
	for _, want := range []string{
		`(from "resolver \x1b[2J\x1b[H #1")`,
		`refused    "\x1b[2J\x1b[Hx": certificate names a DNS name that is no hostname: "\x1b[2j\x1b[hevil.example" (from "dir/\x1b[2J\x1b[H")`,
		`refused    "\u202ex": reason \x1b[2J\x1b[H \xff (from "\u202e")`,
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("Run() output lacks %s:\n%s", want, out.String())
		}
	}
}
