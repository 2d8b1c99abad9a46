package migrate

import (
	"errors"
	"fmt"
	"strings"

	"github.com/caddyserver/certmagic"
	"golang.org/x/net/publicsuffix"

	"github.com/scafo/scafo-edge/internal/hostname"
)

// Reasons a certificate's name is refused; checkName wraps one of them.
var (
	ErrBadName        = errors.New("certificate names a DNS name that is no hostname")
	ErrSharedKey      = errors.New("certificate names a DNS name filed under another name's storage key")
	ErrSuffixWildcard = errors.New("certificate names a wildcard for a public suffix")
)

// checkName returns nil when n (lower-cased, without a trailing dot) may
// be imported: a hostname as the edge routes one (internal/hostname), or
// "*." and one; filed by certmagic under keys no other such name shares;
// and, for a wildcard, not covering a whole public suffix.
func checkName(n string) error {
	base, wild := strings.CutPrefix(n, "*.")
	// Normalise also takes a port, which it drops (so h differs), and a
	// bracketed IPv6 literal, which it keeps: no DNS name either.
	if h, ok := hostname.Normalise(base); !ok || h != base || strings.HasPrefix(base, "[") {
		return fmt.Errorf("%w: %q", ErrBadName, n)
	}
	if key := storageKey(n); key != spelling(n) || strings.HasPrefix(n, "wildcard_.") {
		return fmt.Errorf("%w: %q is filed as %q, the key of %q", ErrSharedKey, n, key, owner(key))
	}
	if wild {
		// A CA issues no wildcard for a public suffix (CA/B Forum BR
		// 3.2.2.6); one for "*.com" would be offered for every .com name
		// the edge has no certificate of its own for.
		if suffix, _ := publicsuffix.PublicSuffix(base); suffix == base {
			return fmt.Errorf("%w: %q (%q is a public suffix)", ErrSuffixWildcard, n, base)
		}
	}
	return nil
}

// storageKey is the key component certmagic files n under: the one
// StorageKeys.SiteCert, SitePrivateKey and SiteMeta use.
func storageKey(n string) string { return certmagic.StorageKeys.Safe(n) }

// spelling is the key a valid name owns: itself, with a leftmost "*"
// spelt "wildcard_" as KeyBuilder.Safe spells it. A name whose key is
// anything else had a character Safe drops or rewrites ("a/b" and "ab"
// share one key); a name spelt as another's key ("wildcard_.example.com"
// is "*.example.com" to certmagic) would read and overwrite that name's
// certificate, or, with a later NotAfter, keep its renewal out.
func spelling(n string) string {
	if base, ok := strings.CutPrefix(n, "*."); ok {
		return "wildcard_." + base
	}
	return n
}

// owner is the name a storage key belongs to, for the report.
func owner(key string) string {
	if base, ok := strings.CutPrefix(key, "wildcard_."); ok {
		return "*." + base
	}
	return key
}
