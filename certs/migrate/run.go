package migrate

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Options configures Run.
type Options struct {
	// Store is where certificates go; IssuerKey the key component of the
	// edge's ACME CA (IssuerKey(--acme-ca)).
	Store     Store
	IssuerKey string
	// Renewed reports whether the edge keeps "*.<base>" renewed by DNS-01:
	// with --dns-provider, as a --wildcard-domains base or while the
	// routing document names "*.<base>" (certs.HeldWildcards); nil: none
	// is.
	Renewed func(base string) bool
	// DNSProvider is --dns-provider, named where Run says a wildcard is
	// renewed.
	DNSProvider string
	// Policy is what each certificate is checked against.
	Policy
}

// Summary counts what Run did, one certificate each.
type Summary struct {
	Imported, Unchanged, Kept, Refused int
	// Lapsing are the wildcard names imported that nothing will renew.
	Lapsing []string
}

// Run checks and writes each candidate, printing to w a line per
// certificate (what was done, its names, when it expires, where it came
// from, or why it was refused), per wildcard whether DNS-01 renews it or
// a warning that nothing will, and a summary. A refused certificate writes nothing and does not
// stop the others; an error from the store does.
//
// Names, sources and reasons come from another proxy's files, maybe an
// attacker's: every one is printed quoted or escaped, so that none
// reaches the terminal as an escape sequence.
func Run(ctx context.Context, cands []Candidate, o Options, w io.Writer) (Summary, error) {
	var sum Summary
	p := o.Policy
	if p.Now.IsZero() {
		p.Now = time.Now()
	}
	for _, cand := range cands {
		c, err := Check(cand, p)
		if err != nil {
			sum.Refused++
			fmt.Fprintf(w, "refused    %s: %s (from %q)\n", names(cand.Names), printable(err.Error()), cand.Source)
			continue
		}
		out, err := Write(ctx, o.Store, o.IssuerKey, c)
		if err != nil {
			return sum, fmt.Errorf("%s (from %q): %w", names(c.Names), c.Source, err)
		}
		verb, note := "imported", ""
		switch {
		case len(out.Written) > 0:
			sum.Imported++
			if len(out.Kept) > 0 {
				note = "; kept the store's later certificate for " + names(out.Kept)
			}
		case len(out.Kept) > 0:
			sum.Kept++
			verb, note = "kept", "; the store holds a later certificate for "+names(out.Kept)
		default:
			sum.Unchanged++
			verb = "unchanged"
		}
		fmt.Fprintf(w, "%-10s %s: not after %s (from %q)%s\n", verb, names(c.Names), c.Leaf.NotAfter.UTC().Format(time.RFC3339), c.Source, note)
		for _, n := range c.Names {
			base, ok := strings.CutPrefix(n, "*.")
			if !ok {
				continue
			}
			if o.Renewed != nil && o.Renewed(base) {
				// o.DNSProvider is a flag value checked against the
				// edge's table of providers.
				fmt.Fprintf(w, "renewed    %q: by DNS-01 (--dns-provider %s) while the routing document names it\n", n, o.DNSProvider)
				continue
			}
			sum.Lapsing = append(sum.Lapsing, n)
			fmt.Fprintf(w, "warning    %q: no DNS-01 provider renews it (with --dns-provider the edge renews it while the routing document names it); served until it lapses at %s, then hosts under it lose HTTPS\n",
				n, c.Leaf.NotAfter.UTC().Format(time.RFC3339))
		}
	}
	fmt.Fprintf(w, "%d certificates: %d imported, %d unchanged, %d kept, %d refused\n",
		len(cands), sum.Imported, sum.Unchanged, sum.Kept, sum.Refused)
	return sum, nil
}

// names lists ns, each quoted.
func names(ns []string) string {
	if len(ns) == 0 || (len(ns) == 1 && ns[0] == "") {
		return "(no name)"
	}
	q := make([]string, len(ns))
	for i, n := range ns {
		q[i] = strconv.Quote(n)
	}
	return strings.Join(q, ", ")
}

// printable escapes in s what a terminal would act on or show as
// something else (control characters, bidirectional overrides, invalid
// UTF-8) as Go spells it in a quoted string, leaving the rest as it is:
// a reason is prose, with the names in it quoted already, but may carry
// the text of a certificate an attacker made (x509's errors name the
// issuer).
func printable(s string) string {
	var b strings.Builder
	for len(s) > 0 {
		r, size := utf8.DecodeRuneInString(s)
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[0])
		case strconv.IsPrint(r):
			b.WriteString(s[:size])
		default:
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		}
		s = s[size:]
	}
	return b.String()
}
