package e2e

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/node"
)

// A declared body over the limit is answered 413 at once, its connection
// closed, without waiting for a body the client may send only after an
// answer; and an HTTP/1.0 response is never compressed: without chunks,
// a compressed body an upstream cut short would look whole.
func TestLateBodiesAndHTTP10AnswersThroughTheBinary(t *testing.T) {
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		io.WriteString(w, strings.Repeat("<p>compressible</p>", 200))
	}))
	t.Cleanup(upstream.Close)
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{
		{Host: "app.example", Application: "app", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(upstream)}}},
	}})
	e := startEdge(t, "--routes-file", routes, "--tls", "off", "--max-body-bytes", "10")
	waitEdgeReady(t, e)
	exchange := func(req string) (*http.Response, error) {
		c, err := net.Dial("tcp", e.HTTPAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, req)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		return resp, err
	}
	resp, err := exchange("POST / HTTP/1.1\r\nHost: app.example\r\nContent-Length: 200000\r\n\r\n")
	if err != nil || resp.StatusCode != 413 || !resp.Close {
		t.Errorf("200,000 bytes declared, none sent: %v %v; want 413 at once, the connection closed", resp, err)
	}
	resp, err = exchange("GET / HTTP/1.0\r\nHost: app.example\r\nAccept-Encoding: gzip\r\n\r\n")
	if err != nil || resp.StatusCode != 200 || resp.Header.Get("Content-Encoding") != "" {
		t.Errorf("HTTP/1.0 asking for gzip: %v %v; want 200, not compressed", resp, err)
	}
}
