package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// pkgRoot is the module root relative to this package's directory, where
// go test runs.
const pkgRoot = "../.."

// ---------------------------------------------------------------------------
// README.

const (
	flagsStart = "<!-- flags:start -->"
	flagsEnd   = "<!-- flags:end -->"
	// readmeTestCommand is the README's test command; .ci/run must run it.
	readmeTestCommand = "go test -race -count=1 ./..."
	readmeDemoCommand = "go run ./cmd/scafo-edge demo"
)

// TestREADMEFlags keeps the README's flag table equal to the one rendered
// from the serve command's flag set. Rewrite it with
//
//	UPDATE_README=1 go test ./cmd/scafo-edge -run TestREADMEFlags
func TestREADMEFlags(t *testing.T) {
	t.Parallel()
	file := filepath.Join(pkgRoot, "README.md")
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	i, j := strings.Index(text, flagsStart), strings.Index(text, flagsEnd)
	if i < 0 || j < i {
		t.Fatalf("README.md lacks the %s … %s markers", flagsStart, flagsEnd)
	}
	want := renderFlagTable(serveFlags(&config{}).docs)
	got := text[i+len(flagsStart) : j]
	if got == want {
		return
	}
	if os.Getenv("UPDATE_README") != "" {
		updated := text[:i+len(flagsStart)] + want + text[j:]
		if err := os.WriteFile(file, []byte(updated), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("rewrote the flag table in %s", file)
		return
	}
	t.Errorf("README.md's flag table is out of date with serveFlags; run\n\tUPDATE_README=1 go test ./cmd/scafo-edge -run TestREADMEFlags\nfirst difference: %s", firstDiff(got, want))
}

// renderFlagTable renders one Markdown table per flag group.
func renderFlagTable(docs []flagDoc) string {
	var b strings.Builder
	b.WriteString("\n")
	group := "\x00"
	for _, d := range docs {
		if d.Group != group {
			if group != "\x00" {
				b.WriteString("\n")
			}
			group = d.Group
			fmt.Fprintf(&b, "**%s**\n\n| flag | environment | default | what it does |\n|---|---|---|---|\n", group)
		}
		env := "—"
		if d.Env != "" {
			var names []string
			for _, e := range strings.Fields(d.Env) {
				names = append(names, "`"+e+"`")
			}
			env = strings.Join(names, ", ")
		}
		def := "—"
		if d.Default != "" {
			def = "`" + d.Default + "`"
		}
		fmt.Fprintf(&b, "| `--%s` | %s | %s | %s |\n", d.Name, env, def, strings.ReplaceAll(d.Usage, "|", `\|`))
	}
	b.WriteString("\n")
	return b.String()
}

func firstDiff(got, want string) string {
	gl, wl := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < len(gl) || i < len(wl); i++ {
		var g, w string
		if i < len(gl) {
			g = gl[i]
		}
		if i < len(wl) {
			w = wl[i]
		}
		if g != w {
			return fmt.Sprintf("line %d of the table\n\tREADME: %q\n\tflags:  %q", i+1, g, w)
		}
	}
	return "none"
}

// TestREADMEFirstScreen checks the two commands a newcomer is given first,
// and that CI runs the same test command.
func TestREADMEFirstScreen(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(pkgRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(raw), "\n")
	screen := strings.Join(lines[:min(len(lines), 40)], "\n")
	for _, c := range []string{readmeDemoCommand, readmeTestCommand} {
		if !strings.Contains(screen, "\n"+c+"\n") {
			t.Errorf("README's first 40 lines lack the command line %q", c)
		}
	}
	ci, err := os.ReadFile(filepath.Join(pkgRoot, ".ci/run"))
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Fields(readmeTestCommand)
	found := false
	for _, line := range strings.Split(string(ci), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "go" || f[1] != "test" {
			continue
		}
		// CI may add a -timeout; every word of the README's command must be there.
		found = true
		for _, w := range want {
			if !slices.Contains(f, w) {
				t.Errorf(".ci/run runs %q, which lacks %q of the README's %q", line, w, readmeTestCommand)
			}
		}
	}
	if !found {
		t.Errorf(".ci/run runs no go test; the README says %q", readmeTestCommand)
	}
}
