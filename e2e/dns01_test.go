package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/scafo/scafo-edge/certs/certstest"
	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
	"github.com/scafo/scafo-edge/node/nodetest"
)

// TestDNS01ThroughRFC2136 obtains wildcard certificates through the real
// binary with --dns-provider rfc2136, writing the challenge records by
// TSIG-signed dynamic update into a real BIND that is also the DNS Pebble
// validates through: a wildcard and its base; then, after a restart that
// loads them from storage, another base whose _acme-challenge is a CNAME
// into another zone (the acme-dns pattern). Every challenge record is gone
// from the server afterwards. A wrong TSIG secret is refused, and the
// edge's log names the server and the key.
func TestDNS01ThroughRFC2136(t *testing.T) {
	bind := certstest.StartBIND(t, certstest.BINDConfig{Zones: map[string][]string{
		"example.test": {"_acme-challenge.deleg CNAME deleg.acme.test."},
		"acme.test":    nil,
	}})
	httpPort, httpsPort := testsupport.FreePort(t), testsupport.FreePort(t)
	p := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: httpPort, TLSPort: httpsPort, DNSServer: bind.Addr, Validity: 5 * time.Minute})
	rootFile := pebbleRootFile(t, p)
	a := app(t, "A")
	n := nodetest.New(t, nodetest.Options{})
	n.SetDocument(&node.Document{V: 1, Routes: []node.Route{
		{Host: "*.example.test", Application: "wild", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(a)}}},
		{Host: "*.deleg.example.test", Application: "deleg", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(a)}}},
	}})
	t.Setenv("RFC2136_NAMESERVER", bind.Addr)
	t.Setenv("RFC2136_TSIG_KEY", bind.KeyName)
	t.Setenv("RFC2136_TSIG_SECRET", bind.KeySecret)
	t.Setenv("RFC2136_TSIG_ALGORITHM", "hmac-sha256")
	state := t.TempDir()
	args := func(wildcards string) []string {
		return []string{"--node", n.URL(), "--tls", "acme", "--acme-ca", p.DirectoryURL, "--acme-ca-root", rootFile,
			"--state-dir", state, "--cert-prefetch=false",
			"--dns-provider", "rfc2136", "--dns-resolvers", bind.Addr, "--dns-propagation-timeout", "30s",
			"--wildcard-domains", wildcards,
			"--http-addr", fmt.Sprintf("127.0.0.1:%d", httpPort), "--https-addr", fmt.Sprintf("127.0.0.1:%d", httpsPort)}
	}
	roots := p.IssuerRoots(t)
	httpsAddr := fmt.Sprintf("127.0.0.1:%d", httpsPort)
	waitNames := func(e *runningEdge, sni string, want ...string) string {
		t.Helper()
		var serial string
		testsupport.WaitForNil(t, 90*time.Second, "certificate for "+sni, func() error {
			leaf, err := dns01Leaf(httpsAddr, sni, roots)
			if err != nil {
				return err
			}
			if !slices.Equal(leaf.DNSNames, want) {
				return fmt.Errorf("served names %v, want %v", leaf.DNSNames, want)
			}
			serial = leaf.SerialNumber.String()
			return nil
		})
		return serial
	}
	noTXT := func(name string) {
		t.Helper()
		testsupport.WaitForNil(t, 10*time.Second, "no TXT at "+name, func() error {
			if got := bind.TXT(t, name); len(got) > 0 {
				return fmt.Errorf("TXT %s = %q", name, got)
			}
			return nil
		})
	}

	var wildSerial string
	t.Run("a wildcard and its base are issued through dynamic updates", func(t *testing.T) {
		e := startEdge(t, args("example.test")...)
		wildSerial = waitNames(e, "x.example.test", "*.example.test")
		waitNames(e, "example.test", "example.test")
		p.WaitOrderCount(t, 2)
		if code, body := httpsGetBody(t, httpsAddr, "shop.example.test", roots); code != 200 || !strings.HasPrefix(body, "A /") {
			t.Errorf("GET https://shop.example.test = %d %q, want 200 from the wildcard route", code, body)
		}
		noTXT("_acme-challenge.example.test")
		if err := e.stop(t); err != nil {
			t.Fatalf("exit: %v", err)
		}
	})

	t.Run("after a restart the wildcard is renewed and a base delegated by CNAME into another zone is issued", func(t *testing.T) {
		e := startEdge(t, args("example.test,deleg.example.test")...)
		waitNames(e, "x.deleg.example.test", "*.deleg.example.test")
		waitNames(e, "deleg.example.test", "deleg.example.test")
		// Pebble's 5-minute certificates are due at once by its renewal
		// info: the restart renews both through the same DNS-01 path.
		testsupport.WaitForNil(t, 90*time.Second, "*.example.test renewed", func() error {
			leaf, err := dns01Leaf(httpsAddr, "y.example.test", roots)
			if err != nil {
				return err
			}
			if got := leaf.SerialNumber.String(); got == wildSerial {
				return fmt.Errorf("still serial %s", got)
			}
			return nil
		})
		p.WaitOrderCount(t, 6)
		noTXT("_acme-challenge.example.test")
		noTXT("deleg.acme.test")
		r, err := bind.Query("_acme-challenge.deleg.example.test", dns.TypeCNAME)
		if err != nil || len(r.Answer) != 1 {
			t.Errorf("the delegation CNAME: %v %v, want it left alone", r, err)
		}
		if !e.logged("certificate renewed successfully") {
			t.Errorf("no renewal in the edge's log")
		}
		if err := e.stop(t); err != nil {
			t.Fatalf("exit: %v", err)
		}
	})

	t.Run("a wrong TSIG secret is refused naming the server and the key", func(t *testing.T) {
		t.Setenv("RFC2136_TSIG_SECRET", "d3Jvbmctc2VjcmV0LXdyb25nLXNlY3JldC13cm9uZyE=")
		orders := p.OrderCount()
		e := startEdge(t, "--node", n.URL(), "--tls", "acme", "--acme-ca", p.DirectoryURL, "--acme-ca-root", rootFile,
			"--cert-store", "local", "--cert-prefetch=false",
			"--dns-provider", "rfc2136", "--dns-resolvers", bind.Addr, "--wildcard-domains", "example.test")
		want := fmt.Sprintf("rfc2136 update to %s, TSIG key %s", bind.Addr, bind.KeyName)
		testsupport.WaitForNil(t, 60*time.Second, "the refusal in the log", func() error {
			if !e.logged(want) {
				return fmt.Errorf("no %q in the log", want)
			}
			return nil
		})
		for _, l := range strings.Split(e.logText(), "\n") {
			if strings.Contains(l, want) {
				t.Logf("edge log: %s", l)
				break
			}
		}
		if got := bind.TXT(t, "_acme-challenge.example.test"); len(got) > 0 {
			t.Errorf("TXT written with a wrong key: %q", got)
		}
		if got := p.OrderCount() - orders; got > 2 {
			t.Errorf("orders with a wrong key = %d, want no more than the 2 whose challenges failed to be written", got)
		}
	})

	t.Run("a missing variable stops the edge at start naming it", func(t *testing.T) {
		var env []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "RFC2136_TSIG_SECRET=") {
				env = append(env, kv)
			}
		}
		cmd := exec.Command(edgeBinary, "serve", "--node", n.URL(), "--tls", "acme", "--state-dir", t.TempDir(),
			"--http-addr", "127.0.0.1:0", "--https-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0",
			"--dns-provider", "rfc2136", "--wildcard-domains", "example.test")
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "RFC2136_TSIG_SECRET") {
			t.Errorf("edge without RFC2136_TSIG_SECRET: %v\n%s\nwant a refusal naming the variable", err, out)
		}
		t.Logf("edge refused: %s", strings.TrimSpace(lastLine(string(out))))
	})
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// dns01Leaf returns the certificate the edge at addr serves for sni,
// verified against roots.
func dns01Leaf(addr, sni string, roots *x509.CertPool) (*x509.Certificate, error) {
	d := &net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{ServerName: sni, RootCAs: roots})
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.ConnectionState().PeerCertificates[0], nil
}

// httpsGetBody asks the edge at addr for https://host/ and returns the
// status and body.
func httpsGetBody(t *testing.T, addr, host string, roots *x509.CertPool) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: host}, DisableKeepAlives: true,
	}}
	req, _ := http.NewRequest("GET", "https://"+addr+"/", nil)
	req.Host = host
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
