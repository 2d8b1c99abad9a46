package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// deploy/scafo-edge.service.

// TestSystemdUnit checks the unit runs serve as a non-root user that binds
// 80/443, keeps the state dir the flags expect, outwaits the shutdown timeout
// and sets only variables the binary reads; systemd-analyze verifies it where
// installed.
func TestSystemdUnit(t *testing.T) {
	t.Parallel()
	file := filepath.Join(pkgRoot, "deploy/scafo-edge.service")
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	unit := parseUnit(string(raw))
	svc := unit["Service"]
	defaults := serveDefaults(t)
	known := serveEnvNames(t)
	env := map[string]string{}
	for _, e := range svc["Environment"] {
		for _, kv := range strings.Fields(e) {
			k, v, _ := strings.Cut(kv, "=")
			env[k] = v
		}
	}

	cases := []struct {
		name string
		err  func() string
	}{
		{"ExecStart runs serve", func() string {
			f := strings.Fields(unitValue(svc["ExecStart"]))
			if len(f) < 2 || path.Base(f[0]) != "scafo-edge" || f[1] != "serve" {
				return fmt.Sprintf("ExecStart=%q, want .../scafo-edge serve", f)
			}
			return ""
		}},
		{"the service user binds 80 and 443 without root", func() string {
			if !strings.Contains(unitValue(svc["AmbientCapabilities"]), "CAP_NET_BIND_SERVICE") {
				return "AmbientCapabilities lacks CAP_NET_BIND_SERVICE"
			}
			if unitValue(svc["DynamicUser"]) != "yes" && unitValue(svc["User"]) == "" {
				return "neither DynamicUser=yes nor User= set: it would run as root"
			}
			return ""
		}},
		{"the state directory is the flags' state dir", func() string {
			want := defaults["state-dir"]
			if got := "/var/lib/" + unitValue(svc["StateDirectory"]); got != want {
				return fmt.Sprintf("StateDirectory gives %s, --state-dir default is %s", got, want)
			}
			if v, ok := env["SCAFO_EDGE_STATE_DIR"]; ok && v != want {
				return fmt.Sprintf("SCAFO_EDGE_STATE_DIR=%s, StateDirectory gives %s", v, want)
			}
			return ""
		}},
		{"the token comes from a credential file", func() string {
			cred, _, _ := strings.Cut(unitValue(svc["LoadCredential"]), ":")
			if cred == "" || env["SCAFO_INGRESS_TOKEN_FILE"] != "%d/"+cred {
				return fmt.Sprintf("LoadCredential=%v, SCAFO_INGRESS_TOKEN_FILE=%q: want the token file to be the credential", svc["LoadCredential"], env["SCAFO_INGRESS_TOKEN_FILE"])
			}
			return ""
		}},
		{"systemd waits longer than the shutdown timeout", func() string {
			stop, err := time.ParseDuration(unitValue(svc["TimeoutStopSec"]))
			shutdown, _ := time.ParseDuration(defaults["shutdown-timeout"])
			if err != nil || stop <= shutdown || unitValue(svc["KillSignal"]) != "SIGTERM" {
				return fmt.Sprintf("TimeoutStopSec=%v KillSignal=%v, want SIGTERM and more than %s", svc["TimeoutStopSec"], svc["KillSignal"], shutdown)
			}
			return ""
		}},
		{"the kernel holds the edge to a memory limit it can read", func() string {
			// A percentage of the box or a size: the edge reads the
			// result off its cgroup's memory.max.
			if v := unitValue(svc["MemoryMax"]); !regexp.MustCompile(`^([0-9]+%|[0-9]+[KMGT]?)$`).MatchString(v) {
				return fmt.Sprintf("MemoryMax=%q, want a percentage or a size: without one the kernel kills the edge only when the box runs out", v)
			}
			return ""
		}},
		{"every variable it sets is one the binary reads", func() string {
			for k := range env {
				if !known[k] {
					return k + " is not a variable of any serve flag"
				}
			}
			return ""
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if msg := tc.err(); msg != "" {
				t.Error(msg)
			}
		})
	}

	t.Run("systemd-analyze verify accepts it, where installed", func(t *testing.T) {
		sa, err := exec.LookPath("systemd-analyze")
		if err != nil {
			t.Skip("systemd-analyze not installed")
		}
		// verify insists ExecStart exists: point it at any executable.
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		re := regexp.MustCompile(`(?m)^ExecStart=\S+`)
		tmp := filepath.Join(t.TempDir(), "scafo-edge.service")
		if err := os.WriteFile(tmp, re.ReplaceAll(raw, []byte("ExecStart="+self)), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(sa, "verify", tmp).CombinedOutput()
		if err != nil || strings.Contains(string(out), "scafo-edge.service") {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	})
}

// TestSystemdTemplateUnitHasTheSameMemoryLimit: the blue/green instances
// are the same edge, and without a MemoryMax the kernel kills one only when
// the box runs out.
func TestSystemdTemplateUnitHasTheSameMemoryLimit(t *testing.T) {
	t.Parallel()
	memoryMax := func(name string) string {
		raw, err := os.ReadFile(filepath.Join(pkgRoot, "deploy", name))
		if err != nil {
			t.Fatal(err)
		}
		return unitValue(parseUnit(string(raw))["Service"]["MemoryMax"])
	}
	if one, two := memoryMax("scafo-edge.service"), memoryMax("scafo-edge@.service"); one == "" || one != two {
		t.Errorf("MemoryMax=%q in scafo-edge.service, %q in scafo-edge@.service: want the same, set", one, two)
	}
}

// parseUnit reads a systemd unit into section → key → values.
func parseUnit(s string) map[string]map[string][]string {
	out := map[string]map[string][]string{}
	section := ""
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";"):
		case strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]"):
			section = line[1 : len(line)-1]
			out[section] = map[string][]string{}
		default:
			k, v, _ := strings.Cut(line, "=")
			if out[section] == nil {
				out[section] = map[string][]string{}
			}
			out[section][k] = append(out[section][k], v)
		}
	}
	return out
}

func unitValue(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1] // systemd: the last assignment wins
}
