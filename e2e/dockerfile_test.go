//go:build unix

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// ---------------------------------------------------------------------------
// The Dockerfile.

// TestDockerfileAgreesWithFlags checks the image's stages, user, volume,
// ports and healthcheck against the serve command's flag defaults, so that a
// changed default cannot leave the image exposing or persisting the wrong
// thing.
func TestDockerfileAgreesWithFlags(t *testing.T) {
	t.Parallel()
	df := parseDockerfile(t, filepath.Join(pkgRoot, "Dockerfile"))
	defaults := serveDefaults(t)
	final := df.stages[len(df.stages)-1]

	t.Run("GO_VERSION is a build argument naming the builder's Go", func(t *testing.T) {
		v, ok := df.globalArgs["GO_VERSION"]
		if !ok || v == "" {
			t.Fatalf("no ARG GO_VERSION=<default> before the first FROM")
		}
		gomod, err := os.ReadFile(filepath.Join(pkgRoot, "go.mod"))
		pkgMust(t, err)
		m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindSubmatch(gomod)
		if m == nil || string(m[1]) != v {
			t.Errorf("ARG GO_VERSION=%s, go.mod says go %s", v, m[1])
		}
		if b := df.stages[0]; !strings.Contains(b.image, "${GO_VERSION}") {
			t.Errorf("builder FROM %s does not use ${GO_VERSION}", b.image)
		}
	})

	t.Run("two stages: a Go builder and a minimal final image", func(t *testing.T) {
		if len(df.stages) != 2 {
			t.Fatalf("%d stages, want 2 (builder, final)", len(df.stages))
		}
		if !strings.HasPrefix(df.stages[0].image, "golang:") {
			t.Errorf("builder FROM %s, want golang:", df.stages[0].image)
		}
		img := final.image
		if !(strings.HasPrefix(img, "gcr.io/distroless/static") || img == "scratch") {
			t.Errorf("final FROM %s, want distroless static or scratch", img)
		}
	})

	t.Run("the final stage runs the builder's binary as a non-root user", func(t *testing.T) {
		out := df.builderBuild(t).output(t)
		copied := false
		for _, in := range final.instrs {
			if in.cmd == "COPY" {
				flags, paths := copyArgs(in.args)
				if flags["from"] == df.stages[0].name && len(paths) == 2 && paths[0] == out && paths[1] == "/scafo-edge" {
					copied = true
				}
			}
		}
		if !copied {
			t.Errorf("final stage has no COPY --from=%s %s /scafo-edge", df.stages[0].name, out)
		}
		user := final.last(t, "USER").args
		name, _, _ := strings.Cut(user, ":")
		if name == "" || name == "root" || name == "0" {
			t.Errorf("USER %q, want a non-root user", user)
		}
		if img := final.image; img == "scratch" || strings.HasSuffix(img, ":nonroot") {
			// distroless :nonroot has the user; scratch needs its own passwd.
		} else if name == "nonroot" {
			t.Errorf("USER nonroot on %s, which may not define it: use a :nonroot tag", img)
		}
		if got := final.exec(t, "ENTRYPOINT"); !slices.Equal(got, []string{"/scafo-edge"}) {
			t.Errorf("ENTRYPOINT %q, want [/scafo-edge]", got)
		}
		if got := final.exec(t, "CMD"); !slices.Equal(got, []string{"serve"}) {
			t.Errorf("CMD %q, want [serve]", got)
		}
	})

	t.Run("the builder runs on the build platform and cross-compiles for the target", func(t *testing.T) {
		// An arm64 image built on amd64 (or the other way round) must not
		// run the builder under emulation: the builder stage is the build
		// machine's own platform and Go compiles for the target's.
		b := df.stages[0]
		if p := b.flags["platform"]; p != "$BUILDPLATFORM" && p != "${BUILDPLATFORM}" {
			t.Errorf("builder FROM --platform=%q, want $BUILDPLATFORM", p)
		}
		if p, ok := final.flags["platform"]; ok {
			t.Errorf("final FROM --platform=%q: the final stage must be the target platform's", p)
		}
		// BuildKit sets TARGETOS and TARGETARCH, but a stage sees them only
		// if it declares them: undeclared, they expand empty and Go builds
		// for the build machine, under the target's name.
		declared := map[string]bool{}
		set := map[string]string{}
		for _, in := range b.instrs {
			switch in.cmd {
			case "ARG":
				k, _, _ := strings.Cut(in.args, "=")
				declared[k] = true
			case "RUN":
				for _, seg := range splitAnd(runWords(t, in.args)) {
					if len(seg) > 1 && seg[0] == "go" && seg[1] == "build" {
						break
					}
					for _, w := range seg {
						if k, v, ok := strings.Cut(w, "="); ok && (k == "GOOS" || k == "GOARCH") {
							set[k] = v
						}
					}
				}
			}
		}
		for k, arg := range map[string]string{"GOOS": "TARGETOS", "GOARCH": "TARGETARCH"} {
			if v := set[k]; v != "$"+arg && v != "${"+arg+"}" {
				t.Errorf("the go build's RUN sets %s=%q before it, want $%s", k, v, arg)
			}
			if !declared[arg] {
				t.Errorf("builder stage has no ARG %s: it would expand empty", arg)
			}
		}
		for _, in := range final.instrs {
			if in.cmd == "RUN" {
				t.Errorf("Dockerfile:%d: RUN in the final stage would run the target's binaries at build time (emulation for another platform)", in.line)
			}
		}
	})

	t.Run("the builder sets cap_net_bind_service on the binary it builds", func(t *testing.T) {
		args := df.builderSetcap(t)
		if !slices.Contains(args, "cap_net_bind_service=+ep") {
			t.Errorf("setcap %q, want cap_net_bind_service=+ep", args)
		}
		if !strings.Contains(df.stages[0].allArgs("RUN"), "libcap2-bin") {
			t.Errorf("builder does not install libcap2-bin, which provides setcap")
		}
		// The legacy builder drops the capability through COPY --from; a
		// BuildKit-only RUN flag on the same RUN makes it refuse the file
		// rather than build an image that cannot bind 80.
		for _, in := range df.stages[0].instrs {
			if in.cmd == "RUN" && strings.Contains(in.args, "setcap ") && !runFlags(in.args)["mount"] {
				t.Errorf("Dockerfile:%d: the RUN that sets the capability has no --mount=: the legacy builder would build the file and drop the capability", in.line)
			}
		}
	})

	t.Run("VOLUME is the state-dir default and is not a COPY destination", func(t *testing.T) {
		// What counts is the mode and owner of the directory in the built
		// image (0700, 65532), which deploy/image-check.sh reads off a real
		// build and a new volume. Without an engine, only the form known to
		// break is refused: the state directory as a COPY destination, whose
		// own mode BuildKit before tonistiigi/fsutil#228 sets 0755 whatever
		// --chmod says.
		want := defaults["state-dir"]
		if got := final.last(t, "VOLUME").args; got != want && got != fmt.Sprintf("[%q]", want) {
			t.Errorf("VOLUME %s, want %s (--state-dir default)", got, want)
		}
		for _, in := range final.instrs {
			if in.cmd != "COPY" {
				continue
			}
			if _, paths := copyArgs(in.args); len(paths) == 2 && path.Clean(paths[1]) == want {
				t.Errorf("Dockerfile:%d: COPY to %s makes the state directory a COPY destination: older BuildKit creates it 0755; make it in the builder and copy its parent's tree", in.line, want)
			}
		}
	})

	t.Run("EXPOSE names the ports of the listener defaults", func(t *testing.T) {
		exposed := map[string]bool{}
		for _, p := range strings.Fields(final.allArgs("EXPOSE")) {
			if !strings.Contains(p, "/") {
				p += "/tcp"
			}
			exposed[p] = true
		}
		for _, flag := range []string{"http-addr", "https-addr", "admin-addr"} {
			_, port, err := net.SplitHostPort(defaults[flag])
			if err != nil {
				t.Fatalf("--%s default %q: %v", flag, defaults[flag], err)
			}
			if !exposed[port+"/tcp"] {
				t.Errorf("EXPOSE lacks %s/tcp (--%s default %s); exposes %v", port, flag, defaults[flag], exposed)
			}
		}
	})

	t.Run("HEALTHCHECK runs the binary's health command against the admin default", func(t *testing.T) {
		if got := df.healthcheck(t); !slices.Equal(got, []string{"/scafo-edge", "health"}) {
			t.Errorf("HEALTHCHECK CMD %q, want [/scafo-edge health]", got)
		}
		// health must probe where serve listens, and follow the same variable.
		var stderr bytes.Buffer
		cmd := exec.Command(edgeBinary, "health", "-h")
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("scafo-edge health -h: %v\n%s", err, stderr.String())
		}
		// The usage's column spacing is layout, not the claim: any run of
		// blanks between the flag and its variable will do.
		want := regexp.MustCompile(`--admin-addr\s+` + regexp.QuoteMeta(fmt.Sprintf("[SCAFO_EDGE_ADMIN_ADDR] (default %s)", defaults["admin-addr"])))
		if !want.MatchString(stderr.String()) {
			t.Errorf("health -h does not show %s:\n%s", want, stderr.String())
		}
	})
}

// dockerfile is a parsed Dockerfile: enough of the grammar for this file.
type dockerfile struct {
	globalArgs map[string]string // ARG before the first FROM
	stages     []*dockerStage
}

type dockerStage struct {
	image, name string
	flags       map[string]string // FROM's --flags: --platform=$BUILDPLATFORM
	instrs      []dockerInstr
}

type dockerInstr struct {
	line int
	cmd  string // upper case
	args string // continuation lines joined
}

func parseDockerfile(t *testing.T, file string) *dockerfile {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	df := &dockerfile{globalArgs: map[string]string{}}
	var cur strings.Builder
	startLine := 0
	flush := func() {
		s := strings.TrimSpace(cur.String())
		cur.Reset()
		if s == "" {
			return
		}
		cmd, args, _ := strings.Cut(s, " ")
		in := dockerInstr{line: startLine, cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		switch {
		case in.cmd == "FROM":
			f := strings.Fields(in.args)
			flags, _ := copyArgs(in.args)
			f = slices.DeleteFunc(f, func(s string) bool { return strings.HasPrefix(s, "--") })
			st := &dockerStage{image: f[0], flags: flags}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				st.name = f[2]
			}
			df.stages = append(df.stages, st)
		case len(df.stages) == 0 && in.cmd == "ARG":
			k, v, _ := strings.Cut(in.args, "=")
			df.globalArgs[k] = v
		case len(df.stages) == 0:
			t.Fatalf("Dockerfile:%d: %s before the first FROM", in.line, in.cmd)
		default:
			st := df.stages[len(df.stages)-1]
			st.instrs = append(st.instrs, in)
		}
	}
	for i, line := range strings.Split(string(b), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			continue // comments, and comment lines inside a continuation
		}
		if cur.Len() == 0 {
			if trimmed == "" {
				continue
			}
			startLine = i + 1
		}
		if strings.HasSuffix(trimmed, `\`) {
			cur.WriteString(strings.TrimSuffix(trimmed, `\`) + " ")
			continue
		}
		cur.WriteString(trimmed)
		flush()
	}
	flush()
	if len(df.stages) == 0 {
		t.Fatal("Dockerfile has no FROM")
	}
	return df
}

// last returns the stage's last instruction of that kind.
func (s *dockerStage) last(t *testing.T, cmd string) dockerInstr {
	t.Helper()
	for i := len(s.instrs) - 1; i >= 0; i-- {
		if s.instrs[i].cmd == cmd {
			return s.instrs[i]
		}
	}
	t.Fatalf("stage FROM %s has no %s", s.image, cmd)
	return dockerInstr{}
}

// allArgs joins the arguments of every instruction of that kind.
func (s *dockerStage) allArgs(cmd string) string {
	var out []string
	for _, in := range s.instrs {
		if in.cmd == cmd {
			out = append(out, in.args)
		}
	}
	return strings.Join(out, " ")
}

// exec returns the exec (JSON) form of the stage's last cmd instruction.
func (s *dockerStage) exec(t *testing.T, cmd string) []string {
	t.Helper()
	in := s.last(t, cmd)
	var argv []string
	if err := json.Unmarshal([]byte(in.args), &argv); err != nil {
		t.Fatalf("Dockerfile:%d: %s %s is not exec form (the image has no shell): %v", in.line, cmd, in.args, err)
	}
	return argv
}

func (df *dockerfile) healthcheck(t *testing.T) []string {
	t.Helper()
	st := df.stages[len(df.stages)-1]
	in := st.last(t, "HEALTHCHECK")
	_, after, ok := strings.Cut(" "+in.args, " CMD ")
	var argv []string
	if !ok || json.Unmarshal([]byte(strings.TrimSpace(after)), &argv) != nil || len(argv) == 0 {
		t.Fatalf("Dockerfile:%d: HEALTHCHECK %s: want options then CMD [\"...\"] (the image has no shell)", in.line, in.args)
	}
	return argv
}

// goBuild is the builder stage's go build command and its environment.
type goBuild struct {
	argv []string          // shell words of the go build command, unexpanded
	env  map[string]string // ENV of the builder stage
	args map[string]string // ARG defaults of the builder stage
}

// builderBuild finds the go build command in the builder stage's RUNs.
func (df *dockerfile) builderBuild(t *testing.T) goBuild {
	t.Helper()
	b := goBuild{env: map[string]string{}, args: map[string]string{}}
	for _, in := range df.stages[0].instrs {
		switch in.cmd {
		case "ENV":
			for _, kv := range shellWords(t, in.args) {
				k, v, _ := strings.Cut(kv, "=")
				b.env[k] = v
			}
		case "ARG":
			k, v, _ := strings.Cut(in.args, "=")
			b.args[k] = v
		case "RUN":
			for _, seg := range splitAnd(runWords(t, in.args)) {
				if len(seg) > 2 && seg[0] == "go" && seg[1] == "build" {
					if b.argv != nil {
						t.Fatalf("Dockerfile:%d: a second go build in the builder stage", in.line)
					}
					b.argv = seg
				}
			}
		}
	}
	if b.argv == nil {
		t.Fatal("builder stage has no RUN go build")
	}
	return b
}

// command returns go's arguments for the builder's build with vars expanded
// and the output moved to out, and the environment the stage gives it.
func (b goBuild) command(t *testing.T, vars map[string]string, out string) (args, env []string) {
	t.Helper()
	for _, a := range b.argv {
		for _, m := range varRef.FindAllStringSubmatch(a, -1) {
			if _, ok := b.args[m[1]]; !ok {
				t.Fatalf("builder go build uses $%s, but the builder stage declares no ARG %s: Docker would expand it empty", m[1], m[1])
			}
		}
	}
	for i := 1; i < len(b.argv); i++ {
		a := expandVars(t, b.argv[i], vars)
		if a == "-o" && i+1 < len(b.argv) {
			args = append(args, "-o", out)
			i++
			continue
		}
		args = append(args, a)
	}
	if b.env["CGO_ENABLED"] != "0" {
		t.Fatalf("builder stage ENV CGO_ENABLED=%q, want 0 (static binary)", b.env["CGO_ENABLED"])
	}
	for k, v := range b.env {
		env = append(env, k+"="+v)
	}
	slices.Sort(env)
	for _, want := range []string{"-trimpath", "-ldflags"} {
		if !slices.Contains(args, want) {
			t.Fatalf("builder go build %q lacks %s", b.argv, want)
		}
	}
	return args, env
}

// output is the builder's -o path.
func (b goBuild) output(t *testing.T) string {
	t.Helper()
	i := slices.Index(b.argv, "-o")
	if i < 0 || i+1 >= len(b.argv) {
		t.Fatalf("builder go build %q has no -o", b.argv)
	}
	return b.argv[i+1]
}

// builderSetcap returns setcap's arguments, less the file, after checking the
// file is the binary the builder builds.
func (df *dockerfile) builderSetcap(t *testing.T) []string {
	t.Helper()
	out := df.builderBuild(t).output(t)
	for _, in := range df.stages[0].instrs {
		if in.cmd != "RUN" {
			continue
		}
		for _, seg := range splitAnd(runWords(t, in.args)) {
			if len(seg) >= 3 && seg[0] == "setcap" {
				if seg[len(seg)-1] != out {
					t.Fatalf("Dockerfile:%d: setcap on %s, but go build writes %s", in.line, seg[len(seg)-1], out)
				}
				return seg[1 : len(seg)-1]
			}
		}
	}
	t.Fatal("builder stage runs no setcap: the nonroot user could not bind 80 and 443")
	return nil
}

// copyArgs splits a COPY's --flags from its paths.
func copyArgs(args string) (flags map[string]string, paths []string) {
	flags = map[string]string{}
	for _, f := range strings.Fields(args) {
		if k, ok := strings.CutPrefix(f, "--"); ok {
			k, v, _ := strings.Cut(k, "=")
			flags[k] = v
			continue
		}
		paths = append(paths, f)
	}
	return flags, paths
}

// shellWords splits a POSIX shell command line into words, keeping quoting
// rules and leaving $ expansions for expandVars. Operators (&&) must stand
// apart as words, which is how this repository writes them.
func shellWords(t *testing.T, s string) []string {
	t.Helper()
	var words []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		case c == '\'':
			j := strings.IndexByte(s[i+1:], '\'')
			if j < 0 {
				t.Fatalf("unterminated ' in %q", s)
			}
			// Single-quoted text is literal; mark $ so expandVars leaves it.
			w.WriteString(strings.ReplaceAll(s[i+1:i+1+j], "$", "\x00"))
			i += j + 1
			inWord = true
		case c == '"':
			j := strings.IndexByte(s[i+1:], '"')
			if j < 0 {
				t.Fatalf("unterminated \" in %q", s)
			}
			w.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case c == '\\' && i+1 < len(s):
			w.WriteByte(s[i+1])
			i++
			inWord = true
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words
}

// runWords splits a RUN's arguments into shell words, less the RUN's own
// flags (--mount=..., --network=...), which BuildKit reads and no shell sees.
func runWords(t *testing.T, args string) []string {
	t.Helper()
	words := shellWords(t, args)
	for len(words) > 0 && strings.HasPrefix(words[0], "--") {
		words = words[1:]
	}
	return words
}

// splitAnd splits shell words at each && into commands.
func splitAnd(words []string) [][]string {
	var out [][]string
	var cur []string
	for _, w := range words {
		if w == "&&" {
			out = append(out, cur)
			cur = nil
			continue
		}
		cur = append(cur, w)
	}
	return append(out, cur)
}

var varRef = regexp.MustCompile(`\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?`)

// expandVars expands $NAME and ${NAME} from vars; a name vars lacks fails
// the test, so the Dockerfile cannot use a variable the test does not know.
func expandVars(t *testing.T, s string, vars map[string]string) string {
	t.Helper()
	s = varRef.ReplaceAllStringFunc(s, func(ref string) string {
		name := varRef.FindStringSubmatch(ref)[1]
		v, ok := vars[name]
		if !ok {
			t.Fatalf("builder go build uses $%s, which the test does not set", name)
		}
		return v
	})
	return strings.ReplaceAll(s, "\x00", "$")
}

// ---------------------------------------------------------------------------
// .dockerignore.

// TestDockerignoreKeepsBuildInputs checks that no file the build needs (the
// module files and every source or embedded file of the binary's packages in
// this module) is excluded from the build context, and that the local state
// and git history are.
func TestDockerignoreKeepsBuildInputs(t *testing.T) {
	t.Parallel()
	rules := readDockerignore(t, filepath.Join(pkgRoot, ".dockerignore"))
	cmd := exec.Command("go", "list", "-deps", "-json", "./cmd/scafo-edge")
	cmd.Dir = pkgRoot
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	abs, err := filepath.Abs(pkgRoot)
	pkgMust(t, err)
	needed := []string{"go.mod", "go.sum"}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			Dir                                       string
			Module                                    *struct{ Main bool }
			GoFiles, CgoFiles, EmbedFiles, OtherFiles []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if p.Module == nil || !p.Module.Main {
			continue
		}
		rel, err := filepath.Rel(abs, p.Dir)
		pkgMust(t, err)
		for _, files := range [][]string{p.GoFiles, p.CgoFiles, p.EmbedFiles, p.OtherFiles} {
			for _, f := range files {
				needed = append(needed, filepath.ToSlash(filepath.Join(rel, f)))
			}
		}
	}
	if len(needed) < 5 {
		t.Fatalf("go list found only %v", needed)
	}
	for _, f := range needed {
		if rules.excludes(f) {
			t.Errorf(".dockerignore excludes %s, which the build needs", f)
		}
	}
	for _, f := range []string{".git/HEAD", ".state/edge.db", "cmd/scafo-edge/.state/edge.db"} {
		if !rules.excludes(f) {
			t.Errorf(".dockerignore keeps %s in the build context", f)
		}
	}
}

type ignoreRule struct {
	pattern string
	negate  bool
}

type ignoreRules []ignoreRule

func readDockerignore(t *testing.T, file string) ignoreRules {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var rules ignoreRules
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		r := ignoreRule{}
		if p, ok := strings.CutPrefix(line, "!"); ok {
			r.negate, line = true, p
		}
		r.pattern = strings.TrimPrefix(path.Clean("/"+line), "/")
		rules = append(rules, r)
	}
	return rules
}

// excludes applies the rules as Docker does: patterns match the path or any
// of its parent directories, ** spans directories, the last match wins.
func (rules ignoreRules) excludes(file string) bool {
	excluded := false
	for _, r := range rules {
		for p := file; p != "." && p != "/"; p = path.Dir(p) {
			if globMatch(strings.Split(r.pattern, "/"), strings.Split(p, "/")) {
				excluded = !r.negate
				break
			}
		}
	}
	return excluded
}

func globMatch(pat, name []string) bool {
	if len(pat) == 0 {
		return len(name) == 0
	}
	if pat[0] == "**" {
		for i := 0; i <= len(name); i++ {
			if globMatch(pat[1:], name[i:]) {
				return true
			}
		}
		return false
	}
	if len(name) == 0 {
		return false
	}
	ok, err := path.Match(pat[0], name[0])
	return err == nil && ok && globMatch(pat[1:], name[1:])
}

// serveDefaults maps each serve flag to its default, as the binary's
// serve -h prints them.
func serveDefaults(t *testing.T) map[string]string {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(edgeBinary, "serve", "-h")
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("scafo-edge serve -h: %v\n%s", err, stderr.String())
	}
	out := map[string]string{}
	for _, m := range usageLine.FindAllStringSubmatch(stderr.String(), -1) {
		out[m[1]] = m[2]
	}
	if len(out) == 0 {
		t.Fatalf("scafo-edge serve -h lists no flags:\n%s", stderr.String())
	}
	return out
}

// usageLine matches a flag's line of the usage: "  --name  [ENV] (default X)".
var usageLine = regexp.MustCompile(`(?m)^  --(\S+)(?:  \[[^\]]*\])?(?: \(default (.*)\))?$`)

// runFlags returns the names of the --flags a RUN instruction's arguments
// start with (--mount=..., --network=...).
func runFlags(args string) map[string]bool {
	flags := map[string]bool{}
	for _, f := range strings.Fields(args) {
		name, ok := strings.CutPrefix(f, "--")
		if !ok {
			break
		}
		name, _, _ = strings.Cut(name, "=")
		flags[name] = true
	}
	return flags
}
