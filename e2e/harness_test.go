package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/certs/certstest"
	"github.com/scafo/scafo-edge/internal/testsupport"
)

// edgeBinary is the scafo-edge binary the end-to-end tests run, built with
// the race detector once per test process by TestMain.
var edgeBinary string

// internalRootFile is where the binary writes the root of --tls internal,
// under its state dir, for clients to trust.
const internalRootFile = "internal-ca.pem"

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "scafo-edge-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	edgeBinary = filepath.Join(dir, "scafo-edge")
	build := exec.Command("go", "build", "-race", "-o", edgeBinary, "../cmd/scafo-edge")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build scafo-edge:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	// Pebble and its challenge server are built once too, for the tests
	// that obtain certificates through the real binary.
	code := certstest.RunWithPebble(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// runningEdge is a scafo-edge process started by a test.
type runningEdge struct {
	cmd       *exec.Cmd
	HTTPAddr  string
	HTTPSAddr string
	AdminAddr string
	StateDir  string

	mu     sync.Mutex
	lines  []map[string]any
	stderr testsupport.SyncBuffer
	done   chan struct{}
	err    error
}

// startEdge runs scafo-edge serve with args plus loopback listeners on free
// ports, waits for its start-up line, and stops it (SIGTERM) when the test
// ends. Unless args name one, it gets a fresh state dir.
func startEdge(t *testing.T, args ...string) *runningEdge {
	t.Helper()
	full := []string{"serve", "--http-addr", "127.0.0.1:0", "--https-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0", "--poll-interval", "100ms"}
	stateDir := ""
	if !hasFlag(args, "--state-dir") {
		stateDir = t.TempDir()
		full = append(full, "--state-dir", stateDir)
	}
	e := startEdgeBinary(t, edgeBinary, nil, append(full, args...)...)
	e.StateDir = stateDir
	return e
}

// startEdgeBinary runs bin with exactly args (as cred's user when cred is
// not nil), waits for its start-up line and reads the bound addresses from
// it. The process is stopped (SIGTERM) when the test ends, if the test did
// not stop it.
func startEdgeBinary(t *testing.T, bin string, cred *syscall.Credential, args ...string) *runningEdge {
	t.Helper()
	e := &runningEdge{done: make(chan struct{})}
	e.cmd = exec.Command(bin, args...)
	e.cmd.Env = append(os.Environ(), "GORACE=halt_on_error=1")
	if cred != nil {
		e.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	stdout, err := e.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// Stderr is kept for output as well as logged: the test may want it
	// after the process exits.
	e.cmd.Stderr = io.MultiWriter(&testWriter{t: t, prefix: "edge stderr: "}, &e.stderr)
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	started := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) != nil {
				continue
			}
			e.mu.Lock()
			e.lines = append(e.lines, line)
			e.mu.Unlock()
			if line["message"] == "scafo-edge started" {
				started <- line
			}
		}
		io.Copy(io.Discard, stdout)
		e.err = e.cmd.Wait()
		close(e.done)
	}()
	t.Cleanup(func() { e.stop(t) })
	select {
	case line := <-started:
		e.HTTPAddr, _ = line["http_addr"].(string)
		e.HTTPSAddr, _ = line["https_addr"].(string)
		e.AdminAddr, _ = line["admin_addr"].(string)
		if e.HTTPAddr == "" || e.AdminAddr == "" {
			t.Fatalf("start-up line lacks http_addr or admin_addr: %v", line)
		}
	case <-e.done:
		t.Fatalf("scafo-edge exited before starting: %v\n%s", e.err, e.output())
	case <-time.After(30 * time.Second):
		t.Fatalf("scafo-edge did not start within 30s\n%s", e.output())
	}
	return e
}

func hasFlag(args []string, name string) bool {
	for _, a := range args {
		if a == name || strings.HasPrefix(a, name+"=") {
			return true
		}
	}
	return false
}

// stop sends SIGTERM and waits for the process to exit; it reports the exit.
func (e *runningEdge) stop(t *testing.T) error {
	select {
	case <-e.done:
		return e.err
	default:
	}
	e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.done:
	case <-time.After(40 * time.Second):
		e.cmd.Process.Kill()
		<-e.done
		t.Errorf("scafo-edge did not exit within 40s of SIGTERM")
	}
	return e.err
}

// metric returns the value of one series of the edge's /metrics, the first
// of family name with the given labels (a histogram's sample count), or NaN
// when there is none.
func (e *runningEdge) metric(t *testing.T, name string, labels testsupport.Labels) float64 {
	t.Helper()
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + e.AdminAddr + "/metrics")
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("scrape: %v", err)
	}
	if v, ok := testsupport.ScrapeValue(t, string(b), name, labels); ok {
		return v
	}
	return math.NaN()
}

// logText returns everything the edge logged so far, one JSON object a line.
func (e *runningEdge) logText() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var b strings.Builder
	for _, l := range e.lines {
		j, _ := json.Marshal(l)
		b.Write(j)
		b.WriteByte('\n')
	}
	return b.String()
}

// output is what the process wrote so far: its log lines, then its
// stderr; complete once it has exited.
func (e *runningEdge) output() string {
	return e.logText() + e.stderr.String()
}

// logged reports whether any log line, in any field, contains s.
func (e *runningEdge) logged(s string) bool {
	return strings.Contains(e.logText(), s)
}

// countLogs counts log lines whose message contains msg.
func (e *runningEdge) countLogs(msg string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, l := range e.lines {
		if m, _ := l["message"].(string); strings.Contains(m, msg) {
			n++
		}
	}
	return n
}

// get sends a GET for host and path to the edge's HTTP listener.
func (e *runningEdge) get(t *testing.T, host, path string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+e.HTTPAddr+path, nil)
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s%s: %v", host, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// admin GETs a path of the admin listener.
func (e *runningEdge) admin(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + e.AdminAddr + path)
	if err != nil {
		t.Fatalf("GET admin %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

type testWriter struct {
	t      *testing.T
	prefix string
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Log(w.prefix + strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// runRoutes runs the binary's routes command with args and returns its
// standard output.
func runRoutes(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, edgeBinary, append([]string{"routes"}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if stderr.Len() > 0 {
		t.Logf("routes stderr: %s", stderr.String())
	}
	return stdout.String(), err
}

// pebbleRootFile writes p's root certificate to a file of its own, for
// --acme-ca-root, and returns its path.
func pebbleRootFile(t *testing.T, p *certstest.Pebble) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "pebble-root.pem")
	if err := os.WriteFile(path, p.RootPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
