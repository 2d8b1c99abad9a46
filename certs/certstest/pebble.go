package certstest

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

// toolDir holds the Pebble binaries RunWithPebble built; it is written once,
// before any test runs.
var toolDir string

// PebbleDirEnv names an environment variable holding a directory with
// pebble and pebble-challtestsrv already built. RunWithPebble sets it for
// its own process, so a test that re-runs its test binary as a child (one
// process per edge) hands the child the parent's binaries instead of
// having it build them again.
const PebbleDirEnv = "CERTSTEST_PEBBLE_DIR"

var pebbleTools = []struct{ out, pkg string }{
	{"pebble", "github.com/letsencrypt/pebble/v2/cmd/pebble"},
	{"pebble-challtestsrv", "github.com/letsencrypt/pebble/v2/cmd/pebble-challtestsrv"},
}

// RunWithPebble builds pebble and pebble-challtestsrv (tool dependencies
// in go.mod) once for the test binary, runs the tests, and removes the
// binaries. Call it from TestMain: os.Exit(certstest.RunWithPebble(m)).
// When PebbleDirEnv names a directory it uses the binaries there, builds
// nothing and removes nothing.
func RunWithPebble(m *testing.M) int {
	if dir := os.Getenv(PebbleDirEnv); dir != "" {
		for _, tool := range pebbleTools {
			if _, err := os.Stat(filepath.Join(dir, tool.out)); err != nil {
				fmt.Fprintf(os.Stderr, "certstest: %s=%s: %v\n", PebbleDirEnv, dir, err)
				return 1
			}
		}
		toolDir = dir
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "certstest-pebble-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "certstest: make tool dir:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	for _, tool := range pebbleTools {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, tool.out), tool.pkg)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "certstest: go build %s: %v\n%s", tool.pkg, err, out)
			return 1
		}
	}
	toolDir = dir
	if err := os.Setenv(PebbleDirEnv, dir); err != nil {
		fmt.Fprintln(os.Stderr, "certstest: set", PebbleDirEnv+":", err)
		return 1
	}
	return m.Run()
}

// PebbleConfig sets where Pebble's validator connects.
type PebbleConfig struct {
	// HTTPPort and TLSPort are the ports Pebble dials for HTTP-01 and
	// TLS-ALPN-01, at the address the name resolves to: 127.0.0.1 unless
	// SetA or SetDefaultA says otherwise. Several edges can share one
	// Pebble by listening on these ports at different loopback addresses
	// (127.0.0.2, 127.0.0.3, ...).
	HTTPPort, TLSPort int
	// DNSServer, when set (host:port), is the DNS server Pebble's
	// validator asks, in place of the challenge test server (whose SetA,
	// SetTXT and friends then have no effect): a real server the edge
	// writes DNS-01 records to (StartBIND).
	DNSServer string
	// Validity is how long issued certificates are valid; zero means 90
	// days. Under certmagic's renewal check interval (10 minutes), Pebble's
	// renewal info makes a certificate due for renewal as soon as it is
	// loaded again (after a restart).
	Validity time.Duration
}

// Pebble is a running Pebble ACME server and its challenge test server,
// which is Pebble's DNS: every name resolves to 127.0.0.1 unless set.
type Pebble struct {
	// DirectoryURL is the ACME directory.
	DirectoryURL string
	// RootPEM is the root that signs Pebble's own HTTPS certificate (not
	// the issued ones); trust it to talk ACME.
	RootPEM []byte
	// ChallSrvURL is the challenge test server's management API.
	ChallSrvURL string

	mgmtURL string
	client  *http.Client
	orders  atomic.Int64
	invalid atomic.Int64
	logMu   sync.Mutex
	logTail []string
}

// StartPebble starts Pebble and pebble-challtestsrv on free loopback ports
// and stops both when t ends. RunWithPebble must have built them.
func StartPebble(t testing.TB, cfg PebbleConfig) *Pebble {
	t.Helper()
	if toolDir == "" {
		t.Fatal("certstest: Pebble not built; call certstest.RunWithPebble from TestMain")
	}
	modDir, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/letsencrypt/pebble/v2").Output()
	if err != nil {
		t.Fatalf("certstest: locate pebble module: %v", err)
	}
	pebbleDir := strings.TrimSpace(string(modDir))
	rootPEM, err := os.ReadFile(filepath.Join(pebbleDir, "test/certs/pebble.minica.pem"))
	if err != nil {
		t.Fatalf("certstest: read pebble minica root: %v", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(rootPEM)
	p := &Pebble{
		RootPEM: rootPEM,
		client: &http.Client{
			Timeout:   10 * time.Second,
			Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true},
		},
	}

	dnsAddr := testsupport.FreeUDPAndTCPAddr(t)
	chMgmt := testsupport.FreeAddr(t)
	p.ChallSrvURL = "http://" + chMgmt
	p.start(t, "challtestsrv", exec.Command(filepath.Join(toolDir, "pebble-challtestsrv"),
		"-http01", "", "-https01", "", "-tlsalpn01", "", "-doh", "",
		"-dnsserver", dnsAddr, "-management", chMgmt,
		"-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""), nil)

	listen, mgmt := testsupport.FreeAddr(t), testsupport.FreeAddr(t)
	validity := int64(7776000)
	if cfg.Validity > 0 {
		validity = int64(cfg.Validity / time.Second)
	}
	conf := map[string]any{"pebble": map[string]any{
		"listenAddress":                  listen,
		"managementListenAddress":        mgmt,
		"certificate":                    filepath.Join(pebbleDir, "test/certs/localhost/cert.pem"),
		"privateKey":                     filepath.Join(pebbleDir, "test/certs/localhost/key.pem"),
		"httpPort":                       cfg.HTTPPort,
		"tlsPort":                        cfg.TLSPort,
		"ocspResponderURL":               "",
		"externalAccountBindingRequired": false,
		"keyAlgorithm":                   "ecdsa",
		"profiles": map[string]any{
			"default": map[string]any{"description": "default", "validityPeriod": validity},
		},
	}}
	confPath := filepath.Join(t.TempDir(), "pebble.json")
	b, _ := json.Marshal(conf)
	if err := os.WriteFile(confPath, b, 0o600); err != nil {
		t.Fatalf("certstest: write pebble config: %v", err)
	}
	pebbleDNS := dnsAddr
	if cfg.DNSServer != "" {
		pebbleDNS = cfg.DNSServer
	}
	p.start(t, "pebble", exec.Command(filepath.Join(toolDir, "pebble"), "-config", confPath, "-dnsserver", pebbleDNS),
		[]string{"PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0", "PEBBLE_AUTHZREUSE=0"})
	p.DirectoryURL = "https://" + listen + "/dir"
	p.mgmtURL = "https://" + mgmt

	testsupport.WaitForNil(t, 20*time.Second, "pebble directory", func() error {
		resp, err := p.client.Get(p.DirectoryURL)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
	testsupport.WaitForNil(t, 20*time.Second, "challtestsrv management", func() error {
		return p.challPost("/set-default-ipv4", map[string]any{"ip": "127.0.0.1"})
	})
	return p
}

// start runs cmd until t ends, counting Pebble's new orders and invalid
// authorizations from its log.
func (p *Pebble) start(t testing.TB, name string, cmd *exec.Cmd, env []string) {
	t.Helper()
	cmd.Env = append(os.Environ(), env...)
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		t.Fatalf("certstest: start %s: %v", name, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		pw.Close()
		close(exited)
	}()
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			// Pebble's order lines carry no domain; one per new order.
			if strings.Contains(line, "Added order") {
				p.orders.Add(1)
			}
			// One per authorization a failed validation made invalid:
			// what Let's Encrypt's failed-validation limit counts.
			if strings.Contains(line, "set INVALID by completed challenge") {
				p.invalid.Add(1)
			}
			p.logMu.Lock()
			p.logTail = append(p.logTail, name+": "+line)
			if len(p.logTail) > 400 {
				p.logTail = p.logTail[len(p.logTail)-300:]
			}
			p.logMu.Unlock()
		}
		io.Copy(io.Discard, pr)
	}()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		<-scanned
		if t.Failed() {
			p.logMu.Lock()
			defer p.logMu.Unlock()
			t.Logf("last lines of %s and friends:\n%s", name, strings.Join(p.logTail, "\n"))
			p.logTail = nil
		}
	})
}

// OrderCount returns how many orders Pebble has accepted since it started.
func (p *Pebble) OrderCount() int { return int(p.orders.Load()) }

// InvalidAuthzCount returns how many authorizations Pebble has set invalid
// after a failed validation since it started, for every name.
func (p *Pebble) InvalidAuthzCount() int { return int(p.invalid.Load()) }

// WaitOrderCount waits until OrderCount reaches want; a log line can trail
// the HTTP response that created the order by a moment.
func (p *Pebble) WaitOrderCount(t testing.TB, want int) {
	t.Helper()
	testsupport.WaitForNil(t, 5*time.Second, fmt.Sprintf("pebble order count %d", want), func() error {
		if got := p.OrderCount(); got != want {
			return fmt.Errorf("order count %d", got)
		}
		return nil
	})
}

// IssuerRoots returns a pool with the root that signs the certificates this
// Pebble issues (new on every start).
func (p *Pebble) IssuerRoots(t testing.TB) *x509.CertPool {
	t.Helper()
	resp, err := p.client.Get(p.mgmtURL + "/roots/0")
	if err != nil {
		t.Fatalf("certstest: fetch pebble root: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		t.Fatalf("certstest: pebble root is not PEM: %q", b)
	}
	return pool
}

// CertStatus returns Pebble's status ("Valid", "Revoked") of the
// certificate with serial, or an error when Pebble does not know it.
func (p *Pebble) CertStatus(serial *big.Int) (string, error) {
	resp, err := p.client.Get(p.mgmtURL + "/cert-status-by-serial/" + serial.Text(16))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("cert status %s: HTTP %d", serial.Text(16), resp.StatusCode)
	}
	var st struct{ Status string }
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return "", err
	}
	return st.Status, nil
}

// SetA makes host resolve to addrs (IPv4) for Pebble's validator.
func (p *Pebble) SetA(t testing.TB, host string, addrs ...string) {
	t.Helper()
	if err := p.challPost("/add-a", map[string]any{"host": fqdn(host), "addresses": addrs}); err != nil {
		t.Fatalf("certstest: set A %s: %v", host, err)
	}
}

// SetDefaultA makes every name without its own A record resolve to ip.
func (p *Pebble) SetDefaultA(t testing.TB, ip string) {
	t.Helper()
	if err := p.challPost("/set-default-ipv4", map[string]any{"ip": ip}); err != nil {
		t.Fatalf("certstest: set default A %s: %v", ip, err)
	}
}

// SetTXT adds a TXT value at name, for Pebble's DNS-01 validation.
func (p *Pebble) SetTXT(name, value string) error {
	return p.challPost("/set-txt", map[string]any{"host": fqdn(name), "value": value})
}

// ClearTXT removes every TXT value at name.
func (p *Pebble) ClearTXT(name string) error {
	return p.challPost("/clear-txt", map[string]any{"host": fqdn(name)})
}

func (p *Pebble) challPost(path string, body any) error {
	b, _ := json.Marshal(body)
	resp, err := p.client.Post(p.ChallSrvURL+path, "application/json", bytes.NewReader(b))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: HTTP %d: %s", path, resp.StatusCode, msg)
	}
	return nil
}

func fqdn(name string) string {
	if strings.HasSuffix(name, ".") {
		return name
	}
	return name + "."
}

// PortOf returns the port of a listener address such as "127.0.0.1:8080".
func PortOf(t testing.TB, addr string) int {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("certstest: split %q: %v", addr, err)
	}
	n, _ := strconv.Atoi(port)
	return n
}
