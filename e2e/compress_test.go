package e2e

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"

	"github.com/scafo/scafo-edge/node"
)

// TestCompressionThroughTheBinary: the edge compresses what an application
// sends uncompressed for the clients that ask (issue 48), keeps a stream
// streamed, leaves server-sent events and what the application encoded
// alone, and compresses nothing with --compress=false.
func TestCompressionThroughTheBinary(t *testing.T) {
	page := bytes.Repeat([]byte("<p>a paragraph of an ordinary page, sent again and again</p>\n"), 1100) // about 64 KiB
	next := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/page", "/chunked":
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.Header().Set("Etag", `"p1"`)
			if r.URL.Path == "/page" {
				w.Header().Set("Content-Length", strconv.Itoa(len(page)))
			}
			w.Write(page)
		case "/encoded":
			w.Header().Set("Content-Type", "text/html")
			w.Header().Set("Content-Encoding", "br")
			w.Write(page)
		case "/events", "/ndjson":
			if r.URL.Path == "/events" {
				w.Header().Set("Content-Type", "text/event-stream")
			} else {
				w.Header().Set("Content-Type", "application/x-ndjson")
			}
			for i := range 3 {
				io.WriteString(w, "data: "+strings.Repeat("e", 200)+"\n\n")
				w.(http.Flusher).Flush()
				if i == 2 {
					return
				}
				select {
				case <-next:
				case <-r.Context().Done():
					return
				}
			}
		}
	}))
	t.Cleanup(upstream.Close)
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{
		{Host: "app.example", Application: "app", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(upstream)}}},
	}})
	on := startEdge(t, "--routes-file", routes, "--tls", "off")
	off := startEdge(t, "--routes-file", routes, "--tls", "off", "--compress=false")
	waitEdgeReady(t, on)
	waitEdgeReady(t, off)

	tr := &http.Transport{DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	get := func(e *runningEdge, path, accept string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+e.HTTPAddr+path, nil)
		req.Host = "app.example"
		if accept != "" {
			req.Header.Set("Accept-Encoding", accept)
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	decoder := func(coding string, r io.Reader) io.Reader {
		t.Helper()
		switch coding {
		case "gzip":
			zr, err := gzip.NewReader(r)
			if err != nil {
				t.Fatal(err)
			}
			return zr
		case "zstd":
			zr, err := zstd.NewReader(r)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(zr.Close)
			return zr
		}
		return r
	}

	// A body of known length gets the best coding the client takes; one the
	// application sends in pieces (chunked: the edge cannot tell a page from
	// a stream that stays open) gets gzip that keeps no window.
	for _, tc := range []struct{ path, accept, coding string }{
		{"/page", "gzip, deflate, br, zstd", "zstd"},
		{"/page", "gzip", "gzip"},
		{"/page", "", ""},
		{"/chunked", "gzip, deflate, br, zstd", "gzip"},
	} {
		resp := get(on, tc.path, tc.accept)
		wire, _ := io.ReadAll(resp.Body)
		if got := resp.Header.Get("Content-Encoding"); got != tc.coding {
			t.Fatalf("Accept-Encoding %q: Content-Encoding %q, want %q", tc.accept, got, tc.coding)
		}
		body, err := io.ReadAll(decoder(tc.coding, bytes.NewReader(wire)))
		if err != nil || !bytes.Equal(body, page) {
			t.Fatalf("Accept-Encoding %q: decoded %d bytes (%v), want the %d-byte page", tc.accept, len(body), err, len(page))
		}
		if tc.coding != "" {
			if resp.Header.Get("Etag") != `W/"p1"` || !strings.Contains(resp.Header.Get("Vary"), "Accept-Encoding") {
				t.Errorf("%s: ETag %q, Vary %q; want a weak ETag and Vary: Accept-Encoding", tc.coding, resp.Header.Get("Etag"), resp.Header.Get("Vary"))
			}
			t.Logf("figures: a %d-byte page (%s) as %s: %d bytes on the wire", len(page), tc.path, tc.coding, len(wire))
		}
	}

	if resp := get(on, "/encoded", "gzip"); resp.Header.Get("Content-Encoding") != "br" {
		t.Errorf("a response the application encoded: Content-Encoding %q, want br as sent", resp.Header.Get("Content-Encoding"))
	}
	if resp := get(off, "/page", "gzip, zstd"); resp.Header.Get("Content-Encoding") != "" {
		t.Errorf("--compress=false: Content-Encoding %q, want none", resp.Header.Get("Content-Encoding"))
	}

	// Streams: each event the application flushes reaches the client
	// before the application writes the next.
	// A stream is compressed with gzip, which keeps no window between
	// writes: a stream may be open for long.
	for _, tc := range []struct{ path, coding string }{{"/events", ""}, {"/ndjson", "gzip"}} {
		resp := get(on, tc.path, "gzip, zstd")
		if got := resp.Header.Get("Content-Encoding"); got != tc.coding {
			t.Fatalf("%s: Content-Encoding %q, want %q", tc.path, got, tc.coding)
		}
		lines := bufio.NewReader(decoder(tc.coding, resp.Body))
		for i := range 3 {
			got := make(chan error, 1)
			go func() {
				_, err := lines.ReadString('\n')
				if err == nil {
					_, err = lines.ReadString('\n')
				}
				got <- err
			}()
			select {
			case err := <-got:
				if err != nil {
					t.Fatalf("%s: event %d: %v", tc.path, i+1, err)
				}
			case <-time.After(15 * time.Second):
				t.Fatalf("%s: event %d, flushed by the application, did not reach the client", tc.path, i+1)
			}
			if i < 2 {
				next <- struct{}{}
			}
		}
	}
}
