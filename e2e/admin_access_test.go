//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"gopkg.in/yaml.v3"

	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

// The admin listener's access rules (issue 32, docs/design.md rule 10),
// through the binary, from real source addresses. The edge runs in a network
// namespace of its own whose loopback also holds 10.0.0.9 (a private
// address) and 11.0.0.9 (a public-looking one); the test's client dials from
// each of them inside that namespace. Nothing of the host's network changes.

// nsAddrs are the addresses the namespace's loopback holds besides
// 127.0.0.1, one private and one that looks public.
var nsAddrs = []string{"10.0.0.9/8", "11.0.0.9/8"}

const adminTestToken = "e2e-admin-ingress-token"

// nsEdge is an edge in a network namespace of its own.
type nsEdge struct {
	*runningEdge
	netns string // /proc/<pid>/ns/net
	port  string // the admin listener's, on every address
}

// needNetns skips the test unless it can make a network namespace: root,
// and util-linux's unshare and nsenter and iproute2's ip installed.
func needNetns(t *testing.T) map[string]string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to make a network namespace with public-looking addresses on its loopback (CI runs as root)")
	}
	tools := map[string]string{}
	for _, tool := range []struct{ name, pkg string }{{"unshare", "util-linux"}, {"nsenter", "util-linux"}, {"ip", "iproute2"}} {
		tools[tool.name] = testsupport.NeedTool(t, tool.name, tool.pkg)
	}
	if out, err := exec.Command(tools["unshare"], "--net", "true").CombinedOutput(); err != nil {
		t.Skipf("unshare --net: %v (%s): this root may not make network namespaces (a container without CAP_SYS_ADMIN?)", err, strings.TrimSpace(string(out)))
	}
	return tools
}

// startNetnsEdge starts scafo-edge serve in a new network namespace whose
// loopback is up and holds nsAddrs, its admin listener on every address of
// it, with the ingress token set and args added.
func startNetnsEdge(t *testing.T, tools map[string]string, args ...string) *nsEdge {
	t.Helper()
	dir := t.TempDir()
	routes := writeRoutesFile(t, dir, &node.Document{V: 1, Routes: []node.Route{
		{Host: "app.example.test", Application: "app", Upstreams: []node.Upstream{{Node: "box-a", Address: "10.1.0.5:8080"}}},
	}})
	// unshare and sh exec in turn, so the process the harness signals is
	// the edge itself.
	script := "set -e; " + tools["ip"] + " link set lo up; "
	for _, a := range nsAddrs {
		script += tools["ip"] + " addr add " + a + " dev lo; "
	}
	script += `exec "$@"`
	full := []string{"--net", "--", "/bin/sh", "-c", script, "sh", edgeBinary, "serve",
		"--routes-file", routes, "--state-dir", filepath.Join(dir, "state"), "--tls", "off",
		"--http-addr", "127.0.0.1:0", "--admin-addr", "0.0.0.0:0", "--ingress-token", adminTestToken}
	e := startEdgeBinary(t, tools["unshare"], nil, append(full, args...)...)
	_, port, err := net.SplitHostPort(e.AdminAddr)
	if err != nil {
		t.Fatalf("admin address %q: %v", e.AdminAddr, err)
	}
	return &nsEdge{runningEdge: e, netns: fmt.Sprintf("/proc/%d/ns/net", e.cmd.Process.Pid), port: port}
}

// dialInNetns dials inside the network namespace at netns from the local
// address from. The socket is made on a thread moved into that namespace
// and keeps it; the thread is locked to its goroutine and never unlocked, so
// it ends with the goroutine and runs nothing else.
func dialInNetns(netns string, from netip.Addr) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		done := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			f, err := os.Open(netns)
			if err != nil {
				done <- result{err: err}
				return
			}
			defer f.Close()
			if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
				done <- result{err: fmt.Errorf("setns %s: %w", netns, err)}
				return
			}
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: from.AsSlice()}}
			c, err := d.DialContext(ctx, network, addr)
			done <- result{c, err}
		}()
		r := <-done
		return r.c, r.err
	}
}

// get asks the edge's admin listener for path from the address from (the
// request goes to that address too), with the ingress token when withToken.
func (e *nsEdge) get(t *testing.T, from, path string, withToken bool, header ...string) (int, string, http.Header) {
	t.Helper()
	src := netip.MustParseAddr(from)
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DialContext: dialInNetns(e.netns, src), DisableKeepAlives: true}}
	req, err := http.NewRequest("GET", "http://"+net.JoinHostPort(from, e.port)+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if withToken {
		req.Header.Set("Authorization", "Bearer "+adminTestToken)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s from %s: %v", path, from, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s from %s: read: %v", path, from, err)
	}
	return resp.StatusCode, string(b), resp.Header
}

func TestAdminListenerByClientAddress(t *testing.T) {
	tools := needNetns(t)

	type ask struct {
		from      string
		path      string
		withToken bool
		header    []string
		want      int
		// body, when set, is the whole body wanted; hides, when set, must
		// not be in it.
		body, hides string
	}
	cases := []struct {
		name string
		args []string
		asks []ask
	}{
		{"by default metrics go to loopback, private networks and the token", nil, []ask{
			{"127.0.0.1", "/metrics", false, nil, 200, "", ""},
			{"10.0.0.9", "/metrics", false, nil, 200, "", ""},
			{"11.0.0.9", "/metrics", false, nil, 401, "", ""},
			{"11.0.0.9", "/metrics", true, nil, 200, "", ""},
			{"11.0.0.9", "/metrics", false, []string{"X-Forwarded-For", "10.0.0.1"}, 401, "", ""},
			{"127.0.0.1", "/healthz", false, nil, 200, "", ""},
			{"10.0.0.9", "/healthz", false, nil, 200, "", ""},
			{"11.0.0.9", "/healthz", false, nil, 200, "", ""},
			// Off loopback, ready or not and nothing more: the source's
			// file or URL, its user and the last error stay on the status
			// page (issue 50).
			{"11.0.0.9", "/readyz", false, nil, 200, "ready\n", ""},
			{"10.0.0.9", "/readyz", false, nil, 200, "ready\n", ""},
			{"127.0.0.1", "/readyz", false, nil, 200, "", ""},
			{"11.0.0.9", "/readyz", true, nil, 200, "", ""},
			// A token passed as a flag is not in pprof's command line.
			{"127.0.0.1", "/debug/pprof/cmdline", false, nil, 200, "", adminTestToken},
			// docs/design.md rule 10: the status surfaces stay loopback
			// or token, private networks included.
			{"127.0.0.1", "/status.json", false, nil, 200, "", ""},
			{"10.0.0.9", "/status.json", false, nil, 403, "", ""},
			{"11.0.0.9", "/status.json", false, nil, 403, "", ""},
			{"11.0.0.9", "/status.json", true, nil, 200, "", ""},
			{"10.0.0.9", "/debug/pprof/", false, nil, 403, "", ""},
		}},
		{"any opens metrics to everyone and the status page to no one more", []string{"--admin-allow", "any"}, []ask{
			{"11.0.0.9", "/metrics", false, nil, 200, "", ""},
			{"11.0.0.9", "/status.json", false, nil, 403, "", ""},
			{"11.0.0.9", "/", false, nil, 403, "", ""},
		}},
		{"loopback only, with a trusted proxy judged by whom it relays", []string{"--admin-allow", "loopback", "--trusted-proxies", "11.0.0.0/8"}, []ask{
			{"127.0.0.1", "/metrics", false, nil, 200, "", ""},
			{"10.0.0.9", "/metrics", false, nil, 401, "", ""},
			{"10.0.0.9", "/metrics", true, nil, 200, "", ""},
			{"11.0.0.9", "/metrics", false, nil, 200, "", ""},
			{"11.0.0.9", "/metrics", false, []string{"X-Forwarded-For", "203.0.113.9"}, 401, "", ""},
			{"11.0.0.9", "/status.json", false, nil, 403, "", ""},
			{"10.0.0.9", "/healthz", false, nil, 200, "", ""},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := startNetnsEdge(t, tools, tc.args...)
			testsupport.WaitForNil(t, 20*time.Second, "edge ready", func() error {
				if code, body, _ := e.get(t, "127.0.0.1", "/readyz", false); code != 200 {
					return fmt.Errorf("/readyz = %d: %s", code, body)
				}
				return nil
			})
			for _, a := range tc.asks {
				code, body, h := e.get(t, a.from, a.path, a.withToken, a.header...)
				if code != a.want {
					t.Errorf("GET %s from %s (token %v, headers %q) = %d, want %d: %.200s", a.path, a.from, a.withToken, a.header, code, a.want, body)
					continue
				}
				switch {
				case a.body != "" && body != a.body:
					t.Errorf("GET %s from %s (token %v): body %q, want %q", a.path, a.from, a.withToken, body, a.body)
				case a.hides != "" && strings.Contains(body, a.hides):
					t.Errorf("GET %s from %s (token %v): body holds %q: %.300q", a.path, a.from, a.withToken, a.hides, body)
				case a.path == "/readyz" && a.body == "" && !strings.Contains(body, "fingerprint: "):
					t.Errorf("GET /readyz from %s (token %v): %q, want the detail a privileged client gets", a.from, a.withToken, body)
				case a.path == "/metrics" && code == 200 && !strings.Contains(body, "scafo_edge_build_info"):
					t.Errorf("GET /metrics from %s: 200 without the metrics: %.200s", a.from, body)
				case code == 401 && !strings.HasPrefix(h.Get("WWW-Authenticate"), "Bearer "):
					t.Errorf("GET %s from %s: 401 with WWW-Authenticate %q, want a Bearer challenge", a.path, a.from, h.Get("WWW-Authenticate"))
				case code >= 400 && strings.Contains(body, "10.1.0.5"):
					t.Errorf("GET %s from %s: the refusal reveals an upstream address: %q", a.path, a.from, body)
				}
			}
			// The image's HEALTHCHECK runs `scafo-edge health` beside the
			// edge; in the namespace it is that command on the same port.
			cmd := exec.Command(tools["nsenter"], "--net="+e.netns, edgeBinary, "health", "--admin-addr", ":"+e.port)
			if out, err := cmd.CombinedOutput(); err != nil || strings.TrimSpace(string(out)) != "ok" {
				t.Errorf("scafo-edge health in the edge's namespace: %v: %s", err, out)
			}
			if err := e.stop(t); err != nil {
				t.Errorf("edge exit: %v\n%s", err, e.output())
			}
		})
	}
}

// TestPrometheusScrapesWithTheExampleConfig runs a real Prometheus on
// deploy/prometheus/prometheus.yml, its targets moved to the edge in the
// namespace: the plain job scrapes the edge's private address, the job with
// the token its public-looking one, and a copy of that job without the
// token is refused, so both scrapes the README shows are held as written.
func TestPrometheusScrapesWithTheExampleConfig(t *testing.T) {
	tools := needNetns(t)
	prom := testsupport.NeedTool(t, "prometheus", "prometheus")
	e := startNetnsEdge(t, tools)

	raw, err := os.ReadFile("../deploy/prometheus/prometheus.yml")
	if err != nil {
		t.Fatal(err)
	}
	var conf map[string]any
	if err := yaml.Unmarshal(raw, &conf); err != nil {
		t.Fatalf("prometheus.yml: %v", err)
	}
	delete(conf, "rule_files") // promtool checks them; this test scrapes
	conf["global"] = map[string]any{"scrape_interval": "1s", "scrape_timeout": "1s"}
	jobs, _ := conf["scrape_configs"].([]any)
	targets := map[string]string{"scafo-edge": "10.0.0.9", "scafo-edge-remote": "11.0.0.9"}
	var remote map[string]any
	for _, j := range jobs {
		job, _ := j.(map[string]any)
		name, _ := job["job_name"].(string)
		from, ok := targets[name]
		if !ok {
			t.Fatalf("prometheus.yml has a job %q this test does not know", name)
		}
		delete(targets, name)
		job["static_configs"] = []any{map[string]any{"targets": []any{net.JoinHostPort(from, e.port)}}}
		if name == "scafo-edge-remote" {
			if _, ok := job["authorization"]; !ok {
				t.Fatal("prometheus.yml: the scafo-edge-remote job sends no authorization")
			}
			remote = job
		}
	}
	if len(targets) > 0 || remote == nil {
		t.Fatalf("prometheus.yml lacks the jobs %v", targets)
	}
	bare := map[string]any{}
	for k, v := range remote {
		bare[k] = v
	}
	delete(bare, "authorization")
	bare["job_name"] = "without-token"
	delete(bare, "relabel_configs")
	conf["scrape_configs"] = append(jobs, bare)

	dir := t.TempDir()
	out, err := yaml.Marshal(conf)
	if err != nil {
		t.Fatal(err)
	}
	mustNil(t, os.WriteFile(filepath.Join(dir, "prometheus.yml"), out, 0o600))
	mustNil(t, os.WriteFile(filepath.Join(dir, "scafo-ingress-token"), []byte(adminTestToken+"\n"), 0o600))

	// Prometheus runs in the edge's namespace, where its port is its own.
	cmd := exec.Command(tools["nsenter"], "--net="+e.netns, prom, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address=127.0.0.1:9090")
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})

	type target struct {
		ScrapePool string            `json:"scrapePool"`
		Labels     map[string]string `json:"labels"`
		Health     string            `json:"health"`
		LastError  string            `json:"lastError"`
	}
	want := map[string]func(target) error{
		"scafo-edge": func(tg target) error {
			if tg.Health != "up" {
				return fmt.Errorf("health %s (%s), want up", tg.Health, tg.LastError)
			}
			return nil
		},
		"scafo-edge-remote": func(tg target) error {
			if tg.Health != "up" {
				return fmt.Errorf("health %s (%s), want up", tg.Health, tg.LastError)
			}
			if tg.Labels["job"] != "scafo-edge" {
				return fmt.Errorf("job label %q, want scafo-edge (the alert rules expect it)", tg.Labels["job"])
			}
			return nil
		},
		"without-token": func(tg target) error {
			if tg.Health != "down" || !strings.Contains(tg.LastError, "401") {
				return fmt.Errorf("health %s (%q), want down with a 401", tg.Health, tg.LastError)
			}
			return nil
		},
	}
	testsupport.WaitForNil(t, 60*time.Second, "Prometheus scrapes as the example config says", func() error {
		select {
		case <-exited:
			t.Fatalf("prometheus exited:\n%s", log.String())
		default:
		}
		c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: dialInNetns(e.netns, netip.MustParseAddr("127.0.0.1")), DisableKeepAlives: true}}
		resp, err := c.Get("http://127.0.0.1:9090/api/v1/targets?state=active")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		var body struct {
			Data struct {
				Active []target `json:"activeTargets"`
			} `json:"data"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
			return fmt.Errorf("targets: %w", err)
		}
		seen := map[string]bool{}
		for _, tg := range body.Data.Active {
			check, ok := want[tg.ScrapePool]
			if !ok {
				continue
			}
			if err := check(tg); err != nil {
				return fmt.Errorf("job %s: %w", tg.ScrapePool, err)
			}
			seen[tg.ScrapePool] = true
		}
		if len(seen) != len(want) {
			return fmt.Errorf("targets seen: %v, want %d jobs", seen, len(want))
		}
		return nil
	})
}
