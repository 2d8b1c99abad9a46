package e2e

// Issue 48 through the binary: the access log's new fields, the operator's
// error pages and their JSON form, and the request body limit.

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

// accessLine waits for the access log line of the request for path.
func accessLine(t *testing.T, e *runningEdge, path string) map[string]any {
	t.Helper()
	var found map[string]any
	testsupport.WaitFor(t, 10*time.Second, "access log line for "+path, func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, l := range e.lines {
			if l["message"] == "request" && l["path"] == path {
				found = l
				return true
			}
		}
		return false
	})
	return found
}

func TestAccessLogNamesTheClientBehindProxies(t *testing.T) {
	rec := newRecordingUpstream(t, "A")
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{
		{Host: "a.example", Application: "a", Upstreams: []node.Upstream{{Node: "n", Address: rec.addr}}},
	}})

	t.Run("behind a trusted proxy over TLS, every new field", func(t *testing.T) {
		e := startEdge(t, "--routes-file", routes, "--tls", "internal", "--trusted-proxies", "127.0.0.1/32")
		waitEdgeReady(t, e)
		status, _ := rawExchange(t, e.HTTPSAddr, "a.example", "GET /logged?q=1&r=two HTTP/1.1\r\nHost: a.example\r\n"+
			"X-Forwarded-For: 6.6.6.6, 203.0.113.7\r\nX-Request-Id: lb-7f3a\r\nUser-Agent: e2e-agent/1.0\r\n"+
			"Referer: https://ref.example/page\r\nConnection: close\r\n\r\n")
		if status != 200 {
			t.Fatalf("status %d, want 200", status)
		}
		l := accessLine(t, e, "/logged")
		want := map[string]any{"client": "203.0.113.7", "query": "q=1&r=two", "user_agent": "e2e-agent/1.0",
			"referer": "https://ref.example/page", "tls": "TLS 1.3", "request_id": "lb-7f3a"}
		for k, v := range want {
			if l[k] != v {
				t.Errorf("%s = %v, want %v (line %v)", k, l[k], v, l)
			}
		}
		head, _ := rec.last()
		if ids := headerValues(head, "X-Request-Id"); len(ids) != 1 || ids[0] != "lb-7f3a" {
			t.Errorf("upstream X-Request-Id = %q, want the trusted proxy's", ids)
		}
	})

	t.Run("from a PROXY header, anonymised, with the edge's own request ID", func(t *testing.T) {
		e := startEdge(t, "--routes-file", routes, "--tls", "off", "--proxy-protocol-from", "127.0.0.1/32", "--access-log-anonymise")
		waitEdgeReady(t, e)
		status, _ := rawExchange(t, e.HTTPAddr, "", "PROXY TCP4 198.51.100.77 10.0.0.1 51000 80\r\n"+
			"GET /anon HTTP/1.1\r\nHost: a.example\r\nX-Forwarded-For: 203.0.113.7\r\nX-Request-Id: forged\r\nConnection: close\r\n\r\n")
		if status != 200 {
			t.Fatalf("status %d, want 200", status)
		}
		l := accessLine(t, e, "/anon")
		if l["client"] != "198.51.100.0" {
			t.Errorf("client = %v, want the PROXY header's address cut to its /24", l["client"])
		}
		id, _ := l["request_id"].(string)
		if !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(id) {
			t.Errorf("request_id = %q, want the edge's own (the peer is not a trusted proxy)", id)
		}
		head, _ := rec.last()
		if ids := headerValues(head, "X-Request-Id"); len(ids) != 1 || ids[0] != id {
			t.Errorf("upstream X-Request-Id = %q, want the logged %q", ids, id)
		}
		if l["tls"] != nil {
			t.Errorf("tls = %v on a plain connection", l["tls"])
		}
		if strings.Contains(e.logText(), "198.51.100.77") {
			t.Error("the whole address appears in the log")
		}
	})
}

func TestErrorPagesThroughTheBinary(t *testing.T) {
	pages := t.TempDir()
	os.WriteFile(filepath.Join(pages, "404.html"), []byte("<h1>No such site</h1>"), 0o644)
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{
		{Host: "down.example", Application: "down", Upstreams: []node.Upstream{{Node: "n", Address: testsupport.ClosedAddr(t)}}},
	}})
	e := startEdge(t, "--routes-file", routes, "--tls", "off", "--error-pages", pages)
	waitEdgeReady(t, e)

	get := func(host, accept string) (int, string, string) {
		req, _ := http.NewRequest("GET", "http://"+e.HTTPAddr+"/", nil)
		req.Host = host
		if accept != "" {
			req.Header.Set("Accept", accept)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	if code, ct, body := get("nobody.example", "text/html"); code != 404 || ct != "text/html; charset=utf-8" || body != "<h1>No such site</h1>" {
		t.Errorf("404: %d %q %q, want the directory's page", code, ct, body)
	}
	if code, ct, body := get("nobody.example", "application/json"); code != 404 || ct != "application/json" ||
		body != `{"status":404,"reason":"no_route","message":"no route for this host"}`+"\n" {
		t.Errorf("404 as JSON: %d %q %q", code, ct, body)
	}
	if code, _, body := get("down.example", ""); code != 502 || !strings.Contains(body, "no upstream could be reached") {
		t.Errorf("502 without a page: %d %q, want the edge's text", code, body)
	}
	if code, _, body := get("down.example", "application/json, text/html;q=0.9"); code != 502 ||
		!strings.HasPrefix(body, `{"status":502,"reason":"no_upstream"`) {
		t.Errorf("502 as JSON: %d %q", code, body)
	}
	os.WriteFile(filepath.Join(pages, "502.html"), []byte("<h1>Back soon</h1>"), 0o644)
	testsupport.WaitFor(t, 15*time.Second, "the new 502 page", func() bool {
		_, _, body := get("down.example", "")
		return body == "<h1>Back soon</h1>"
	})
}

// generator yields n bytes of 'x' without holding them.
type generator struct{ left int64 }

func (g *generator) Read(p []byte) (int, error) {
	if g.left <= 0 {
		return 0, io.EOF
	}
	n := min(int64(len(p)), g.left)
	for i := range p[:n] {
		p[i] = 'x'
	}
	g.left -= n
	return int(n), nil
}

// upload sends a 64 MiB POST on a raw connection, with a Content-Length
// or chunked, and returns the status of the response read while the body
// is still being written (0: the connection closed without one).
func upload(t *testing.T, addr, host string, chunked bool) int {
	t.Helper()
	const size = 64 << 20
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(60 * time.Second))
	head := fmt.Sprintf("POST /upload HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n\r\n", host, size)
	if chunked {
		head = "POST /upload HTTP/1.1\r\nHost: " + host + "\r\nTransfer-Encoding: chunked\r\n\r\n"
	}
	go func() {
		w := bufio.NewWriterSize(c, 64<<10)
		w.WriteString(head)
		g := &generator{left: size}
		buf := make([]byte, 32<<10)
		for {
			n, _ := g.Read(buf)
			if n == 0 {
				break
			}
			var err error
			if chunked {
				_, err = fmt.Fprintf(w, "%x\r\n%s\r\n", n, buf[:n])
			} else {
				_, err = w.Write(buf[:n])
			}
			if err != nil {
				return // the edge stopped reading: expected
			}
		}
		if chunked {
			w.WriteString("0\r\n\r\n")
		}
		w.Flush()
	}()
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func TestBodyLimitThroughTheBinary(t *testing.T) {
	rec := newRecordingUpstream(t, "A")
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{
		{Host: "a.example", Application: "a", Upstreams: []node.Upstream{{Node: "n", Address: rec.addr}}},
	}})
	e := startEdge(t, "--routes-file", routes, "--tls", "off", "--max-body-bytes", "1MiB")
	waitEdgeReady(t, e)
	const limit = 1 << 20

	t.Run("64 MiB with a Content-Length is refused before a byte goes upstream", func(t *testing.T) {
		before := rec.count()
		if status := upload(t, e.HTTPAddr, "a.example", false); status != 413 {
			t.Errorf("status %d, want 413", status)
		}
		if n := rec.count(); n != before {
			t.Errorf("upstream received %d requests, want none", n-before)
		}
	})
	t.Run("64 MiB chunked is cut at the limit and never reaches the upstream whole", func(t *testing.T) {
		if status := upload(t, e.HTTPAddr, "a.example", true); status != 413 {
			t.Errorf("status %d, want 413", status)
		}
		rec.mu.Lock()
		for i, b := range rec.bodies {
			if len(b) > limit {
				t.Errorf("upstream request %d had a body of %d bytes, over the %d byte limit", i, len(b), limit)
			}
		}
		rec.mu.Unlock()
	})
	t.Run("a body within the limit passes", func(t *testing.T) {
		req, _ := http.NewRequest("POST", "http://"+e.HTTPAddr+"/small", &generator{left: limit})
		req.Host = "a.example"
		req.ContentLength = limit
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if _, body := rec.last(); resp.StatusCode != 200 || len(body) != limit {
			t.Errorf("status %d, upstream body %d bytes; want 200 and the whole body", resp.StatusCode, len(body))
		}
	})
	testsupport.WaitFor(t, 10*time.Second, "two body_too_large answers counted", func() bool {
		return e.metric(t, "scafo_edge_self_answered_total", testsupport.Labels{"application": "a", "reason": "body_too_large"}) == 2
	})
}
