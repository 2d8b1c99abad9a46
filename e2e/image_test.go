//go:build unix

package e2e

// Packaging tests: no Docker engine runs where these tests run, so instead of
// building the image they hold its parts to account. The binary is built with
// the Dockerfile's own builder flags (parsed out of it, so they cannot drift)
// and checked static and healthy; the Dockerfile is parsed and checked
// against the flags' defaults, which the race-built binary's serve -h gives.
// deploy/image-check.sh (run by .ci/run) builds and runs the image itself on
// a real engine and checks what only a build shows: modes, capability,
// health, stop and upgrade.

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

// pkgRoot is the module root relative to this package's directory, where
// go test runs.
const pkgRoot = ".."

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
		testsupport.WaitForNil(t, 10*time.Second, "the demo document is served", func() error {
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
	var out testsupport.SyncBuffer
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
