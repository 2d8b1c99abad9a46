package e2e

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
	"github.com/scafo/scafo-edge/node/nodetest"
)

func TestHTTP3(t *testing.T) {
	a, b := app(t, "A"), app(t, "B")
	n := nodetest.New(t, nodetest.Options{})
	n.SetDocument(routesDoc(hostOf(a), hostOf(b)))
	e := startEdge(t, "--node", n.URL(), "--tls", "internal")
	testsupport.WaitForNil(t, 15*time.Second, "first document", func() error {
		if code, _ := e.get(t, "nobody.example", "/"); code != 404 {
			return fmt.Errorf("status %d", code)
		}
		return nil
	})
	roots := x509.NewCertPool()
	pem, err := os.ReadFile(filepath.Join(e.StateDir, internalRootFile))
	if err != nil || !roots.AppendCertsFromPEM(pem) {
		t.Fatalf("internal root: %v", err)
	}
	_, port, _ := net.SplitHostPort(e.HTTPSAddr)

	t.Run("HTTPS responses advertise HTTP/3 with Alt-Svc", func(t *testing.T) {
		c := &http.Client{Transport: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: roots, ServerName: "a.example"},
			ForceAttemptHTTP2: true,
		}}
		req, _ := http.NewRequest("GET", "https://"+e.HTTPSAddr+"/", nil)
		req.Host = "a.example"
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := resp.Header.Get("Alt-Svc"); !strings.Contains(got, `h3=":`+port+`"`) {
			t.Errorf("Alt-Svc = %q, want h3 on port %s", got, port)
		}
		if resp.ProtoMajor != 2 {
			t.Errorf("HTTPS over TCP negotiated %s, want HTTP/2", resp.Proto)
		}
	})

	var dials atomic.Int32
	tr := &http3.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		Dial: func(ctx context.Context, addr string, tlsCfg *tls.Config, cfg *quic.Config) (*quic.Conn, error) {
			dials.Add(1)
			return quic.DialAddr(ctx, e.HTTPSAddr, tlsCfg, cfg)
		},
	}
	t.Cleanup(func() { tr.Close() })
	h3get := func(host, path string) (int, string, string) {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "https://"+host+":"+port+path, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("HTTP/3 GET %s%s: %v", host, path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Proto, string(body)
	}

	t.Run("an HTTP/3 client reaches a routed upstream", func(t *testing.T) {
		code, proto, body := h3get("a.example", "/h3")
		if code != 200 || proto != "HTTP/3.0" || !strings.HasPrefix(body, "A /h3") {
			t.Errorf("got %d %s %q", code, proto, body)
		}
	})
	t.Run("the 421 rule applies over HTTP/3", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "https://a.example:"+port+"/", nil)
		req.Host = "b.example"
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 421 {
			t.Errorf("Host b.example on a connection for a.example: %d, want 421", resp.StatusCode)
		}
	})
	t.Run("a table swap does not break an open HTTP/3 connection", func(t *testing.T) {
		before := dials.Load()
		n.SetDocument(routesDoc(hostOf(b), hostOf(a)))
		testsupport.WaitForNil(t, 15*time.Second, "swap seen over HTTP/3", func() error {
			if _, _, body := h3get("a.example", "/after"); !strings.HasPrefix(body, "B /after") {
				return fmt.Errorf("a.example answered %q", body)
			}
			return nil
		})
		if got := dials.Load(); got != before {
			t.Errorf("the client dialled %d new QUIC connections across the swap, want 0", got-before)
		}
	})
	var metrics string
	testsupport.WaitForNil(t, 5*time.Second, "HTTP/3 in metrics", func() error {
		_, metrics = e.admin(t, "/metrics")
		if !strings.Contains(metrics, `protocol="HTTP/3.0"`) {
			return fmt.Errorf("no HTTP/3.0 protocol label")
		}
		return nil
	})
}

// proxyV2 builds a PROXY protocol v2 header for a TCP over IPv4 connection.
func proxyV2(src, dst string, srcPort, dstPort uint16) []byte {
	h := []byte("\r\n\r\n\x00\r\nQUIT\n")
	h = append(h, 0x21, 0x11, 0, 12)
	h = append(h, net.ParseIP(src).To4()...)
	h = append(h, net.ParseIP(dst).To4()...)
	h = binary.BigEndian.AppendUint16(h, srcPort)
	h = binary.BigEndian.AppendUint16(h, dstPort)
	return h
}

func TestProxyProtocol(t *testing.T) {
	a := app(t, "A")
	n := nodetest.New(t, nodetest.Options{})
	n.SetDocument(&node.Document{V: 1, Routes: []node.Route{{Host: "a.example", Application: "a", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(a)}}}}})
	// Only 127.0.0.1 may send headers; the tests dial from 127.0.0.2 as
	// "another source" (all of 127/8 is loopback on Linux).
	e := startEdge(t, "--node", n.URL(), "--tls", "off", "--proxy-protocol-from", "127.0.0.1/32")
	testsupport.WaitForNil(t, 15*time.Second, "first document", func() error {
		if code, _ := e.get(t, "a.example", "/"); code != 200 {
			return fmt.Errorf("status %d", code)
		}
		return nil
	})
	const req = "GET /pp HTTP/1.1\r\nHost: a.example\r\nConnection: close\r\n\r\n"
	cases := []struct {
		name, from string
		header     []byte
		wantXFF    string // "" means the connection must be closed unanswered
	}{
		{"a v1 header from an allowed source sets the client address", "127.0.0.1", []byte("PROXY TCP4 203.0.113.7 10.0.0.1 51000 80\r\n"), "203.0.113.7"},
		{"a v2 header from an allowed source sets the client address", "127.0.0.1", proxyV2("198.51.100.9", "10.0.0.1", 40000, 80), "198.51.100.9"},
		{"no header from an allowed source is served as is", "127.0.0.1", nil, "127.0.0.1"},
		{"a malformed header from an allowed source closes the connection", "127.0.0.1", []byte("PROXY TCP4 not-an-address\r\n"), ""},
		{"a v1 header from another source closes the connection", "127.0.0.2", []byte("PROXY TCP4 203.0.113.7 10.0.0.1 51000 80\r\n"), ""},
		{"a v2 header from another source closes the connection", "127.0.0.2", proxyV2("198.51.100.9", "10.0.0.1", 40000, 80), ""},
		{"no header from another source is served as is", "127.0.0.2", nil, "127.0.0.2"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(c.from)}, Timeout: 5 * time.Second}
			conn, err := d.Dial("tcp", e.HTTPAddr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(15 * time.Second))
			conn.Write(append(append([]byte{}, c.header...), req...))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if c.wantXFF == "" {
				if err == nil {
					resp.Body.Close()
					t.Fatalf("got %s, want the connection closed", resp.Status)
				}
				return
			}
			if err != nil {
				t.Fatalf("read response: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if !strings.Contains(string(body), "xff="+c.wantXFF+" ") {
				t.Errorf("upstream saw %q, want X-Forwarded-For %s", body, c.wantXFF)
			}
		})
	}
}
