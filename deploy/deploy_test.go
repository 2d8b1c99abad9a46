// Package deploy's tests hold the deployment files beside them to account:
// the Compose example and the systemd unit are parsed and checked against the
// serve command's flags, read from the flag table in docs/flags.md (which
// cmd/scafo-edge's TestREADMEFlags keeps equal to the flag set).
package deploy

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// pkgRoot is the module root relative to this directory, where go test
// runs.
const pkgRoot = ".."

// flagRow matches a row of the flag table in docs/flags.md:
// | `--name` | `ENV`, `ENV2` | `default` | what it does |
var flagRow = regexp.MustCompile("(?m)^\\| `--([^`]+)` \\| ([^|]*) \\| ([^|]*) \\|")

// readmeFlags returns the rows of the flag table in docs/flags.md: each serve flag
// with its default ("" for none) and its environment variables.
func readmeFlags(t *testing.T) (defaults map[string]string, envs map[string][]string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(pkgRoot, "docs", "flags.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	i, j := strings.Index(text, "<!-- flags:start -->"), strings.Index(text, "<!-- flags:end -->")
	if i < 0 || j < i {
		t.Fatal("docs/flags.md lacks its flag table markers")
	}
	defaults, envs = map[string]string{}, map[string][]string{}
	for _, m := range flagRow.FindAllStringSubmatch(text[i:j], -1) {
		name, env, def := m[1], strings.TrimSpace(m[2]), strings.TrimSpace(m[3])
		defaults[name] = strings.Trim(strings.TrimPrefix(def, "—"), "`")
		for _, e := range strings.Split(env, ",") {
			if e = strings.Trim(strings.TrimSpace(e), "`"); e != "" && e != "—" {
				envs[name] = append(envs[name], e)
			}
		}
	}
	if len(defaults) == 0 {
		t.Fatal("docs/flags.md's flag table has no rows")
	}
	return defaults, envs
}

// serveDefaults maps each serve flag to its default.
func serveDefaults(t *testing.T) map[string]string {
	defaults, _ := readmeFlags(t)
	return defaults
}

// serveEnvNames is every environment variable a serve flag reads, plus the DNS
// provider's token, which certmagic's provider reads itself.
func serveEnvNames(t *testing.T) map[string]bool {
	out := map[string]bool{"CLOUDFLARE_API_TOKEN": true}
	_, envs := readmeFlags(t)
	for _, names := range envs {
		for _, e := range names {
			out[e] = true
		}
	}
	return out
}
