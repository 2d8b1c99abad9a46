package migrate

import (
	"context"
	"slices"
	"strings"
	"testing"
)

// TestRunSaysWhetherDNS01RenewsAWildcard is issue 47 item 5 as the
// import reports it: with a DNS provider (Renewed) a wildcard's line says
// DNS-01 renews it, naming the provider, and it is not lapsing; without
// one the warning stays. A certificate without a wildcard gets neither.
func TestRunSaysWhetherDNS01RenewsAWildcard(t *testing.T) {
	wild, single := valid(t, "*.apps.example"), valid(t, "single.example")
	cands := []Candidate{
		{Source: "s1", Names: []string{"*.apps.example"}, CertPEM: wild.cert, KeyPEM: wild.key},
		{Source: "s2", Names: []string{"single.example"}, CertPEM: single.cert, KeyPEM: single.key},
	}
	for _, tc := range []struct {
		name     string
		renewed  func(string) bool
		provider string
		want     string
		lapsing  []string
	}{
		{"no provider", nil, "", `warning    "*.apps.example": no DNS-01 provider renews it (with --dns-provider the edge renews it while the routing document names it)`, []string{"*.apps.example"}},
		{"a provider", func(string) bool { return true }, "rfc2136", `renewed    "*.apps.example": by DNS-01 (--dns-provider rfc2136) while the routing document names it`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			sum, err := Run(context.Background(), cands, Options{Store: &memStore{m: map[string][]byte{}}, IssuerKey: "ca", Policy: policy,
				Renewed: tc.renewed, DNSProvider: tc.provider}, &out)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out.String(), tc.want) || !slices.Equal(sum.Lapsing, tc.lapsing) {
				t.Errorf("Run() lapsing %v, output:\n%s\nwant %q and lapsing %v", sum.Lapsing, out.String(), tc.want, tc.lapsing)
			}
			if n := strings.Count(out.String(), "renewed    ") + strings.Count(out.String(), "warning    "); n != 1 {
				t.Errorf("%d renewal lines, want 1 (the wildcard's):\n%s", n, out.String())
			}
		})
	}
}
