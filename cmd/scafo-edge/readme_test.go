package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// pkgRoot is the module root relative to this package's directory, where
// go test runs.
const pkgRoot = "../.."

// ---------------------------------------------------------------------------
// README and docs/flags.md.

const (
	flagsStart = "<!-- flags:start -->"
	flagsEnd   = "<!-- flags:end -->"
	// readmeTestCommand is the README's test command; .ci/run must run it.
	readmeTestCommand = "go test -race -count=1 ./..."
	readmeDemoCommand = "go run ./cmd/scafo-edge demo"
)

// flagsDoc is the file holding the flag table, which the README links to.
const flagsDoc = "docs/flags.md"

// TestREADMEFlags keeps the flag table in docs/flags.md equal to the one
// rendered from the serve command's flag set. Rewrite it with
//
//	UPDATE_README=1 go test ./cmd/scafo-edge -run TestREADMEFlags
func TestREADMEFlags(t *testing.T) {
	t.Parallel()
	file := filepath.Join(pkgRoot, flagsDoc)
	raw, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	text := string(raw)
	i, j := strings.Index(text, flagsStart), strings.Index(text, flagsEnd)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the %s … %s markers", flagsDoc, flagsStart, flagsEnd)
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
	t.Errorf("%s's flag table is out of date with serveFlags; run\n\tUPDATE_README=1 go test ./cmd/scafo-edge -run TestREADMEFlags\nfirst difference: %s", flagsDoc, firstDiff(got, want))
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
			return fmt.Sprintf("line %d of the table\n\t%s: %q\n\tflags: %q", i+1, flagsDoc, g, w)
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

// TestREADMELinks checks that every relative link of the README and of the
// guides in docs/ leads to a file that exists and, for an anchor into a
// Markdown file, to one of its headings as GitHub names them.
func TestREADMELinks(t *testing.T) {
	t.Parallel()
	files := []string{"README.md"}
	guides, err := filepath.Glob(filepath.Join(pkgRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range guides {
		rel, err := filepath.Rel(pkgRoot, g)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, rel)
	}
	anchors := map[string]map[string]bool{}
	headingsOf := func(file string) map[string]bool {
		if a, ok := anchors[file]; ok {
			return a
		}
		raw, err := os.ReadFile(filepath.Join(pkgRoot, file))
		if err != nil {
			t.Fatal(err)
		}
		a := markdownAnchors(string(raw))
		anchors[file] = a
		return a
	}
	for _, file := range files {
		raw, err := os.ReadFile(filepath.Join(pkgRoot, file))
		if err != nil {
			t.Fatal(err)
		}
		for _, target := range markdownLinks(string(raw)) {
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			dest := file
			if path != "" {
				dest = filepath.Join(filepath.Dir(file), path)
				if _, err := os.Stat(filepath.Join(pkgRoot, dest)); err != nil {
					t.Errorf("%s links to %q, which does not exist", file, target)
					continue
				}
			}
			if anchor != "" && strings.HasSuffix(dest, ".md") && !headingsOf(dest)[anchor] {
				t.Errorf("%s links to %q: %s has no heading with that anchor", file, target, dest)
			}
		}
	}
}

// markdownLinks returns the targets of the inline links of text, outside
// fenced code blocks and code spans.
func markdownLinks(text string) []string {
	var out []string
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		// Drop code spans, whose brackets are no links.
		parts := strings.Split(line, "`")
		for i := 0; i < len(parts); i += 2 {
			s := parts[i]
			for {
				k := strings.Index(s, "](")
				if k < 0 {
					break
				}
				s = s[k+2:]
				end := strings.IndexAny(s, ") ")
				if end < 0 {
					break
				}
				out = append(out, s[:end])
				s = s[end:]
			}
		}
	}
	return out
}

// markdownAnchors returns the anchors GitHub gives the headings of text:
// the heading's text as rendered, lower-cased, with every character but
// letters, digits, spaces, hyphens and underscores dropped, spaces as
// hyphens, and -1, -2… after a repeated one.
func markdownAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		heading := strings.TrimSpace(strings.TrimLeft(line, "#"))
		// Links render as their text.
		for {
			i := strings.Index(heading, "](")
			j := strings.Index(heading[max(i, 0):], ")")
			if i < 0 || j < 0 {
				break
			}
			heading = heading[:i] + heading[i+j+1:]
		}
		var b strings.Builder
		for _, r := range strings.ToLower(heading) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		slug := b.String()
		if n := seen[slug]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors
}
