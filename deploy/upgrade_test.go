package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
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
	"docker": `
case "$1" in
compose)
	case " $* " in
	*" ps "*) echo aaaa1111; [ -e "$FAKE/up" ] && echo bbbb2222 ;;
	*" up "*) touch "$FAKE/up"; started bbbb2222 ;;
	esac ;;
inspect)
	case "$3" in
	*State.Running*) if running "$4"; then echo true; else echo false; fi ;;
	*RestartPolicy*) echo unless-stopped ;;
	*) echo 0 ;;
	esac ;;
logs) cat "$FAKE/journal.$2" 2>/dev/null ;;
restart) echo -1 >"$FAKE/runs.$2" ;;
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
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
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
		script, oldName, newName, journal string
		args                              []string
	}{
		{"upgrade-systemd.sh", "scafo-edge@blue", "scafo-edge@green", "invocation-scafo-edge@blue", []string{"./scafo-edge"}},
		{"upgrade-compose.sh", "aaaa1111", "bbbb2222", "aaaa1111", nil},
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
				bin, fake := t.TempDir(), t.TempDir()
				for name, body := range fakeCommands {
					if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+fakeCommon+body+"\n"), 0o755); err != nil {
						t.Fatal(err)
					}
				}
				write := func(name, content string) {
					if err := os.WriteFile(filepath.Join(fake, name), []byte(content+"\n"), 0o644); err != nil {
						t.Fatal(err)
					}
				}
				write("runs."+s.oldName, strconv.Itoa(sc.old))
				write("once-started."+s.newName, strconv.Itoa(sc.new))
				if sc.handedOver {
					write("journal."+s.journal, handedOverLine)
				}
				cmd := exec.Command("sh", append([]string{filepath.Join(pkgRoot, "deploy", s.script)}, s.args...)...)
				cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "FAKE="+fake, "SCAFO_EDGE_UPGRADE_TIMEOUT=10")
				out, err := cmd.CombinedOutput()
				code := 0
				if ee, ok := err.(*exec.ExitError); ok {
					code = ee.ExitCode()
				} else if err != nil {
					t.Fatal(err)
				}
				calls, _ := os.ReadFile(filepath.Join(fake, "calls"))
				if code != sc.wantExit {
					t.Errorf("exit %d, want %d\noutput:\n%s\ncalls:\n%s", code, sc.wantExit, out, calls)
				}
				if sc.want != "" && !strings.Contains(string(calls), sc.want) {
					t.Errorf("the script never ran %q\noutput:\n%s\ncalls:\n%s", sc.want, out, calls)
				}
				if sc.wantNot != "" && strings.Contains(string(calls), sc.wantNot) {
					t.Errorf("the script ran %q\noutput:\n%s\ncalls:\n%s", sc.wantNot, out, calls)
				}
			})
		}
	}
}
