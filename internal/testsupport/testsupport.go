// Package testsupport holds what the tests of every package share: waiting
// on a condition with a deadline, a buffer that a process or a logger may
// write while a test reads it, the JSON log lines in such a buffer, the
// value of one Prometheus series, read from a registry or from a scrape, and
// a loopback address nothing listens on.
//
// It is imported by tests and by test-only packages such as certstest. It
// lives under internal/ so that it is no part of the module's API, and it
// depends on nothing of the module, so that every package's tests may use
// it.
package testsupport

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// pollEvery is how often a condition is checked: often enough that a wait
// ends soon after the condition holds, rarely enough not to compete with
// what the test waits for on a two-core machine.
const pollEvery = 5 * time.Millisecond

// Poll checks cond until it holds or within has passed, and reports whether
// it held. It is for tests that assert on the outcome themselves.
func Poll(within time.Duration, cond func() bool) bool {
	return pollErr(within, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	}) == nil
}

// WaitFor checks cond until it holds, failing the test if it does not
// within the given time.
func WaitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(within, cond) {
		t.Fatalf("timed out after %v waiting for %s", within, what)
	}
}

// WaitForNil is WaitFor for a condition that can say why it does not hold
// yet: it checks cond until it returns nil, and fails the test with cond's
// last error if that does not happen within the given time.
func WaitForNil(t testing.TB, within time.Duration, what string, cond func() error) {
	t.Helper()
	if err := pollErr(within, cond); err != nil {
		t.Fatalf("%s: not within %v: %v", what, within, err)
	}
}

type notYet struct{}

func (notYet) Error() string { return "not yet" }

var errNotYet error = notYet{}

func pollErr(within time.Duration, cond func() error) error {
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return nil
		}
		select {
		case <-deadline.C:
			return cond()
		case <-tick.C:
		}
	}
}

// SyncBuffer is a bytes.Buffer safe for concurrent writers and readers: a
// child process's output, or a logger written from several goroutines.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Reset forgets everything written so far.
func (b *SyncBuffer) Reset() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf.Reset()
}

// LogEntries returns the JSON log lines written so far whose "message"
// contains msg (every JSON line when msg is empty). Lines that are not JSON
// objects, such as a panic's stack, are skipped.
func (b *SyncBuffer) LogEntries(msg string) []map[string]any {
	return LogEntries(b.String(), msg)
}

// LogEntries returns the JSON log lines of text whose "message" contains
// msg (every JSON line when msg is empty).
func LogEntries(text, msg string) []map[string]any {
	var out []map[string]any
	for line := range strings.SplitSeq(text, "\n") {
		if !strings.HasPrefix(line, "{") {
			continue
		}
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) != nil {
			continue
		}
		if m, _ := e["message"].(string); strings.Contains(m, msg) {
			out = append(out, e)
		}
	}
	return out
}

// Must returns v, and panics if err is not nil: for a constructor whose
// error a test does not expect, Must(edge.NewMetrics(reg)), as Tailscale's
// util/must.Get. The panic fails the test with err and where it came from.
func Must[T any](v T, err error) T {
	if err != nil {
		panic(fmt.Sprintf("testsupport.Must: %v", err))
	}
	return v
}

// NeedTool returns the path of the program name, which the Debian package
// pkg installs. Where it is missing the test is skipped with one line that
// names the package, so that `go test ./...` passes on a machine with Go
// alone; with the environment variable CI set (.ci/run sets it), a missing
// tool fails the test instead, so that CI never passes by skipping.
func NeedTool(t testing.TB, name, pkg string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("%s not installed (Debian: apt-get install %s; CI is set, so this fails rather than skips)", name, pkg)
	}
	t.Skipf("%s not installed (Debian: apt-get install %s)", name, pkg)
	return ""
}
