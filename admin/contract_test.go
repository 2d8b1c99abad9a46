package admin

import (
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/certs"
)

// statusJSONKeys is every key path status.json carries with a document, an
// API apex, an ejected upstream, a certificate, names waiting for
// prefetch and a name with failed validations: the contract with scripts. Adding a field adds a line here;
// renaming or removing one fails this test on purpose.
var statusJSONKeys = []string{
	"api", "api.denied", "api.hosts", "api.upstreams",
	"api.upstreams.address", "api.upstreams.consecutive_failures", "api.upstreams.health", "api.upstreams.node",
	"certificates", "certificates.expires_in", "certificates.expiring", "certificates.issuer", "certificates.names", "certificates.not_after",
	"certificate_prefetch", "certificate_prefetch.added", "certificate_prefetch.error", "certificate_prefetch.failures",
	"certificate_prefetch.name", "certificate_prefetch.next_try", "certificate_prefetch.state",
	"failed_validations", "failed_validations.ca_limit", "failed_validations.held_until", "failed_validations.last_hour", "failed_validations.name",
	"document", "document.age_seconds", "document.api_hosts", "document.fetched_at", "document.fingerprint",
	"document.path_prefixes", "document.routes", "document.stale",
	"generated_at",
	"poll", "poll.consecutive_failures", "poll.last_attempt", "poll.last_change", "poll.last_error", "poll.last_success", "poll.source", "poll.stale",
	"routes", "routes.application", "routes.host", "routes.path_count", "routes.paths",
	"routes.paths.application", "routes.paths.prefix", "routes.paths.target",
	"routes.upstreams", "routes.upstreams.address", "routes.upstreams.consecutive_failures", "routes.upstreams.ejected_until",
	"routes.upstreams.health", "routes.upstreams.node", "routes.wildcard", "routes.source",
	"started",
	"upstream_health", "upstream_health.address", "upstream_health.consecutive_failures", "upstream_health.ejected_until",
	"upstream_health.health", "upstream_health.node",
	"version",
}

func TestStatusJSONKeysAreAContract(t *testing.T) {
	f := newStatusFixture(t)
	a := *f.admin
	a.Certificates = func() []certs.CertInfo {
		return []certs.CertInfo{{Names: []string{"shop.example.test"}, Issuer: "Scafo internal CA", NotAfter: statusT0.Add(time.Hour)}}
	}
	a.Prefetch = prefetchFixture
	a.FailedValidations = func() []certs.ValidationCount {
		return []certs.ValidationCount{{Name: "broken.example.test", Failed: 4, HeldUntil: statusT0.Add(time.Hour)}}
	}
	rec := serveAdmin(a.Handler(), "/status.json", "127.0.0.1:1", "")
	var doc any
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		t.Fatalf("decode status.json: %v", err)
	}
	seen := map[string]bool{}
	collectKeys(doc, "", seen)
	got := make([]string, 0, len(seen))
	for k := range seen {
		got = append(got, k)
	}
	sort.Strings(got)
	want := slices.Clone(statusJSONKeys)
	sort.Strings(want)
	if !slices.Equal(got, want) {
		t.Errorf("status.json keys changed:\n got %s\nwant %s", strings.Join(got, " "), strings.Join(want, " "))
	}
}

// collectKeys adds the dotted path of every object key under v to seen;
// arrays add their elements' keys under the array's own path.
func collectKeys(v any, prefix string, seen map[string]bool) {
	switch v := v.(type) {
	case map[string]any:
		for k, child := range v {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			seen[p] = true
			collectKeys(child, p, seen)
		}
	case []any:
		for _, child := range v {
			collectKeys(child, prefix, seen)
		}
	}
}
