package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/scafo/scafo-edge/node"
)

// TestUnderscoreAliasesNeverReachTheUpstream sends header names that read
// as a forwarding or hop-by-hop header once '_' is taken for '-' (as CGI,
// PHP, WSGI and Rack do) over HTTP/1.1, HTTP/2 and HTTP/3: none reaches the
// upstream, so a client cannot choose the address the edge vouches for,
// while an ordinary underscore name still does.
func TestUnderscoreAliasesNeverReachTheUpstream(t *testing.T) {
	rec := newRecordingUpstream(t, "A")
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{
		{Host: "a.example", Application: "a", Upstreams: []node.Upstream{{Node: "n", Address: rec.addr}}},
	}})
	state := t.TempDir()
	e := startEdge(t, "--routes-file", routes, "--tls", "internal", "--http3", "--state-dir", state)
	waitEdgeReady(t, e)
	pem, err := os.ReadFile(filepath.Join(state, internalRootFile))
	roots := x509.NewCertPool()
	if err != nil || !roots.AppendCertsFromPEM(pem) {
		t.Fatalf("internal root: %v", err)
	}
	_, port, _ := net.SplitHostPort(e.HTTPSAddr)
	tlsConf := &tls.Config{RootCAs: roots, ServerName: "a.example"}
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "tcp", e.HTTPSAddr)
	}

	// Sent as spelled; HTTP/2 and HTTP/3 clients lower-case them.
	aliases := [][2]string{
		{"X_Forwarded_For", "6.6.6.6"},
		{"x-forwarded_for", "6.6.6.6"},
		{"X-Real_Ip", "6.6.6.6"},
		{"X_Real_IP", "6.6.6.6"},
		{"X_Forwarded_Host", "evil"},
		{"X-Forwarded_Proto", "https"},
		{"Proxy_Connection", "evil"},
		{"Transfer_Encoding", "chunked"},
		{"Keep_Alive", "timeout=600"},
	}
	for _, tc := range []struct {
		name      string
		rt        http.RoundTripper
		wantProto string
	}{
		{"over HTTP/1.1 the aliases are dropped and an ordinary underscore name arrives",
			&http.Transport{TLSClientConfig: tlsConf, DialContext: dial, TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}},
			"HTTP/1.1"},
		{"over HTTP/2 the aliases are dropped and an ordinary underscore name arrives",
			&http.Transport{TLSClientConfig: tlsConf, DialContext: dial, ForceAttemptHTTP2: true},
			"HTTP/2.0"},
		{"over HTTP/3 the aliases are dropped and an ordinary underscore name arrives",
			&http3.Transport{TLSClientConfig: tlsConf, Dial: func(ctx context.Context, _ string, tlsCfg *tls.Config, cfg *quic.Config) (*quic.Conn, error) {
				return quic.DialAddr(ctx, e.HTTPSAddr, tlsCfg, cfg)
			}},
			"HTTP/3.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Cleanup(func() {
				switch rt := tc.rt.(type) {
				case *http.Transport:
					rt.CloseIdleConnections()
				case *http3.Transport:
					rt.Close()
				}
			})
			path := "/underscore/" + strings.ToLower(strings.TrimPrefix(tc.wantProto, "HTTP/"))
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", "https://a.example:"+port+path, nil)
			for _, a := range aliases {
				req.Header[a[0]] = []string{a[1]}
			}
			req.Header["X_Custom_Thing"] = []string{"ok"}
			resp, err := tc.rt.RoundTrip(req)
			if err != nil {
				t.Fatalf("GET %s: %v", path, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || resp.Proto != tc.wantProto {
				t.Fatalf("GET %s = %d %s %q, want 200 over %s", path, resp.StatusCode, resp.Proto, body, tc.wantProto)
			}

			head := headFor(t, rec, path)
			for _, line := range strings.Split(head, "\r\n")[1:] {
				k, v, ok := strings.Cut(line, ":")
				if !ok {
					continue
				}
				if strings.Contains(k, "_") && !strings.EqualFold(k, "X_Custom_Thing") {
					t.Errorf("the upstream received %q", line)
				}
				if v := strings.TrimSpace(v); strings.Contains(v, "6.6.6.6") || strings.Contains(v, "evil") {
					t.Errorf("a client-chosen value reached the upstream: %q", line)
				}
			}
			if got := headerValues(head, "X-Forwarded-For"); len(got) != 1 || got[0] != "127.0.0.1" {
				t.Errorf("X-Forwarded-For at the upstream = %q, want [127.0.0.1]", got)
			}
			if got := headerValues(head, "X_Custom_Thing"); len(got) != 1 || got[0] != "ok" {
				t.Errorf("X_Custom_Thing at the upstream = %q, want [ok]", got)
			}
			if t.Failed() {
				t.Logf("request head at the upstream:\n%s", head)
			}
		})
	}
}

// headFor returns the request head rec received for GET path.
func headFor(t *testing.T, rec *recordingUpstream, path string) string {
	t.Helper()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for _, h := range rec.heads {
		if strings.HasPrefix(h, "GET "+path+" ") {
			return h
		}
	}
	t.Fatalf("the upstream never received GET %s", path)
	return ""
}
