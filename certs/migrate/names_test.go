package migrate

import (
	"errors"
	"testing"

	"github.com/caddyserver/certmagic"
)

func TestCheckName(t *testing.T) {
	cases := []struct {
		name string
		n    string
		want error
	}{
		{"a hostname is imported", "shop.example.com", nil},
		{"a hostname with an underscore is imported, as the edge routes it", "under_score.example.com", nil},
		{"an IDNA name is imported", "xn--bcher-kva.example", nil},
		{"a single label is imported", "localhost", nil},
		{"a wildcard over a registrable domain is imported", "*.example.com", nil},
		{"a wildcard over a subdomain is imported", "*.apps.example.co.uk", nil},
		{"a label spelt wildcard_ below the leftmost is its own key", "a.wildcard_.example.com", nil},
		{"a leftmost wildcard_ is refused: it is *.example.com's key", "wildcard_.example.com", ErrSharedKey},
		{"a leftmost wildcard_ under a wildcard's base is refused", "wildcard_.apps.example.com", ErrSharedKey},
		{"a wildcard for a public suffix is refused", "*.com", ErrSuffixWildcard},
		{"a wildcard for a two-label public suffix is refused", "*.co.uk", ErrSuffixWildcard},
		{"a wildcard for a private public suffix is refused", "*.github.io", ErrSuffixWildcard},
		{"a wildcard for an unlisted top-level domain is refused", "*.example", ErrSuffixWildcard},
		{"a wildcard that is not a whole label is refused", "*x.example.com", ErrBadName},
		{"a wildcard below the leftmost label is refused", "a.*.example.com", ErrBadName},
		{"two wildcards are refused", "*.*.example.com", ErrBadName},
		{"a bare wildcard is refused", "*", ErrBadName},
		{"a slash is refused: certmagic drops it, filing a/b as ab", "a/b.example", ErrBadName},
		{"a parent directory is refused", "../x.example", ErrBadName},
		{"an empty label is refused", "x..y.example", ErrBadName},
		{"a leading dot is refused", ".x.example", ErrBadName},
		{"a space is refused", "a b.example", ErrBadName},
		{"a plus is refused: certmagic spells it _plus_", "a+b.example", ErrBadName},
		{"a port is refused", "a.example:443", ErrBadName},
		{"an IPv6 literal is refused", "[::1]", ErrBadName},
		{"an at sign is refused", "a@b.example", ErrBadName},
		{"an escape sequence is refused", "\x1b[2J.example", ErrBadName},
		{"an empty name is refused", "", ErrBadName},
		{"a label longer than 63 is refused", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.example", ErrBadName},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := checkName(tc.n); !errors.Is(err, tc.want) {
				t.Errorf("checkName(%q) = %v, want %v", tc.n, err, tc.want)
			}
		})
	}
}

// TestImportedNamesOwnTheirKeys holds every name checkName lets through
// to certmagic's own key function: no two share a storage key, and each
// is filed under its own spelling, so no import can land on another
// name's certificate.
func TestImportedNamesOwnTheirKeys(t *testing.T) {
	names := []string{"example.com", "*.example.com", "wildcard_.example.com", "a.example.com", "*.a.example.com",
		"wildcard_.a.example.com", "a.wildcard_.example.com", "a_plus_b.example.com", "a+b.example.com", "ab.example.com",
		"a/b.example.com", "a b.example.com", "a_b.example.com", "a:b.example.com", "a-b.example.com", "a..b.example.com"}
	owners := map[string]string{}
	for _, n := range names {
		if checkName(n) != nil {
			continue
		}
		key := certmagic.StorageKeys.SiteCert("ca", n)
		if other, ok := owners[key]; ok {
			t.Errorf("%q and %q both imported under %s", other, n, key)
		}
		owners[key] = n
		if got := owner(storageKey(n)); got != n {
			t.Errorf("key of %q reads as %q", n, got)
		}
	}
}
