package e2e

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/scafo/scafo-edge/node"
)

// TestNewFlagsAreValidated: bad values of the flags this round added stop
// the start with a non-zero exit and a message naming the flag (and, for
// a broken operator file, the file, line and field).
func TestNewFlagsAreValidated(t *testing.T) {
	dir := t.TempDir()
	routes := writeRoutesFile(t, dir, &node.Document{V: 1, Routes: []node.Route{}})
	broken := filepath.Join(dir, "operator.json")
	if err := os.WriteFile(broken, []byte(`{"v": 1, "routes": [{"host": "x.example", "upstreams": [{"address": "127.0.0.1"}]}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	plain := []string{"--routes-file", routes, "--tls", "off"}
	acme := []string{"--routes-file", routes, "--tls", "acme", "--acme-email", "ops@example.com", "--wildcard-domains", "example.com"}
	for _, c := range []struct {
		name string
		args []string
		env  []string
		want []string // all in the output
	}{
		{"a negative body limit", slices.Concat(plain, []string{"--max-body-bytes", "-1"}), nil, []string{"max-body-bytes", `"-1"`}},
		{"a body limit in an unknown unit", slices.Concat(plain, []string{"--max-body-bytes", "10XB"}), nil, []string{"max-body-bytes", "10XB"}},
		{"error pages that are not there", slices.Concat(plain, []string{"--error-pages", filepath.Join(dir, "none")}), nil, []string{"error-pages", "no such file"}},
		{"an unknown access log format", slices.Concat(plain, []string{"--access-log-format", "xml"}), nil, []string{"access-log-format", "json or combined"}},
		{"a compression flag that is no boolean", slices.Concat(plain, []string{"--compress=maybe"}), nil, []string{"compress"}},
		{"an operator file that is not there", slices.Concat(plain, []string{"--operator-routes", filepath.Join(dir, "none.json")}), nil, []string{"--operator-routes", "none.json"}},
		{"a broken operator file", slices.Concat(plain, []string{"--operator-routes", broken}), nil, []string{"--operator-routes", "operator.json:1:", "routes[0].upstreams[0].address"}},
		{"an unknown DNS provider", slices.Concat(acme, []string{"--dns-provider", "bogus"}), nil, []string{"--dns-provider", "bogus", "rfc2136"}},
		{"a DNS provider without its variables", slices.Concat(acme, []string{"--dns-provider", "rfc2136"}), nil, []string{"--dns-provider", "RFC2136_NAMESERVER"}},
		{"a negative propagation timeout", slices.Concat(acme, []string{"--dns-provider", "cloudflare", "--dns-propagation-timeout", "-1s"}), []string{"CLOUDFLARE_API_TOKEN=x"}, []string{"--dns-propagation-timeout"}},
		{"a resolver with a bad port", slices.Concat(acme, []string{"--dns-provider", "cloudflare", "--dns-resolvers", "192.0.2.1:99999"}), []string{"CLOUDFLARE_API_TOKEN=x"}, []string{"--dns-resolvers", "192.0.2.1:99999"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, kv := range c.env {
				k, v, _ := strings.Cut(kv, "=")
				t.Setenv(k, v)
			}
			code, out := runEdgeToExit(t, edgeBinary, nil, slices.Concat([]string{"--state-dir", t.TempDir()}, c.args)...)
			if code == 0 {
				t.Fatalf("exit 0, want non-zero:\n%s", out)
			}
			for _, w := range c.want {
				if !strings.Contains(out, w) {
					t.Errorf("output does not name %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, "scafo-edge started") {
				t.Errorf("the edge started with %v", c.args)
			}
		})
	}
}
