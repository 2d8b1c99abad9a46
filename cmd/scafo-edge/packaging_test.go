//go:build unix

package main

// Packaging tests: no Docker engine runs where these tests run, so instead of
// building the image they hold its parts to account. The binary is built with
// the Dockerfile's own builder flags (parsed out of it, so they cannot drift)
// and checked static and healthy; the Dockerfile, compose file and systemd
// unit are parsed and checked against the flags' defaults; the README's flag
// table is regenerated from the flag set and compared.

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// pkgRoot is the module root relative to this package's directory, where
// go test runs.
const pkgRoot = "../.."

// ---------------------------------------------------------------------------
// The image's binary.

// TestImageBinary builds scafo-edge exactly as the Dockerfile's builder stage
// does, then checks the result is the static, stamped binary the image needs
// and that its healthcheck tells a running edge from a stopped one.
func TestImageBinary(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("the image is linux; the ELF checks need a linux binary")
	}
	df := parseDockerfile(t, filepath.Join(pkgRoot, "Dockerfile"))
	build := df.builderBuild(t)
	const stamp = "v0.0.0-packaging-test"
	bin := filepath.Join(t.TempDir(), "scafo-edge")
	args, env := build.command(t, map[string]string{"VERSION": stamp}, bin)

	start := time.Now()
	cmd := exec.Command("go", args...)
	cmd.Dir = pkgRoot
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	fi, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("built with the Dockerfile's flags in %v: go %s (%s); %d bytes",
		time.Since(start).Round(time.Millisecond), strings.Join(args, " "), strings.Join(env, " "), fi.Size())

	t.Run("build info records CGO_ENABLED=0 and -trimpath", func(t *testing.T) {
		out, err := exec.Command("go", "version", "-m", bin).CombinedOutput()
		if err != nil {
			t.Fatalf("go version -m: %v\n%s", err, out)
		}
		settings := map[string]string{}
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.SplitN(strings.TrimSpace(line), "\t", 2)
			if len(f) == 2 && f[0] == "build" {
				k, v, _ := strings.Cut(f[1], "=")
				settings[k] = v
			}
		}
		for k, want := range map[string]string{"CGO_ENABLED": "0", "-trimpath": "true"} {
			if settings[k] != want {
				t.Errorf("go version -m: build %s=%q, want %q\n%s", k, settings[k], want, out)
			}
		}
		// With -trimpath, go omits -ldflags from the build info (they may
		// hold paths): the stamp is checked by running version below.
	})

	t.Run("the ELF has no interpreter, no shared libraries, no symbols and no DWARF", func(t *testing.T) {
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("program header PT_INTERP present: the binary needs a dynamic loader the final stage lacks")
			}
		}
		if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
			t.Errorf("ImportedLibraries = %v, %v; want none", libs, err)
		}
		for _, name := range []string{".symtab", ".debug_info"} {
			if f.Section(name) != nil {
				t.Errorf("%s present: -ldflags \"-s -w\" did not strip it", name)
			}
		}
	})

	t.Run("version prints the stamp", func(t *testing.T) {
		out, err := exec.Command(bin, "version").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "scafo-edge "+stamp {
			t.Errorf("scafo-edge version = %q, %v; want %q", out, err, "scafo-edge "+stamp)
		}
	})

	t.Run("health exits 0 against a running edge and non-zero once it is stopped", func(t *testing.T) {
		e := startEdgeBinary(t, bin, nil,
			"serve", "--routes-file", filepath.Join(pkgRoot, "testdata/demo/routes.json"), "--tls", "off",
			"--http-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--state-dir", t.TempDir())

		// The edge is serving: a host nothing names is answered by the edge.
		waitFor(t, 10*time.Second, "the demo document is served", func() error {
			req, _ := http.NewRequest("GET", "http://"+e.HTTPAddr+"/", nil)
			req.Host = "nothing.invalid"
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound {
				return fmt.Errorf("status %d, want 404", resp.StatusCode)
			}
			return nil
		})

		// The HEALTHCHECK's own argv, with the admin address given the way
		// compose gives it: by environment.
		hc := df.healthcheck(t)
		hc[0] = bin
		if out, err := pkgRun(hc, "SCAFO_EDGE_ADMIN_ADDR="+e.AdminAddr); err != nil {
			t.Errorf("HEALTHCHECK %q with SCAFO_EDGE_ADMIN_ADDR=%s: %v\n%s", hc, e.AdminAddr, err, out)
		}
		if out, err := pkgRun([]string{bin, "health", "--admin-addr", e.AdminAddr}); err != nil || strings.TrimSpace(string(out)) != "ok" {
			t.Errorf("scafo-edge health --admin-addr %s = %q, %v; want ok, exit 0", e.AdminAddr, out, err)
		}

		if err := e.stop(t); err != nil {
			t.Errorf("scafo-edge after SIGTERM: %v, want exit 0\n%s", err, e.output())
		}
		out, err := pkgRun([]string{bin, "health", "--admin-addr", e.AdminAddr, "--timeout", "2s"})
		var exitErr *exec.ExitError
		if !errors.As(err, &exitErr) || exitErr.ExitCode() == 0 {
			t.Errorf("scafo-edge health against a stopped edge: %v (%q), want a non-zero exit", err, out)
		}
	})

	t.Run("a non-root user binds a privileged port through the file capability", func(t *testing.T) {
		testNonRootBind(t, df, bin)
	})
}

// testNonRootBind repeats the image's setcap on the binary and runs it as the
// image's nonroot user (65532) on a port below 1024: with the capability it
// binds, without it the kernel refuses. It needs root (to setcap and switch
// user) and setcap, so it is skipped where they are missing.
func testNonRootBind(t *testing.T, df *dockerfile, bin string) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to set a file capability and run as another user")
	}
	setcap, err := exec.LookPath("setcap")
	if err != nil {
		t.Skip("setcap not installed (Debian: libcap2-bin)")
	}
	if start := unprivilegedPortStart(); start <= 1000 {
		t.Skipf("net.ipv4.ip_unprivileged_port_start=%d: any user may bind low ports here, the check would prove nothing", start)
	}
	capArgs := df.builderSetcap(t)
	const uid = 65532 // distroless nonroot

	// A directory the nonroot user can traverse (t.TempDir's are 0700).
	dir, err := os.MkdirTemp("", "scafo-edge-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	pkgMust(t, os.Chmod(dir, 0o755))
	if nosuidMount(dir) {
		t.Skipf("%s is on a nosuid mount, where the kernel ignores file capabilities", dir)
	}
	routes := filepath.Join(dir, "routes.json")
	pkgCopyFile(t, filepath.Join(pkgRoot, "testdata/demo/routes.json"), routes, 0o644)
	withCap, withoutCap := filepath.Join(dir, "with-cap"), filepath.Join(dir, "without-cap")
	pkgCopyFile(t, bin, withCap, 0o755)
	pkgCopyFile(t, bin, withoutCap, 0o755)
	if out, err := exec.Command(setcap, append(capArgs, withCap)...).CombinedOutput(); err != nil {
		t.Skipf("setcap %s on %s: %v (%s): this file system keeps no capabilities", strings.Join(capArgs, " "), dir, err, out)
	}

	port := freePrivilegedPort(t)
	for _, tc := range []struct {
		name    string
		bin     string
		canBind bool
	}{
		{"with cap_net_bind_service the nonroot user binds the port", withCap, true},
		{"without it the same user is refused", withoutCap, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := filepath.Join(dir, filepath.Base(tc.bin)+"-state")
			pkgMust(t, os.Mkdir(state, 0o700))
			pkgMust(t, os.Chown(state, uid, uid))
			addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
			args := []string{"serve", "--routes-file", routes, "--tls", "off",
				"--http-addr", addr, "--admin-addr", "127.0.0.1:0", "--state-dir", state}
			cred := &syscall.Credential{Uid: uid, Gid: uid, NoSetGroups: true}
			if tc.canBind {
				e := startEdgeBinary(t, tc.bin, cred, args...)
				if e.HTTPAddr != addr {
					t.Errorf("http_addr = %s, want %s", e.HTTPAddr, addr)
				}
				if err := e.stop(t); err != nil {
					t.Errorf("after SIGTERM: %v\n%s", err, e.output())
				}
				return
			}
			cmd := exec.Command(tc.bin, args...)
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			out, err := runUntilExit(ctx, cmd)
			if err == nil || !strings.Contains(string(out), "permission denied") {
				t.Errorf("without the capability: %v\n%s\nwant exit non-zero with permission denied", err, out)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// The Dockerfile.

// TestDockerfileAgreesWithFlags checks the image's stages, user, volume,
// ports and healthcheck against the serve command's flag defaults, so that a
// changed default cannot leave the image exposing or persisting the wrong
// thing.
func TestDockerfileAgreesWithFlags(t *testing.T) {
	t.Parallel()
	df := parseDockerfile(t, filepath.Join(pkgRoot, "Dockerfile"))
	defaults := serveDefaults()
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

	t.Run("the builder sets cap_net_bind_service on the binary it builds", func(t *testing.T) {
		args := df.builderSetcap(t)
		if !slices.Contains(args, "cap_net_bind_service=+ep") {
			t.Errorf("setcap %q, want cap_net_bind_service=+ep", args)
		}
		if !strings.Contains(df.stages[0].allArgs("RUN"), "libcap2-bin") {
			t.Errorf("builder does not install libcap2-bin, which provides setcap")
		}
	})

	t.Run("VOLUME is the state-dir default and the final stage creates it for the nonroot user", func(t *testing.T) {
		want := defaults["state-dir"]
		if got := final.last(t, "VOLUME").args; got != want && got != fmt.Sprintf("[%q]", want) {
			t.Errorf("VOLUME %s, want %s (--state-dir default)", got, want)
		}
		found := false
		for _, in := range final.instrs {
			if flags, paths := copyArgs(in.args); in.cmd == "COPY" && len(paths) == 2 && paths[1] == want {
				found = true
				if flags["chown"] == "" || strings.HasPrefix(flags["chown"], "0") || strings.HasPrefix(flags["chown"], "root") {
					t.Errorf("COPY to %s --chown=%q: a named volume copies this owner, so nonroot could not write", want, flags["chown"])
				}
			}
		}
		if !found {
			t.Errorf("final stage does not COPY a directory to %s: a named volume would come up owned by root", want)
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
		run(context.Background(), []string{"health", "-h"}, io.Discard, &stderr)
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
			f = slices.DeleteFunc(f, func(s string) bool { return strings.HasPrefix(s, "--") })
			st := &dockerStage{image: f[0]}
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
			for _, seg := range splitAnd(shellWords(t, in.args)) {
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
		for _, seg := range splitAnd(shellWords(t, in.args)) {
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

// ---------------------------------------------------------------------------
// deploy/compose.yaml.

// TestComposeFile checks the compose example has what issue 7 asks of it and
// that every variable it sets is one the binary reads.
func TestComposeFile(t *testing.T) {
	t.Parallel()
	file := filepath.Join(pkgRoot, "deploy/compose.yaml")
	raw, err := os.ReadFile(file)
	pkgMust(t, err)
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
	defaults := serveDefaults()
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
		known := serveEnvNames()
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
		pkgMust(t, s.Environment.Decode(&out))
	case yaml.SequenceNode:
		var list []string
		pkgMust(t, s.Environment.Decode(&list))
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
	pkgMust(t, err)
	unit := parseUnit(string(raw))
	svc := unit["Service"]
	defaults := serveDefaults()
	known := serveEnvNames()
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
		pkgMust(t, err)
		re := regexp.MustCompile(`(?m)^ExecStart=\S+`)
		tmp := filepath.Join(t.TempDir(), "scafo-edge.service")
		pkgMust(t, os.WriteFile(tmp, re.ReplaceAll(raw, []byte("ExecStart="+self)), 0o644))
		out, err := exec.Command(sa, "verify", tmp).CombinedOutput()
		if err != nil || strings.Contains(string(out), "scafo-edge.service") {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	})
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
	pkgMust(t, err)
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
		pkgMust(t, os.WriteFile(file, []byte(updated), 0o644))
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
	pkgMust(t, err)
	lines := strings.Split(string(raw), "\n")
	screen := strings.Join(lines[:min(len(lines), 40)], "\n")
	for _, c := range []string{readmeDemoCommand, readmeTestCommand} {
		if !strings.Contains(screen, "\n"+c+"\n") {
			t.Errorf("README's first 40 lines lack the command line %q", c)
		}
	}
	ci, err := os.ReadFile(filepath.Join(pkgRoot, ".ci/run"))
	pkgMust(t, err)
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

// ---------------------------------------------------------------------------
// Helpers.

// serveDefaults maps each serve flag to its default.
func serveDefaults() map[string]string {
	out := map[string]string{}
	for _, d := range serveFlags(&config{}).docs {
		out[d.Name] = d.Default
	}
	return out
}

// serveEnvNames is every environment variable a serve flag reads, plus the DNS
// provider's token, which certmagic's provider reads itself.
func serveEnvNames() map[string]bool {
	out := map[string]bool{"CLOUDFLARE_API_TOKEN": true}
	for _, d := range serveFlags(&config{}).docs {
		for _, e := range strings.Fields(d.Env) {
			out[e] = true
		}
	}
	return out
}

func pkgRun(argv []string, env ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	return cmd.CombinedOutput()
}

// runUntilExit runs cmd and returns its output; if ctx ends first the process
// is killed, so a binary that unexpectedly starts serving does not outlive
// the test.
func runUntilExit(ctx context.Context, cmd *exec.Cmd) ([]byte, error) {
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return []byte(out.String()), err
	case <-ctx.Done():
		cmd.Process.Kill()
		<-done
		return []byte(out.String()), fmt.Errorf("still running after the deadline: %w", ctx.Err())
	}
}

// nosuidMount reports whether dir is on a mount with nosuid, which makes the
// kernel ignore file capabilities as well as setuid bits.
func nosuidMount(dir string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	best, opts := "", ""
	for _, line := range strings.Split(string(b), "\n") {
		// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		mp := f[4]
		if (dir == mp || strings.HasPrefix(dir, strings.TrimSuffix(mp, "/")+"/")) && len(mp) >= len(best) {
			best, opts = mp, f[5]
		}
	}
	return slices.Contains(strings.Split(opts, ","), "nosuid")
}

func unprivilegedPortStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_unprivileged_port_start")
	if err != nil {
		return 1024
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 1024
	}
	return n
}

// freePrivilegedPort finds a port below 1024 free on 127.0.0.1, as root.
func freePrivilegedPort(t *testing.T) int {
	t.Helper()
	base := 1000 + int(time.Now().UnixNano()%20)
	for i := range 24 {
		p := 1000 + (base-1000+i)%24
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err == nil {
			l.Close()
			return p
		}
	}
	t.Skip("no free port in 1000-1023 on 127.0.0.1")
	return 0
}

func pkgCopyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	pkgMust(t, err)
	pkgMust(t, os.WriteFile(dst, b, mode))
	pkgMust(t, os.Chmod(dst, mode))
}

func pkgMust(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
