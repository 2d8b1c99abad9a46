package encode

import (
	"bufio"
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

func TestNegotiate(t *testing.T) {
	cases := []struct {
		name   string
		values []string
		want   coding
	}{
		{"nothing asked gets nothing", nil, identity},
		{"a browser's list prefers zstd", []string{"gzip, deflate, br, zstd"}, codingZstd},
		{"gzip alone", []string{"gzip"}, codingGzip},
		{"x-gzip is gzip", []string{"x-gzip"}, codingGzip},
		{"a higher q wins", []string{"zstd;q=0.5, gzip;q=0.8"}, codingGzip},
		{"q=0 refuses", []string{"zstd;q=0, gzip"}, codingGzip},
		{"everything refused", []string{"zstd;q=0, gzip;q=0"}, identity},
		{"a star covers what is not named", []string{"*"}, codingZstd},
		{"a star at q=0 with gzip named", []string{"*;q=0, gzip;q=0.1"}, codingGzip},
		{"identity only", []string{"identity"}, identity},
		{"br only", []string{"br"}, identity},
		{"case and spaces", []string{" GZip ; Q=0.9 , ZSTD;q=0.95"}, codingZstd},
		{"spread over fields", []string{"br", "gzip"}, codingGzip},
		{"a malformed q refuses", []string{"gzip;q=high"}, identity},
		{"a q above 1 refuses", []string{"gzip;q=2"}, identity},
		{"other parameters are ignored", []string{"gzip;level=9"}, codingGzip},
		{"empty items", []string{",,gzip,,"}, codingGzip},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got, _ := negotiate(tc.values); got != tc.want {
				t.Errorf("negotiate(%q) = %v, want %v", tc.values, got, tc.want)
			}
		})
	}
}

// FuzzNegotiate holds the Accept-Encoding parser to what the client said:
// a coding is chosen only if the header names it, or "*", with a weight
// above zero, and nothing panics.
func FuzzNegotiate(f *testing.F) {
	for _, s := range []string{"gzip, deflate, br, zstd", "zstd;q=0.5, gzip;q=0.8", "*;q=0", "gzip;q=", ";;,,", "zstd;q=1.0000000001"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		c, gzipOK := negotiate([]string{v})
		if gzipOK && !strings.Contains(strings.ToLower(v), "gzip") && !strings.Contains(v, "*") {
			t.Fatalf("negotiate(%q) says gzip is taken, which it does not name", v)
		}
		lower := strings.ToLower(v)
		switch c {
		case codingZstd:
			if !strings.Contains(lower, "zstd") && !strings.Contains(lower, "*") {
				t.Fatalf("negotiate(%q) = zstd, which it does not name", v)
			}
		case codingGzip:
			if !strings.Contains(lower, "gzip") && !strings.Contains(lower, "*") {
				t.Fatalf("negotiate(%q) = gzip, which it does not name", v)
			}
		}
	})
}

var page = []byte(strings.Repeat("<p>the same paragraph, again and again, compresses well</p>\n", 1200))

// serve runs h behind Handler on a real server and returns the client's
// response to a GET with these request headers; the body is read raw.
func serve(t *testing.T, o Options, h http.HandlerFunc, method string, reqHeader ...string) (*http.Response, []byte) {
	t.Helper()
	srv := httptest.NewServer(Handler(h, o))
	t.Cleanup(srv.Close)
	req, _ := http.NewRequest(method, srv.URL+"/", nil)
	for i := 0; i+1 < len(reqHeader); i += 2 {
		req.Header.Set(reqHeader[i], reqHeader[i+1])
	}
	tr := &http.Transport{DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func decode(t *testing.T, coding string, b []byte) []byte {
	t.Helper()
	var r io.Reader
	switch coding {
	case "gzip":
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("gzip: %v", err)
		}
		r = zr
	case "zstd":
		zr, err := zstd.NewReader(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("zstd: %v", err)
		}
		defer zr.Close()
		r = zr
	case "":
		return b
	default:
		t.Fatalf("Content-Encoding %q", coding)
	}
	out, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("decode %s: %v", coding, err)
	}
	return out
}

func TestWhatIsCompressed(t *testing.T) {
	html := func(extra ...string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			for i := 0; i+1 < len(extra); i += 2 {
				w.Header().Set(extra[i], extra[i+1])
			}
			w.Write(page)
		}
	}
	cases := []struct {
		name    string
		o       Options
		h       http.HandlerFunc
		method  string
		req     []string
		coding  string // the Content-Encoding wanted: "" for none
		checkFn func(t *testing.T, resp *http.Response)
	}{
		{name: "HTML for a zstd client is zstd", h: html(), req: []string{"Accept-Encoding", "gzip, zstd"}, coding: "zstd"},
		{name: "HTML for a gzip client is gzip", h: html(), req: []string{"Accept-Encoding", "gzip"}, coding: "gzip"},
		{name: "nothing for a client that asks for nothing", h: html()},
		{name: "nothing for a client that takes only br", h: html(), req: []string{"Accept-Encoding", "br"}},
		{name: "a response the application encoded stays as it is", h: html("Content-Encoding", "br"), req: []string{"Accept-Encoding", "gzip"}, coding: "br"},
		{name: "no-transform is obeyed", h: html("Cache-Control", "public, no-transform"), req: []string{"Accept-Encoding", "gzip"}},
		{name: "a range request is not compressed", h: html(), req: []string{"Accept-Encoding", "gzip", "Range", "bytes=0-10"}},
		{name: "an image is not compressed", h: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "image/png")
			w.Write(page)
		}, req: []string{"Accept-Encoding", "gzip"}},
		{name: "JSON is compressed", h: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.Write(page)
		}, req: []string{"Accept-Encoding", "gzip"}, coding: "gzip"},
		{name: "a type sniffed from the body counts", h: func(w http.ResponseWriter, r *http.Request) {
			w.Write(append([]byte("<!DOCTYPE html>"), page...))
		}, req: []string{"Accept-Encoding", "gzip"}, coding: "gzip"},
		{name: "a short body with its length stays as it is", h: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.Header().Set("Content-Length", "5")
			w.Write([]byte("short"))
		}, req: []string{"Accept-Encoding", "gzip"}},
		{name: "a short body without its length goes out as it is, with it", h: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(404)
			w.Write([]byte("not "))
			w.Write([]byte("found"))
		}, req: []string{"Accept-Encoding", "gzip"}, checkFn: func(t *testing.T, resp *http.Response) {
			if resp.StatusCode != 404 || resp.ContentLength != 9 {
				t.Errorf("status %d, length %d; want 404 and 9", resp.StatusCode, resp.ContentLength)
			}
		}},
		{name: "a long body with its length is compressed, its length dropped", h: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/css")
			w.Header().Set("Content-Length", "73200")
			w.Write(page)
		}, req: []string{"Accept-Encoding", "gzip"}, coding: "gzip", checkFn: func(t *testing.T, resp *http.Response) {
			if resp.ContentLength == 73200 {
				t.Error("the uncompressed length was sent with the compressed body")
			}
		}},
		{name: "a strong ETag is made weak, and Vary names Accept-Encoding", h: html("Etag", `"v1"`, "Vary", "Origin"), req: []string{"Accept-Encoding", "gzip"}, coding: "gzip",
			checkFn: func(t *testing.T, resp *http.Response) {
				if got := resp.Header.Get("Etag"); got != `W/"v1"` {
					t.Errorf("ETag %q, want W/\"v1\"", got)
				}
				if got := resp.Header.Values("Vary"); len(got) != 2 || got[1] != "Accept-Encoding" {
					t.Errorf("Vary %q, want Origin and Accept-Encoding", got)
				}
			}},
		{name: "204 has no body to compress", h: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(204)
		}, req: []string{"Accept-Encoding", "gzip"}},
		{name: "304 has no body to compress", h: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(304)
		}, req: []string{"Accept-Encoding", "gzip"}},
		{name: "HEAD is not compressed", h: html(), method: "HEAD", req: []string{"Accept-Encoding", "gzip"}},
		{name: "server-sent events are not compressed", h: func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Write(page)
		}, req: []string{"Accept-Encoding", "gzip"}},
		{name: "a route may turn it off", o: Options{Skip: func(*http.Request) bool { return true }}, h: html(), req: []string{"Accept-Encoding", "gzip"}},
		{name: "nothing new is compressed while memory is short", o: Options{Short: func() bool { return true }}, h: html(), req: []string{"Accept-Encoding", "gzip"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = "GET"
			}
			resp, b := serve(t, tc.o, tc.h, method, tc.req...)
			if got := resp.Header.Get("Content-Encoding"); got != tc.coding {
				t.Fatalf("Content-Encoding %q, want %q", got, tc.coding)
			}
			if tc.coding != "" && tc.coding != "br" {
				if len(b) >= len(page) {
					t.Errorf("%d bytes on the wire for %d of HTML", len(b), len(page))
				}
				if got := decode(t, tc.coding, b); !bytes.HasSuffix(got, page) {
					t.Errorf("decoded body differs from the page (%d bytes)", len(got))
				}
			}
			if tc.checkFn != nil {
				tc.checkFn(t, resp)
			}
		})
	}
}

// A streamed response stays streamed: each piece the handler flushes
// reaches the client, decodable, before the next is written. A stream
// (flushed before MinSize bytes came) is compressed with gzip, which keeps
// no window between writes, or not at all for a client without gzip.
func TestEachFlushReachesTheClient(t *testing.T) {
	for _, tc := range []struct{ accept, coding string }{
		{"gzip", "gzip"},
		{"gzip, zstd", "gzip"},
		{"zstd", ""},
	} {
		t.Run(tc.accept, func(t *testing.T) {
			next := make(chan struct{})
			h := func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/x-ndjson")
				for i := range 3 {
					io.WriteString(w, strings.Repeat("x", 100)+"\n")
					w.(http.Flusher).Flush()
					if i < 2 {
						select {
						case <-next:
						case <-r.Context().Done():
							return
						}
					}
				}
			}
			srv := httptest.NewServer(Handler(http.HandlerFunc(h), Options{}))
			defer srv.Close()
			req, _ := http.NewRequest("GET", srv.URL, nil)
			req.Header.Set("Accept-Encoding", tc.accept)
			tr := &http.Transport{DisableCompression: true}
			defer tr.CloseIdleConnections()
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if got := resp.Header.Get("Content-Encoding"); got != tc.coding {
				t.Fatalf("Content-Encoding %q, want %q", got, tc.coding)
			}
			var dec io.Reader = resp.Body
			if tc.coding == "gzip" {
				zr, err := gzip.NewReader(resp.Body)
				if err != nil {
					t.Fatal(err)
				}
				dec = zr
			}
			lines := bufio.NewReader(dec)
			for i := range 3 {
				got := make(chan error, 1)
				go func() {
					_, err := lines.ReadString('\n')
					got <- err
				}()
				select {
				case err := <-got:
					if err != nil {
						t.Fatalf("line %d: %v", i+1, err)
					}
				case <-time.After(10 * time.Second):
					t.Fatalf("line %d, flushed by the handler, did not reach the client", i+1)
				}
				if i < 2 {
					next <- struct{}{}
				}
			}
		})
	}
}

// A short body whose handler announced trailers is not given a length,
// which would leave no room for them.
func TestAShortBodyKeepsItsTrailers(t *testing.T) {
	resp, b := serve(t, Options{}, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Trailer", "X-Sum")
		io.WriteString(w, "short")
		w.Header().Set("X-Sum", "42")
	}, "GET", "Accept-Encoding", "gzip")
	if string(b) != "short" || resp.Trailer.Get("X-Sum") != "42" {
		t.Errorf("body %q, trailer X-Sum %q; want short and 42", b, resp.Trailer.Get("X-Sum"))
	}
}

// A response given up on, by a hijack (backhaul closes the client's
// connection under a response cut short) or by http.ErrAbortHandler,
// writes nothing more: no encoder's end into a connection taken over.
func TestAResponseGivenUpOnWritesNothingMore(t *testing.T) {
	for _, how := range []string{"hijack", "abort"} {
		t.Run(how, func(t *testing.T) {
			var logged bytes.Buffer
			h := func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/html")
				w.Write(page)
				if how == "abort" {
					panic(http.ErrAbortHandler)
				}
				c, _, err := http.NewResponseController(w).Hijack()
				if err != nil {
					t.Errorf("Hijack: %v", err)
					return
				}
				c.Close()
			}
			srv := httptest.NewUnstartedServer(Handler(http.HandlerFunc(h), Options{}))
			srv.Config.ErrorLog = log.New(&logged, "", 0)
			srv.Start()
			defer srv.Close()
			req, _ := http.NewRequest("GET", srv.URL, nil)
			req.Header.Set("Accept-Encoding", "gzip")
			tr := &http.Transport{DisableCompression: true}
			defer tr.CloseIdleConnections()
			if resp, err := tr.RoundTrip(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			srv.Close() // waits for the handler's end
			if strings.Contains(logged.String(), "hijacked") {
				t.Errorf("the server logged a write after the hijack: %s", logged.String())
			}
			// The pooled writer and encoders serve the next response.
			resp, b := serve(t, Options{}, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/html")
				w.Write(page)
			}, "GET", "Accept-Encoding", "gzip")
			if got := decode(t, resp.Header.Get("Content-Encoding"), b); !bytes.Equal(got, page) {
				t.Errorf("the next response decoded to %d bytes, want the page", len(got))
			}
		})
	}
}

// A request that asks for an upgrade is not wrapped: its handler can take
// the connection over.
func TestAnUpgradeRequestKeepsItsConnection(t *testing.T) {
	hijacked := make(chan error, 1)
	h := func(w http.ResponseWriter, r *http.Request) {
		c, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			c.Close()
		}
		hijacked <- err
	}
	srv := httptest.NewServer(Handler(http.HandlerFunc(h), Options{}))
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL, nil)
	req.Header.Set("Accept-Encoding", "gzip")
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	if resp, err := tr.RoundTrip(req); err == nil {
		resp.Body.Close()
	}
	if err := <-hijacked; err != nil {
		t.Errorf("Hijack under Handler: %v", err)
	}
}

func BenchmarkHandler(b *testing.B) {
	small := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", "2")
		w.Write([]byte("ok"))
	})
	html := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.Write(page[:64<<10])
	})
	for _, bc := range []struct {
		name, accept string
		h            http.Handler
	}{
		{"no-accept-encoding", "", small},
		{"small-response", "gzip, zstd", small},
		{"64KiB-html-gzip", "gzip", html},
		{"64KiB-html-zstd", "zstd", html},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := Handler(bc.h, Options{})
			req := httptest.NewRequest("GET", "/", nil)
			if bc.accept != "" {
				req.Header.Set("Accept-Encoding", bc.accept)
			}
			w := &discardWriter{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				h.ServeHTTP(w, req)
			}
		})
	}
}

type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(int)             {}
