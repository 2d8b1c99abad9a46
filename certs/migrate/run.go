package migrate

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"
)

// Options configures Run.
type Options struct {
	// Store is where certificates go; IssuerKey the key component of the
	// edge's ACME CA (IssuerKey(--acme-ca)).
	Store     Store
	IssuerKey string
	// Renewed reports whether the edge keeps "*.<base>" renewed by DNS-01
	// (--dns-provider with base in --wildcard-domains); nil: none is.
	Renewed func(base string) bool
	// Now is the time certificates are checked at; zero: time.Now().
	Now time.Time
}

// Summary counts what Run did, one certificate each.
type Summary struct {
	Imported, Unchanged, Kept, Refused int
	// Lapsing are the wildcard names imported that nothing will renew.
	Lapsing []string
}

// Run checks and writes each candidate, printing to w a line per
// certificate (what was done, its names, when it expires, where it came
// from, or why it was refused), a warning per wildcard nothing will
// renew, and a summary. A refused certificate writes nothing and does not
// stop the others; an error from the store does.
func Run(ctx context.Context, cands []Candidate, o Options, w io.Writer) (Summary, error) {
	var sum Summary
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	for _, cand := range cands {
		c, err := Check(cand, now)
		if err != nil {
			sum.Refused++
			fmt.Fprintf(w, "refused    %s: %v (%s)\n", names(cand.Names), err, cand.Source)
			continue
		}
		out, err := Write(ctx, o.Store, o.IssuerKey, c)
		if err != nil {
			return sum, fmt.Errorf("%s (%s): %w", names(c.Names), c.Source, err)
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
		fmt.Fprintf(w, "%-10s %s: not after %s (%s)%s\n", verb, names(c.Names), c.Leaf.NotAfter.UTC().Format(time.RFC3339), c.Source, note)
		for _, n := range c.Names {
			base, ok := strings.CutPrefix(n, "*.")
			if !ok || (o.Renewed != nil && o.Renewed(base)) {
				continue
			}
			sum.Lapsing = append(sum.Lapsing, n)
			fmt.Fprintf(w, "warning    %s: no DNS-01 provider renews it (--dns-provider, --wildcard-domains %s); served until it lapses at %s, then hosts under it lose HTTPS\n",
				n, base, c.Leaf.NotAfter.UTC().Format(time.RFC3339))
		}
	}
	fmt.Fprintf(w, "%d certificates: %d imported, %d unchanged, %d kept, %d refused\n",
		len(cands), sum.Imported, sum.Unchanged, sum.Kept, sum.Refused)
	return sum, nil
}

func names(ns []string) string {
	if len(ns) == 0 || (len(ns) == 1 && ns[0] == "") {
		return "(no name)"
	}
	return strings.Join(ns, ", ")
}
