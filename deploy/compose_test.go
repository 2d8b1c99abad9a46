package deploy

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// ---------------------------------------------------------------------------
// deploy/compose.yaml.

// TestComposeFile checks the compose example is one an operator can run as
// it is — host networking, a persistent state dir, the token in a read-only
// file rather than the environment, Let's Encrypt staging, a stop grace
// period longer than the drain, a Pebble variant to uncomment — and that
// every variable it sets is one the binary reads.
func TestComposeFile(t *testing.T) {
	t.Parallel()
	file := filepath.Join(pkgRoot, "deploy/compose.yaml")
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Services map[string]composeService `yaml:"services"`
		Volumes  map[string]any            `yaml:"volumes"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	edge, ok := doc.Services["edge"]
	if !ok {
		t.Fatalf("no service edge in %s", file)
	}
	defaults := serveDefaults(t)
	env := edge.env(t)

	t.Run("the edge uses the host network", func(t *testing.T) {
		if edge.NetworkMode != "host" {
			t.Errorf("network_mode %q, want host (upstreams on private addresses, 80/443 on the box)", edge.NetworkMode)
		}
	})
	t.Run("it builds this repository's Dockerfile", func(t *testing.T) {
		ctxDir := filepath.Join(filepath.Dir(file), edge.Build.Context)
		if _, err := os.Stat(filepath.Join(ctxDir, "Dockerfile")); err != nil {
			t.Errorf("build context %q has no Dockerfile: %v", edge.Build.Context, err)
		}
	})
	t.Run("the state directory is a named volume", func(t *testing.T) {
		stateDir := defaults["state-dir"]
		if v, ok := env["SCAFO_EDGE_STATE_DIR"]; ok {
			stateDir = v
		}
		v, ok := edge.mount(t, stateDir)
		if !ok || v.Type != "volume" || v.ReadOnly {
			t.Fatalf("no writable volume at %s (the state dir): %+v", stateDir, edge.Volumes)
		}
		if _, ok := doc.Volumes[v.Source]; !ok {
			t.Errorf("volume %q is not declared under top-level volumes", v.Source)
		}
	})
	t.Run("the kernel holds the edge to a memory limit it can read, which the operator may change", func(t *testing.T) {
		if !regexp.MustCompile(`^\$\{SCAFO_EDGE_MEM_LIMIT:-[0-9]+[kmg]\}$`).MatchString(edge.MemLimit) {
			t.Errorf("mem_limit %q, want ${SCAFO_EDGE_MEM_LIMIT:-<size>}", edge.MemLimit)
		}
	})
	t.Run("the token file is mounted read-only where SCAFO_INGRESS_TOKEN_FILE points", func(t *testing.T) {
		tokenFile := env["SCAFO_INGRESS_TOKEN_FILE"]
		if tokenFile == "" {
			t.Fatal("SCAFO_INGRESS_TOKEN_FILE not set")
		}
		if v, ok := edge.mount(t, tokenFile); !ok || !v.ReadOnly {
			t.Errorf("no read-only mount at %s: %+v", tokenFile, edge.Volumes)
		}
		if _, ok := env["SCAFO_INGRESS_TOKEN"]; ok {
			t.Errorf("SCAFO_INGRESS_TOKEN set in the environment: the token belongs in the file, not in docker inspect")
		}
	})
	t.Run("ACME points at Let's Encrypt staging", func(t *testing.T) {
		if ca := env["SCAFO_EDGE_ACME_CA"]; !strings.Contains(ca, "acme-staging-v02.api.letsencrypt.org") {
			t.Errorf("SCAFO_EDGE_ACME_CA=%q, want Let's Encrypt staging", ca)
		}
	})
	t.Run("every SCAFO_ variable, set or in a comment, is one the binary reads", func(t *testing.T) {
		known := serveEnvNames(t)
		names := map[string]bool{}
		for k := range env {
			names[k] = true
		}
		for _, m := range regexp.MustCompile(`(?m)^[ #]*(SCAFO_[A-Z0-9_]+):`).FindAllStringSubmatch(string(raw), -1) {
			names[m[1]] = true
		}
		for k := range names {
			if strings.HasPrefix(k, "SCAFO_") && !known[k] {
				t.Errorf("%s is not a variable of any serve flag", k)
			}
		}
	})
	t.Run("docker stop waits longer than the shutdown timeout", func(t *testing.T) {
		grace, err := time.ParseDuration(edge.StopGracePeriod)
		shutdown, _ := time.ParseDuration(defaults["shutdown-timeout"])
		if err != nil || grace <= shutdown {
			t.Errorf("stop_grace_period %q, want more than --shutdown-timeout %s", edge.StopGracePeriod, shutdown)
		}
	})
	t.Run("the commented Pebble variant is valid once uncommented", func(t *testing.T) {
		block := uncommentBlock(t, string(raw), "  # pebble-challtestsrv:")
		var variant struct {
			Services map[string]composeService `yaml:"services"`
		}
		if err := yaml.Unmarshal([]byte("services:\n"+block), &variant); err != nil {
			t.Fatalf("uncommented Pebble variant: %v\n%s", err, block)
		}
		for _, name := range []string{"pebble", "pebble-challtestsrv"} {
			s, ok := variant.Services[name]
			if !ok || s.NetworkMode != "host" {
				t.Errorf("Pebble variant service %s: present %v, network_mode %q; want present, host", name, ok, s.NetworkMode)
			}
		}
		if cmd := variant.Services["pebble"].Command; !strings.Contains(cmd, "-dnsserver 127.0.0.1:8053") {
			t.Errorf("pebble command %q does not use pebble-challtestsrv's DNS", cmd)
		}
	})
	t.Run("docker compose config accepts it, where a Compose client is installed", func(t *testing.T) {
		argv := composeCommand()
		if argv == nil {
			t.Skip("no docker compose or docker-compose client installed")
		}
		cmd := exec.Command(argv[0], append(argv[1:], "-f", file, "config", "-q")...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s config: %v\n%s", strings.Join(argv, " "), err, out)
		}
	})
}

type composeService struct {
	Build struct {
		Context string `yaml:"context"`
	} `yaml:"build"`
	NetworkMode     string          `yaml:"network_mode"`
	Environment     yaml.Node       `yaml:"environment"`
	Volumes         []composeVolume `yaml:"volumes"`
	StopGracePeriod string          `yaml:"stop_grace_period"`
	MemLimit        string          `yaml:"mem_limit"`
	Command         string          `yaml:"command"`
}

type composeVolume struct {
	Type     string `yaml:"type"`
	Source   string `yaml:"source"`
	Target   string `yaml:"target"`
	ReadOnly bool   `yaml:"read_only"`
}

// UnmarshalYAML takes the short form ("src:dst[:ro]") as well as the long.
func (v *composeVolume) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		f := strings.Split(n.Value, ":")
		if len(f) < 2 {
			return fmt.Errorf("volume %q: want source:target", n.Value)
		}
		v.Source, v.Target = f[0], f[1]
		v.ReadOnly = len(f) > 2 && strings.Contains(f[2], "ro")
		v.Type = "volume"
		if strings.ContainsAny(v.Source, "/.~$") {
			v.Type = "bind"
		}
		return nil
	}
	type long composeVolume
	return n.Decode((*long)(v))
}

// env returns the environment, in map or list form, as a map.
func (s composeService) env(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	switch s.Environment.Kind {
	case 0:
	case yaml.MappingNode:
		if err := s.Environment.Decode(&out); err != nil {
			t.Fatal(err)
		}
	case yaml.SequenceNode:
		var list []string
		if err := s.Environment.Decode(&list); err != nil {
			t.Fatal(err)
		}
		for _, kv := range list {
			k, v, _ := strings.Cut(kv, "=")
			out[k] = v
		}
	default:
		t.Fatalf("environment: want a map or a list")
	}
	return out
}

func (s composeService) mount(t *testing.T, target string) (composeVolume, bool) {
	for _, v := range s.Volumes {
		if path.Clean(v.Target) == path.Clean(target) {
			return v, true
		}
	}
	return composeVolume{}, false
}

// uncommentBlock returns the run of comment lines starting at first, with
// "# " removed after the indentation.
func uncommentBlock(t *testing.T, text, first string) string {
	t.Helper()
	lines := strings.Split(text, "\n")
	i := slices.Index(lines, first)
	if i < 0 {
		t.Fatalf("no line %q", first)
	}
	indent := first[:strings.Index(first, "#")]
	var b strings.Builder
	for _, l := range lines[i:] {
		rest, ok := strings.CutPrefix(l, indent+"#")
		if !ok {
			break
		}
		b.WriteString(indent + strings.TrimPrefix(rest, " ") + "\n")
	}
	return b.String()
}

// composeCommand returns the installed Compose client's argv, or nil.
func composeCommand() []string {
	if exec.Command("docker", "compose", "version").Run() == nil {
		return []string{"docker", "compose"}
	}
	if p, err := exec.LookPath("docker-compose"); err == nil {
		return []string{p}
	}
	return nil
}
