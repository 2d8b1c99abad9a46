//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

// The admin listener under a flood (issue 50): its connections are kept to
// a pool of their own, so that a flood of them cannot spend the descriptors
// the edge keeps for its own work and stop the public listeners.

const (
	// floodNofile is the descriptor limit the flooded edge runs under: a
	// reserve of 64 for the edge's own work beside a budget of 192.
	floodNofile = 256
	// floodConns is more connections than the whole limit.
	floodConns = 300
	floodFrom  = "127.0.0.77"
	// floodHead is a request head that never ends.
	floodHead = "GET /healthz HTTP/1.1\r\n"
	// admMsgAdminConns is the start of the line the edge logs when it
	// refuses admin connections.
	admMsgAdminConns = "refusing new connections to the admin listener"
)

// startEdgeWithNofile is startEdge under a descriptor limit of n, soft and
// hard, set by the shell that then execs the edge (so the process the test
// signals is the edge's).
func startEdgeWithNofile(t *testing.T, n int, args ...string) *runningEdge {
	t.Helper()
	state := t.TempDir()
	full := append([]string{"-c", `ulimit -n "$0" && exec "$@"`, strconv.Itoa(n), edgeBinary,
		"serve", "--http-addr", "127.0.0.1:0", "--https-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
		"--poll-interval", "100ms", "--state-dir", state}, args...)
	e := startEdgeBinary(t, "/bin/sh", nil, full...)
	e.StateDir = state
	return e
}

// flood opens n connections to addr with dial, each sending head and
// nothing more; they stay open until the test ends unless the edge closes
// them. A write that fails is not an error: the edge may have closed the
// connection already.
func flood(t *testing.T, dial func(ctx context.Context, network, addr string) (net.Conn, error), addr, head string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := range n {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := dial(ctx, "tcp", addr)
		cancel()
		if err != nil {
			t.Fatalf("flood connection %d of %d: %v", i+1, n, err)
		}
		conns = append(conns, c)
		c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, head)
	}
	return conns
}

// closedByEdge counts the connections the edge has closed: a read ends
// with the end of the stream or a reset within the bound. One read on
// each, all at once.
func closedByEdge(conns []net.Conn, within time.Duration) int {
	var mu sync.Mutex
	var wg sync.WaitGroup
	n := 0
	deadline := time.Now().Add(within)
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.SetReadDeadline(deadline)
			var b [1]byte
			_, err := c.Read(b[:])
			if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				mu.Lock()
				n++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return n
}

// oneGet sends one GET on a connection of its own, with host as the Host
// when it is not empty, and waits for the answer at most within.
func oneGet(url, host string, within time.Duration) (int, string, error) {
	c := &http.Client{Timeout: within, Transport: &http.Transport{DisableKeepAlives: true}}
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return 0, "", err
	}
	if host != "" {
		req.Host = host
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// adminShare reads the admin connections one address allowed /metrics may
// hold from status.json, answered code and body.
func adminShare(t *testing.T, code int, body string) int {
	t.Helper()
	if code != 200 {
		t.Fatalf("status.json: %d %.200q", code, body)
	}
	var v struct {
		Load struct {
			AdminConnsPerClient int `json:"admin_conns_per_client"`
		} `json:"load"`
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil || v.Load.AdminConnsPerClient < 1 {
		t.Fatalf("status.json gives no admin_conns_per_client (%v): %.300s", err, body)
	}
	return v.Load.AdminConnsPerClient
}

// TestAdminFloodLeavesThePublicListenersServing floods the admin listener of
// an edge running under 256 descriptors with 300 connections from one
// address, each sending the start of a GET /healthz and nothing more:
// more than the descriptor limit, had each been taken and held until its
// header timeout. Meanwhile a proxied request is answered, and so is
// /healthz from another loopback address; the flood's connections past
// its address's share are closed at once, counted as admin_conns
// refusals, and logged once.
func TestAdminFloodLeavesThePublicListenersServing(t *testing.T) {
	up := newAdmUpstream(t, "A")
	routes := admRoutes(t, "a.example", up.addr())
	e := startEdgeWithNofile(t, floodNofile, "--routes-file", routes, "--tls", "off")
	waitEdgeReady(t, e)
	if !e.logged(`"descriptor_limit":` + strconv.Itoa(floodNofile)) {
		t.Fatalf("the edge does not run under a descriptor limit of %d:\n%s", floodNofile, e.logText())
	}

	conns := flood(t, admDialer(floodFrom).DialContext, e.AdminAddr, floodHead, floodConns)

	// One attempt each, with the flood in place: no retry until the flood
	// has passed.
	code, body, err := oneGet("http://"+e.HTTPAddr+"/", "a.example", 10*time.Second)
	if err != nil || code != 200 || body != "A /" {
		t.Fatalf("a proxied request while the admin listener is flooded: %d %q %v, want 200 \"A /\"\n%s", code, body, err, e.output())
	}
	if code, body, err := oneGet("http://"+e.AdminAddr+"/healthz", "", 10*time.Second); err != nil || code != 200 {
		t.Fatalf("/healthz from loopback while the admin listener is flooded: %d %q %v, want 200", code, body, err)
	}

	// The flood is refused but for its address's share: those connections
	// are closed within their hold of a second. (The share's own may have
	// met the header timeout by now.)
	code, body = e.admin(t, "/status.json")
	share := adminShare(t, code, body)
	if closed := closedByEdge(conns, 5*time.Second); closed < floodConns-share {
		t.Errorf("the edge closed %d of the flood's %d connections, want all but its address's share of %d", closed, floodConns, share)
	}
	refused := e.metric(t, "scafo_edge_shed_total", testsupport.Labels{"reason": "admin_conns"})
	if refused != float64(floodConns-share) {
		t.Errorf("scafo_edge_shed_total{reason=admin_conns} = %v, want %d: all but the address's share of %d", refused, floodConns-share, share)
	}
	if n := e.countLogs(admMsgAdminConns); n != 1 {
		t.Errorf("the refusals were logged %d times, want once:\n%s", n, e.logText())
	}
	if e.logged("too many open files") {
		t.Errorf("the edge ran out of descriptors:\n%s", e.output())
	}
	t.Logf("figures: %v admin connections refused of %d", refused, floodConns)
}

// TestAdminFloodFromOutsideTheAllowedNetworksGetsTwoConnections floods the
// admin listener from a public-looking address and from a private one, in
// a network namespace of the edge's own (admin_access_test.go): the
// public one, which may ask /healthz and /readyz but not /metrics, keeps
// two connections and the rest are refused; the private one, allowed
// /metrics (--admin-allow private, the default), keeps its larger share;
// loopback's scrape is answered meanwhile.
func TestAdminFloodFromOutsideTheAllowedNetworksGetsTwoConnections(t *testing.T) {
	tools := needNetns(t)
	e := startNetnsEdge(t, tools)
	testsupport.WaitForNil(t, 20*time.Second, "edge ready", func() error {
		if code, body, _ := e.get(t, "127.0.0.1", "/readyz", false); code != 200 {
			return fmt.Errorf("/readyz = %d: %s", code, body)
		}
		return nil
	})
	const n = 40
	code, body, _ := e.get(t, "127.0.0.1", "/status.json", false)
	share := adminShare(t, code, body)
	for _, c := range []struct {
		from string
		kept int
	}{
		{"11.0.0.9", 2},
		{"10.0.0.9", share},
	} {
		conns := flood(t, dialInNetns(e.netns, netip.MustParseAddr(c.from)), net.JoinHostPort(c.from, e.port), floodHead, n)
		if closed := closedByEdge(conns, 5*time.Second); closed != n-c.kept {
			t.Errorf("a flood of %d connections from %s: the edge closed %d, want all but %d", n, c.from, closed, c.kept)
		}
	}
	code, body, _ = e.get(t, "127.0.0.1", "/metrics", false)
	if code != 200 {
		t.Fatalf("/metrics from loopback after the floods: %d %.200q", code, body)
	}
	refused, _ := testsupport.ScrapeValue(t, body, "scafo_edge_shed_total", testsupport.Labels{"reason": "admin_conns"})
	if want := float64(2*n - 2 - share); refused != want {
		t.Errorf("scafo_edge_shed_total{reason=admin_conns} = %v, want %v", refused, want)
	}
}
