//go:build linux

package e2e

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

// The operator's allow list and basic auth through the binary, from real
// source addresses (issue 45 item 4): the edge runs in a network namespace
// whose loopback holds a private address (10.0.0.9) and a public-looking
// one (11.0.0.9), as TestAdminListenerByClientAddress sets it up. The
// routes are redirects, answered by the edge itself, so that no upstream
// need be reachable from the namespace.
func TestOperatorAllowListAndBasicAuthByClientAddress(t *testing.T) {
	tools := needNetns(t)
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	opPath := filepath.Join(t.TempDir(), "operator.json")
	writeOperatorFile(t, opPath, fmt.Sprintf(`{"v": 1, "routes": [
  {"host": "internal.example", "allow": ["10.0.0.0/8"], "redirect": {"to": "https://grafana.example"}},
  {"host": "tool.example", "basic_auth": {"realm": "ops", "users": ["ann:%s"]}, "redirect": {"to": "https://tool-inside.example"}}
]}`, hash))
	e := startNetnsEdge(t, tools, "--http-addr", "0.0.0.0:0", "--operator-routes", opPath)
	_, port, err := net.SplitHostPort(e.HTTPAddr)
	if err != nil {
		t.Fatalf("HTTP address %q: %v", e.HTTPAddr, err)
	}
	ask := func(from, host, user, pass string) (int, http.Header) {
		t.Helper()
		src := netip.MustParseAddr(from)
		c := &http.Client{Timeout: 20 * time.Second,
			Transport:     &http.Transport{DialContext: dialInNetns(e.netns, src), DisableKeepAlives: true},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		req, _ := http.NewRequest("GET", "http://"+net.JoinHostPort(from, port)+"/d", nil)
		req.Host = host
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("GET %s from %s: %v", host, from, err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header
	}
	testsupport.WaitForNil(t, 20*time.Second, "the operator's routes", func() error {
		if code, _ := ask("10.0.0.9", "internal.example", "", ""); code != http.StatusPermanentRedirect {
			return fmt.Errorf("internal.example from 10.0.0.9: %d", code)
		}
		return nil
	})
	for _, tc := range []struct {
		name, from, host, user, pass string
		want                         int
	}{
		{"a private address in the allow list is served", "10.0.0.9", "internal.example", "", "", 308},
		{"a public-looking address is refused", "11.0.0.9", "internal.example", "", "", 403},
		{"no credentials get a challenge", "11.0.0.9", "tool.example", "", "", 401},
		{"a wrong password gets a challenge", "11.0.0.9", "tool.example", "ann", "guess", 401},
		{"an unknown user gets a challenge", "11.0.0.9", "tool.example", "bob", "s3cret", 401},
		{"the right password is served", "11.0.0.9", "tool.example", "ann", "s3cret", 308},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, h := ask(tc.from, tc.host, tc.user, tc.pass)
			if code != tc.want {
				t.Fatalf("status %d, want %d", code, tc.want)
			}
			if code == 401 && !strings.HasPrefix(h.Get("WWW-Authenticate"), `Basic realm="ops"`) {
				t.Errorf("WWW-Authenticate %q, want a Basic challenge for realm ops", h.Get("WWW-Authenticate"))
			}
		})
	}
	if err := e.stop(t); err != nil {
		t.Errorf("edge exit: %v\n%s", err, e.output())
	}
}
