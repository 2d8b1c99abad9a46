package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The upgrade scripts run against stand-ins for docker, systemctl and
// journalctl that play a scenario: how many times each container or unit is
// still seen running, and whether the old edge logged that it handed over.
// Each stand-in appends the command it was given to $FAKE/calls.

// fakeCommon is sourced by every stand-in. A unit or container is running
// while it has been asked about fewer times than $FAKE/runs.NAME says (-1:
// for good; no file: not running).
const fakeCommon = `
echo "$(basename "$0") $*" >>"$FAKE/calls"
running() {
	limit=$(cat "$FAKE/runs.$1" 2>/dev/null || echo 0)
	n=$(cat "$FAKE/asked.$1" 2>/dev/null || echo 0)
	echo $((n + 1)) >"$FAKE/asked.$1"
	[ "$limit" = -1 ] || [ "$n" -lt "$limit" ]
}
started() { cat "$FAKE/once-started.$1" >"$FAKE/runs.$1"; }
`

var fakeCommands = map[string]string{
	"systemctl": `
case "$1" in
is-active) running "$3" ;;
start) started "$2" ;;
restart) echo -1 >"$FAKE/runs.$2" ;;
stop) echo 0 >"$FAKE/runs.$2" ;;
show)
	case "$3" in
	InvocationID) echo "invocation-$5" ;;
	*) echo 0 ;;
	esac ;;
esac`,
	"journalctl": `
for a in "$@"; do
	case "$a" in
	_SYSTEMD_INVOCATION_ID=*) cat "$FAKE/journal.${a#*=}" 2>/dev/null ;;
	esac
done
exit 0`,
	// docker plays Compose v2 unless $FAKE/compose-version says otherwise
	// ("none": no compose plugin). A container's restart count, exit code
	// and health are in $FAKE/restarts.NAME, exit.NAME and health.NAME.
	// $FAKE/up-fails and rm-fails make those commands fail; with
	// $FAKE/more-logs.NAME, NAME's log goes on long after its journal, as
	// a real edge's does, so a reader that stops early breaks the pipe.
	"docker": `
case "$1" in
compose)
	case " $* " in
	*" version "*)
		v=$(cat "$FAKE/compose-version" 2>/dev/null || echo 2.40.3)
		if [ "$v" = none ]; then echo "docker: 'compose' is not a docker command." >&2; exit 1; fi
		echo "$v" ;;
	*" ps "*) echo aaaa1111; [ -e "$FAKE/up" ] && echo bbbb2222 ;;
	*" up "*)
		if [ -e "$FAKE/up-fails" ]; then echo "pull access denied" >&2; exit 1; fi
		touch "$FAKE/up"; started bbbb2222 ;;
	esac ;;
inspect)
	case "$3" in
	*State.Running*) if running "$4"; then echo true; else echo false; fi ;;
	*State.Status*)
		if running "$4"; then status=running; else status=exited; fi
		echo "$status $(cat "$FAKE/restarts.$4" 2>/dev/null || echo 0) $(cat "$FAKE/exit.$4" 2>/dev/null || echo 0) $(cat "$FAKE/health.$4" 2>/dev/null)" ;;
	*RestartPolicy*) echo unless-stopped ;;
	*) echo 0 ;;
	esac ;;
logs)
	cat "$FAKE/journal.$2" 2>/dev/null
	if [ -e "$FAKE/more-logs.$2" ]; then
		i=0
		while [ $i -lt 20000 ]; do echo "a later log line $i"; i=$((i + 1)); done
	fi ;;
restart) echo -1 >"$FAKE/runs.$2" ;;
rm) if [ -e "$FAKE/rm-fails" ]; then echo "No such container: $3" >&2; exit 1; fi ;;
esac
exit 0`,
	// The systemd script installs binaries; the stand-ins only record it.
	"install": "exit 0",
	"cp":      "exit 0",
	"sleep":   "exit 0",
}

// handedOver is what the scripts look for in the old edge's log to know it
// gave its sockets away (cmd/scafo-edge's handOff logs it).
const handedOver = "handover: a new edge took the listening sockets"

const handedOverLine = `{"level":"info","component":"handover","message":"` + handedOver + `; stopping, in-flight requests get the shutdown timeout"}`

// TestUpgradeScriptsReadTheEdgesLog keeps the phrase the scripts grep for
// in the edge's log and in the scripts alike.
func TestUpgradeScriptsReadTheEdgesLog(t *testing.T) {
	for _, file := range []string{"cmd/scafo-edge/handover.go", "deploy/upgrade-compose.sh", "deploy/upgrade-systemd.sh"} {
		raw, err := os.ReadFile(filepath.Join(pkgRoot, file))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(raw), handedOver) {
			t.Errorf("%s does not contain %q", file, handedOver)
		}
	}
}

func TestUpgradeScripts(t *testing.T) {
	for _, shell := range []string{"sh", "bash"} {
		if _, err := exec.LookPath(shell); err != nil {
			t.Skip("no " + shell)
		}
	}
	type scenario struct {
		name string
		// old and new are how many times each is seen running once it
		// started (-1: for good); handedOver: the old edge logged it.
		old, new   int
		handedOver bool
		wantExit   int
		want       string // a command the script must run
		wantNot    string // one it must not
	}
	scripts := []struct {
		shell, script, oldName, newName, journal string
		args                                     []string
	}{
		{"sh", "upgrade-systemd.sh", "scafo-edge@blue", "scafo-edge@green", "invocation-scafo-edge@blue", []string{"./scafo-edge"}},
		{"bash", "upgrade-compose.sh", "aaaa1111", "bbbb2222", "aaaa1111", nil},
	}
	for _, s := range scripts {
		for _, sc := range []scenario{
			{name: "a new edge that takes over and stays up completes the upgrade",
				old: 3, new: -1, handedOver: true, wantExit: 0, wantNot: "restart " + s.oldName},
			{name: "a new edge that never takes over leaves the old one serving untouched",
				old: -1, new: 0, wantExit: 1, wantNot: "restart " + s.oldName},
			{name: "a new edge that dies after taking over gets the draining old one restarted",
				old: -1, new: 1, handedOver: true, wantExit: 1, want: "restart " + s.oldName},
			{name: "a new edge that dies as the old one exits gets the old one restarted",
				old: 2, new: 1, handedOver: true, wantExit: 1, want: "restart " + s.oldName},
		} {
			t.Run(s.script+": "+sc.name, func(t *testing.T) {
				t.Parallel()
				files := map[string]string{
					"runs." + s.oldName:         strconv.Itoa(sc.old),
					"once-started." + s.newName: strconv.Itoa(sc.new),
				}
				if sc.handedOver {
					files["journal."+s.journal] = handedOverLine
				}
				r := runUpgradeScript(t, s.shell, s.script, s.args, files)
				if r.code != sc.wantExit {
					t.Errorf("exit %d, want %d\n%s", r.code, sc.wantExit, r)
				}
				if sc.want != "" && !strings.Contains(r.calls, sc.want) {
					t.Errorf("the script never ran %q\n%s", sc.want, r)
				}
				if sc.wantNot != "" && strings.Contains(r.calls, sc.wantNot) {
					t.Errorf("the script ran %q\n%s", sc.wantNot, r)
				}
			})
		}
	}
}

// TestUpgradeComposeFailsFast covers what only the compose script has to
// find out for itself: whether Compose v2 is there at all, and whether a new
// container that Docker's restart policy keeps bringing back is crashing.
// The timeout is 10 looks; each case but the timeout must be decided in two.
func TestUpgradeComposeFailsFast(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	const newLog = `{"level":"fatal","message":"--log-level: unknown level \"bogus\""}`
	for _, tc := range []struct {
		name  string
		files map[string]string
		// wantOut is in the script's output; wantCalls in order in its
		// calls; wantNot in none of them.
		wantOut   []string
		wantCalls []string
		wantNot   string
		// keepsLog: the output names a file holding the new edge's log.
		keepsLog bool
	}{
		{
			name:      "without a compose plugin it says Compose v2 is missing, in one line, and changes nothing",
			files:     map[string]string{"compose-version": "none", "runs.aaaa1111": "-1"},
			wantOut:   []string{"needs the Docker Compose v2 plugin"},
			wantCalls: []string{"docker compose version"},
			wantNot:   "docker update",
		},
		{
			name:    "Compose v1 behind docker compose is refused the same way",
			files:   map[string]string{"compose-version": "1.29.2", "runs.aaaa1111": "-1"},
			wantOut: []string{"needs the Docker Compose v2 plugin", "says 1.29.2)"},
			wantNot: "docker update",
		},
		{
			name: "a crash-looping new edge (running again between restarts) is given up on at once, its log kept",
			files: map[string]string{"runs.aaaa1111": "-1", "once-started.bbbb2222": "-1",
				"restarts.bbbb2222": "2", "exit.bbbb2222": "1", "journal.bbbb2222": newLog},
			wantOut:   []string{"restarted 2 time(s)", "last exit code 1", "keeping aaaa1111"},
			wantCalls: []string{"docker logs bbbb2222", "docker rm -f bbbb2222", "docker update --restart=unless-stopped aaaa1111"},
			wantNot:   "restart aaaa1111",
			keepsLog:  true,
		},
		{
			name: "a new edge whose healthcheck says unhealthy is given up on at once, its log kept",
			files: map[string]string{"runs.aaaa1111": "-1", "once-started.bbbb2222": "-1",
				"health.bbbb2222": "unhealthy", "journal.bbbb2222": newLog},
			wantOut:   []string{"unhealthy"},
			wantCalls: []string{"docker logs bbbb2222", "docker rm -f bbbb2222"},
			keepsLog:  true,
		},
		{
			name: "a new edge that exited non-zero is named with its exit code, its log kept",
			files: map[string]string{"runs.aaaa1111": "-1", "once-started.bbbb2222": "0",
				"exit.bbbb2222": "2", "journal.bbbb2222": newLog},
			wantOut:   []string{"exited with exit code 2"},
			wantCalls: []string{"docker logs bbbb2222", "docker rm -f bbbb2222"},
			keepsLog:  true,
		},
		{
			name: "a new edge that crashes after the handover gets the old one restarted, however long the old one's log",
			files: map[string]string{"runs.aaaa1111": "-1", "once-started.bbbb2222": "-1",
				"restarts.bbbb2222": "1", "exit.bbbb2222": "1", "journal.bbbb2222": newLog,
				"journal.aaaa1111": handedOverLine, "more-logs.aaaa1111": ""},
			wantOut:   []string{"had handed over already: restarting it"},
			wantCalls: []string{"docker rm -f bbbb2222", "docker update --restart=unless-stopped aaaa1111", "docker restart aaaa1111"},
			keepsLog:  true,
		},
		{
			name:      "a failed compose up restores the old edge's restart policy",
			files:     map[string]string{"runs.aaaa1111": "-1", "up-fails": ""},
			wantOut:   []string{"docker compose up failed", "keeping aaaa1111"},
			wantCalls: []string{"docker update --restart=no aaaa1111", "docker update --restart=unless-stopped aaaa1111"},
		},
		{
			name: "a failed removal of the new edge still restores the old one's restart policy",
			files: map[string]string{"runs.aaaa1111": "-1", "once-started.bbbb2222": "-1", "rm-fails": "",
				"restarts.bbbb2222": "2", "exit.bbbb2222": "1", "journal.bbbb2222": newLog},
			wantCalls: []string{"docker rm -f bbbb2222", "docker update --restart=unless-stopped aaaa1111"},
			keepsLog:  true,
		},
		{
			name: "a healthy new edge that the old one never hands over to is given up on at the timeout",
			files: map[string]string{"runs.aaaa1111": "-1", "once-started.bbbb2222": "-1",
				"health.bbbb2222": "healthy", "journal.bbbb2222": newLog},
			wantOut:   []string{"still running after 10s"},
			wantCalls: []string{"docker logs bbbb2222", "docker rm -f bbbb2222"},
			keepsLog:  true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := runUpgradeScript(t, "bash", "upgrade-compose.sh", nil, tc.files)
			if r.code != 1 {
				t.Errorf("exit %d, want 1\n%s", r.code, r)
			}
			for _, want := range tc.wantOut {
				if !strings.Contains(r.out, want) {
					t.Errorf("output lacks %q\n%s", want, r)
				}
			}
			rest := r.calls
			for _, want := range tc.wantCalls {
				i := strings.Index(rest, want)
				if i < 0 {
					t.Fatalf("the script never ran %q (after the calls before it in %q)\n%s", want, tc.wantCalls, r)
				}
				rest = rest[i+len(want):]
			}
			if tc.wantNot != "" && strings.Contains(r.calls, tc.wantNot) {
				t.Errorf("the script ran %q\n%s", tc.wantNot, r)
			}
			if tc.files["compose-version"] != "" {
				if lines := strings.Count(strings.TrimSpace(r.out), "\n") + 1; lines != 1 {
					t.Errorf("%d lines of output, want one saying what is missing\n%s", lines, r)
				}
			}
			waited := strings.Count(r.calls, "sleep ")
			if timedOut := strings.Contains(r.out, "still running after"); !timedOut && waited > 2 {
				t.Errorf("the script waited %d seconds before giving up, want at most 2\n%s", waited, r)
			}
			if tc.keepsLog {
				m := regexp.MustCompile(`saved in (\S+\.log)`).FindStringSubmatch(r.out)
				if m == nil {
					t.Fatalf("the output names no saved log file\n%s", r)
				}
				if !strings.HasPrefix(m[1], r.logDir+"/") {
					t.Errorf("log saved in %s, want it under SCAFO_EDGE_UPGRADE_LOG_DIR=%s", m[1], r.logDir)
				}
				saved, err := os.ReadFile(m[1])
				if err != nil || !strings.Contains(string(saved), "bogus") {
					t.Errorf("saved log %s = %q, %v; want the new edge's log", m[1], saved, err)
				}
			}
		})
	}
}

// upgradeRun is what one run of an upgrade script against the stand-ins did.
type upgradeRun struct {
	code       int
	out, calls string
	logDir     string
}

func (r upgradeRun) String() string {
	return "output:\n" + r.out + "\ncalls:\n" + r.calls
}

// runUpgradeScript runs deploy/<script> under shell with the stand-ins first
// on PATH and files written into their scenario directory.
func runUpgradeScript(t *testing.T, shell, script string, args []string, files map[string]string) upgradeRun {
	t.Helper()
	bin, fake, logDir := t.TempDir(), t.TempDir(), t.TempDir()
	for name, body := range fakeCommands {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+fakeCommon+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(fake, name), []byte(content+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(shell, append([]string{filepath.Join(pkgRoot, "deploy", script)}, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "FAKE="+fake,
		"SCAFO_EDGE_UPGRADE_TIMEOUT=10", "SCAFO_EDGE_UPGRADE_LOG_DIR="+logDir)
	out, err := cmd.CombinedOutput()
	r := upgradeRun{out: string(out), logDir: logDir}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	calls, _ := os.ReadFile(filepath.Join(fake, "calls"))
	r.calls = string(calls)
	return r
}
