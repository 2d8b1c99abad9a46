package backhaul

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

// paths are the two ways a request reaches an upstream: the pooled client
// for a request without a body (h1.go), http.Transport for the rest. Tests
// that run on both hold them to the same behaviour.
var paths = []struct {
	name  string
	h1Off bool
}{
	{"pooled client", false},
	{"transport", true},
}

// newPathProxy is newProxy on one of the paths.
func newPathProxy(t *testing.T, opts Options, h1Off bool) *Proxy {
	p := newProxy(t, opts)
	p.h1Off = h1Off
	return p
}

// rawKeepAlive serves raw responses over keep-alive connections: respond
// gets each request (its body read) and the number of the request on its
// connection, from 1, and returns the bytes to send and whether to close
// the connection afterwards. conns counts the connections accepted.
func rawKeepAlive(t *testing.T, conns *atomic.Int32, respond func(r *http.Request, n int) (raw string, close bool)) string {
	return rawListener(t, func(c net.Conn) {
		if conns != nil {
			conns.Add(1)
		}
		br := bufio.NewReader(c)
		for n := 1; ; n++ {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.Copy(io.Discard, req.Body)
			raw, closeAfter := respond(req, n)
			if _, err := io.WriteString(c, raw); err != nil || closeAfter {
				return
			}
		}
	})
}

// rawExchange sends a raw request to addr and reads the response to it,
// body and trailers included.
func rawExchange(t *testing.T, addr, method, raw string) (*http.Response, string) {
	t.Helper()
	c, br := rawSend(t, addr, raw)
	defer c.Close()
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatalf("read response to %q: %v", firstLine(raw), err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read body of %q: %v", firstLine(raw), err)
	}
	return resp, string(b)
}

// rawSend dials addr and sends it raw bytes, under a deadline; the caller
// reads the answer from the reader and closes the connection.
func rawSend(t *testing.T, addr, raw string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		c.Close()
		t.Fatal(err)
	}
	return c, bufio.NewReader(c)
}

func TestResponsesPassTheSameOnBothPaths(t *testing.T) {
	long := strings.Repeat("c", 20<<10)
	tests := []struct {
		name       string
		method     string
		raw        string
		close      bool
		wantStatus int
		wantBody   string
		wantHeader map[string]string // "" means absent
		wantTrail  map[string]string
	}{
		{
			name:       "a body of declared length arrives with its headers",
			raw:        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Type: text/plain\r\nx-app: 1\r\n\r\nhello",
			wantStatus: 200, wantBody: "hello",
			wantHeader: map[string]string{"Content-Type": "text/plain", "X-App": "1", "Content-Length": "5"},
		},
		{
			name: "a chunked body arrives whole, extensions dropped and trailers passed",
			raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n" +
				"5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: abc\r\n\r\n",
			wantStatus: 200, wantBody: "hello world",
			wantTrail: map[string]string{"X-Sum": "abc"},
		},
		{
			name:       "a body delimited by the upstream's close arrives whole",
			raw:        "HTTP/1.1 200 OK\r\nX-Kind: close\r\n\r\nuntil the end",
			close:      true,
			wantStatus: 200, wantBody: "until the end",
			wantHeader: map[string]string{"X-Kind": "close"},
		},
		{
			name:       "an HTTP/1.0 response is passed on",
			raw:        "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
			close:      true,
			wantStatus: 200, wantBody: "ok",
		},
		{
			name:       "a HEAD response has no body though it names a length",
			method:     "HEAD",
			raw:        "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n",
			wantStatus: 200,
			wantHeader: map[string]string{"Content-Length": "1000"},
		},
		{
			name:       "a 304 has no body",
			raw:        "HTTP/1.1 304 Not Modified\r\nEtag: \"v1\"\r\n\r\n",
			wantStatus: 304,
			wantHeader: map[string]string{"Etag": `"v1"`},
		},
		{
			name:       "a 204 has no body",
			raw:        "HTTP/1.1 204 No Content\r\nX-Done: yes\r\n\r\n",
			wantStatus: 204,
			wantHeader: map[string]string{"X-Done": "yes"},
		},
		{
			name: "informational responses before the final one are not passed on",
			raw: "HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n" +
				strings.Repeat("HTTP/1.1 102 Processing\r\n\r\n", 10) + "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
			wantStatus: 200, wantBody: "ok",
			wantHeader: map[string]string{"Link": ""},
		},
		{
			name:       "a repeated field keeps every value in order",
			raw:        "HTTP/1.1 200 OK\r\nSet-Cookie: a=1\r\nContent-Length: 0\r\nSet-Cookie: b=2\r\n\r\n",
			wantStatus: 200,
			wantHeader: map[string]string{"Set-Cookie": "a=1, b=2"},
		},
		{
			name: "fields named by Connection and hop-by-hop fields are removed (RFC 7230 6.1)",
			raw: "HTTP/1.1 200 OK\r\nConnection: X-Secret\r\nX-Secret: internal\r\nKeep-Alive: timeout=1\r\n" +
				"Proxy-Authenticate: Basic\r\nX-App: kept\r\nContent-Length: 0\r\n\r\n",
			wantStatus: 200,
			wantHeader: map[string]string{"X-Secret": "", "Keep-Alive": "", "Proxy-Authenticate": "", "X-App": "kept"},
		},
		{
			name:       "a header line longer than the read buffer arrives intact",
			raw:        "HTTP/1.1 200 OK\r\nSet-Cookie: " + long + "\r\nContent-Length: 2\r\n\r\nok",
			wantStatus: 200, wantBody: "ok",
			wantHeader: map[string]string{"Set-Cookie": long},
		},
		{
			name:       "an upstream status without a reason phrase is passed on",
			raw:        "HTTP/1.1 418\r\nContent-Length: 0\r\n\r\n",
			wantStatus: 418,
		},
	}
	for _, path := range paths {
		for _, tt := range tests {
			t.Run(path.name+"/"+tt.name, func(t *testing.T) {
				up := rawKeepAlive(t, nil, func(*http.Request, int) (string, bool) { return tt.raw, tt.close })
				e := startEdge(t, newPathProxy(t, Options{}, path.h1Off), node.Upstream{Node: "a", Address: up})
				method := tt.method
				if method == "" {
					method = "GET"
				}
				resp, body := rawExchange(t, e.addr, method, method+" / HTTP/1.1\r\nHost: a\r\n\r\n")
				c := e.next(t)
				if c.err != nil {
					t.Errorf("Forward error = %v", c.err)
				}
				if resp.StatusCode != tt.wantStatus || body != tt.wantBody {
					t.Errorf("response = %d %q, want %d %q", resp.StatusCode, body, tt.wantStatus, tt.wantBody)
				}
				for k, want := range tt.wantHeader {
					if got := strings.Join(resp.Header.Values(k), ", "); got != want {
						t.Errorf("header %s = %q, want %q", k, got, want)
					}
				}
				for k, want := range tt.wantTrail {
					if got := resp.Trailer.Get(k); got != want {
						t.Errorf("trailer %s = %q, want %q", k, got, want)
					}
				}
			})
		}
	}
}

func TestMalformedResponsesAreA502OnBothPaths(t *testing.T) {
	tests := []struct {
		name   string
		raw    string
		pooled bool // only the pooled client refuses it
	}{
		{name: "a status line that is not HTTP/1.x", raw: "SPDY/9 what\r\n\r\n"},
		{name: "differing Content-Length values", raw: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok"},
		{name: "a Transfer-Encoding other than chunked", raw: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nok"},
		{name: "a negative Content-Length", raw: "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\nok"},
		{name: "a 101 nobody asked for", raw: "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"},
		{name: "informational responses past the 1 MiB head bound", raw: strings.Repeat("HTTP/1.1 103 Early Hints\r\nLink: "+strings.Repeat("l", 1000)+"\r\n\r\n", 1100)},
		{name: "a header line without a colon", raw: "HTTP/1.1 200 OK\r\nNo colon here\r\nContent-Length: 0\r\n\r\n"},
		{name: "a folded header line (RFC 7230 3.2.4)", raw: "HTTP/1.1 200 OK\r\nX-A: 1\r\n 2\r\nContent-Length: 0\r\n\r\n", pooled: true},
		{name: "a status below 100, which Go's server would panic writing", raw: "HTTP/1.1 099 Low\r\nContent-Length: 5\r\n\r\nhello"},
	}
	for _, path := range paths {
		for _, tt := range tests {
			if tt.pooled && path.h1Off {
				continue
			}
			t.Run(path.name+"/"+tt.name, func(t *testing.T) {
				var spareHits atomic.Int32
				first := scripted(t, "bad", tt.raw)
				p := newPathProxy(t, Options{}, path.h1Off)
				e := startEdge(t, p, first, counting(t, &spareHits))
				resp, body := rawDo(t, e.addr, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
				c := e.next(t)
				if resp.StatusCode != 502 {
					t.Errorf("status = %d %q, want 502", resp.StatusCode, body)
				}
				if !errors.Is(c.err, ErrUpstreamFailed) {
					t.Errorf("Forward error = %v, want ErrUpstreamFailed", c.err)
				}
				checkFailedAfterConnect(t, p, first, c, &spareHits)
			})
		}
	}
}

func TestRequestHeadsAreTheSameOnBothPaths(t *testing.T) {
	tests := []struct {
		name   string
		raw    string
		want   map[string]string // "" means absent
		target string
	}{
		{
			name:   "the request-URI bytes pass unchanged (rule 4)",
			raw:    "GET //paulca/%2e%2e/x?q HTTP/1.1\r\nHost: a\r\n\r\n",
			target: "//paulca/%2e%2e/x?q",
		},
		{
			name:   "an absolute-form target is sent as its path and query",
			raw:    "GET http://a/a%2fb?q=1 HTTP/1.1\r\nHost: a\r\n\r\n",
			target: "/a%2fb?q=1",
		},
		{
			name: "no User-Agent is invented when the client sent none",
			raw:  "GET / HTTP/1.1\r\nHost: a\r\n\r\n",
			want: map[string]string{"User-Agent": ""},
		},
		{
			name: "the client's User-Agent passes",
			raw:  "GET / HTTP/1.1\r\nHost: a\r\nUser-Agent: curl/8\r\n\r\n",
			want: map[string]string{"User-Agent": "curl/8"},
		},
		{
			name: "a bodiless POST carries a zero length",
			raw:  "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
			want: map[string]string{"Content-Length": "0"},
		},
		{
			name: "a GET carries no length",
			raw:  "GET / HTTP/1.1\r\nHost: a\r\n\r\n",
			want: map[string]string{"Content-Length": ""},
		},
		{
			name: "hop-by-hop and Connection-named headers are removed, TE: trailers kept",
			raw:  "GET / HTTP/1.1\r\nHost: a\r\nConnection: X-Hop\r\nX-Hop: 1\r\nTe: trailers\r\nKeep-Alive: 5\r\nX-End: kept\r\n\r\n",
			want: map[string]string{"X-Hop": "", "Keep-Alive": "", "Te": "trailers", "X-End": "kept", "Connection": ""},
		},
		{
			name: "an untrusted client's forwarding headers are replaced",
			raw:  "GET / HTTP/1.1\r\nHost: app.example\r\nX-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Proto: https\r\nForwarded: for=x\r\n\r\n",
			want: map[string]string{"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Proto": "http",
				"X-Forwarded-Host": "app.example", "Forwarded": ""},
		},
	}
	for _, path := range paths {
		for _, tt := range tests {
			t.Run(path.name+"/"+tt.name, func(t *testing.T) {
				got := make(chan *http.Request, 1)
				up := rawKeepAlive(t, nil, func(r *http.Request, _ int) (string, bool) {
					got <- r
					return "HTTP/1.1 204 No Content\r\n\r\n", false
				})
				e := startEdge(t, newPathProxy(t, Options{}, path.h1Off), node.Upstream{Node: "a", Address: up})
				rawDo(t, e.addr, tt.raw)
				e.next(t)
				r := <-got
				if tt.target != "" && r.RequestURI != tt.target {
					t.Errorf("upstream request-URI = %q, want %q", r.RequestURI, tt.target)
				}
				for k, want := range tt.want {
					if k == "Connection" && path.h1Off && want == "" {
						// The transport asks for a connection per request.
						want = "close"
					}
					if g := strings.Join(r.Header.Values(k), ", "); g != want {
						t.Errorf("upstream %s = %q, want %q", k, g, want)
					}
				}
			})
		}
	}
}

func TestPooledConnections(t *testing.T) {
	ok := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	getN := func(t *testing.T, addr string, n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			if resp, body := rawDo(t, addr, "GET / HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 200 || body != "ok" {
				t.Fatalf("request %d = %d %q, want 200 ok", i, resp.StatusCode, body)
			}
		}
	}

	t.Run("sequential requests share one keep-alive connection", func(t *testing.T) {
		var conns atomic.Int32
		up := rawKeepAlive(t, &conns, func(*http.Request, int) (string, bool) { return ok, false })
		e := startEdge(t, newProxy(t, Options{}), node.Upstream{Node: "a", Address: up})
		getN(t, e.addr, 10)
		if n := conns.Load(); n != 1 {
			t.Errorf("upstream accepted %d connections, want 1", n)
		}
	})

	// A connection idle past its read deadline is peeked and reused: h1's
	// TestPoolReusesAConnectionIdlePastItsReadDeadline.

	t.Run("a connection that said close is not reused", func(t *testing.T) {
		var conns atomic.Int32
		up := rawKeepAlive(t, &conns, func(*http.Request, int) (string, bool) {
			return "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", false
		})
		e := startEdge(t, newProxy(t, Options{}), node.Upstream{Node: "a", Address: up})
		getN(t, e.addr, 3)
		if n := conns.Load(); n != 3 {
			t.Errorf("upstream accepted %d connections, want 3", n)
		}
	})

	t.Run("bytes after a response's end keep its connection out of the pool", func(t *testing.T) {
		var conns atomic.Int32
		up := rawKeepAlive(t, &conns, func(*http.Request, int) (string, bool) { return ok + "GARBAGE", false })
		e := startEdge(t, newProxy(t, Options{}), node.Upstream{Node: "a", Address: up})
		getN(t, e.addr, 2)
		if n := conns.Load(); n != 2 {
			t.Errorf("upstream accepted %d connections, want 2", n)
		}
	})

	t.Run("a connection the upstream closed while idle is not used, even for a DELETE", func(t *testing.T) {
		var conns, deletes atomic.Int32
		closed := make(chan struct{}, 4)
		up := rawListener(t, func(c net.Conn) {
			conns.Add(1)
			defer func() { closed <- struct{}{} }()
			req, _, err := readRequestHead(c)
			if err != nil {
				return
			}
			if req.Method == "DELETE" {
				deletes.Add(1)
			}
			io.WriteString(c, ok) // then close, without saying so
			c.Close()
		})
		p := newProxy(t, Options{})
		e := startEdge(t, p, node.Upstream{Node: "a", Address: up})
		for i := 0; i < 2; i++ {
			if resp, body := rawDo(t, e.addr, "DELETE /x HTTP/1.1\r\nHost: a\r\n\r\n"); resp.StatusCode != 200 {
				t.Fatalf("DELETE %d = %d %q, want 200", i, resp.StatusCode, body)
			}
			e.next(t)
			<-closed
		}
		if n := deletes.Load(); n != 2 {
			t.Errorf("upstream saw %d DELETEs, want 2", n)
		}
	})

	// The upstream answers the first request of each connection and drops
	// the second unanswered, as one closing an idle connection just as a
	// request arrives does.
	dropsSecond := func(t *testing.T, seen *atomic.Int32) string {
		return rawListener(t, func(c net.Conn) {
			br := bufio.NewReader(c)
			for n := 1; ; n++ {
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				if req.URL.Path == "/probe" {
					seen.Add(1)
				}
				if n == 2 {
					return
				}
				io.WriteString(c, ok)
			}
		})
	}
	t.Run("a GET lost to a keep-alive race is sent again on a new connection", func(t *testing.T) {
		var seen atomic.Int32
		up := dropsSecond(t, &seen)
		p := newProxy(t, Options{})
		e := startEdge(t, p, node.Upstream{Node: "a", Address: up})
		getN(t, e.addr, 1)
		e.next(t)
		resp, body := rawDo(t, e.addr, "GET /probe HTTP/1.1\r\nHost: a\r\n\r\n")
		if resp.StatusCode != 200 || body != "ok" {
			t.Errorf("GET = %d %q, want 200 ok", resp.StatusCode, body)
		}
		if n := seen.Load(); n != 2 {
			t.Errorf("upstream saw the GET %d times, want 2", n)
		}
	})
	t.Run("a DELETE lost the same way is not sent twice", func(t *testing.T) {
		var seen atomic.Int32
		up := dropsSecond(t, &seen)
		p := newProxy(t, Options{})
		e := startEdge(t, p, node.Upstream{Node: "a", Address: up})
		getN(t, e.addr, 1)
		e.next(t)
		resp, _ := rawDo(t, e.addr, "DELETE /probe HTTP/1.1\r\nHost: a\r\n\r\n")
		c := e.next(t)
		if resp.StatusCode != 502 || !errors.Is(c.err, ErrUpstreamFailed) {
			t.Errorf("DELETE = %d, %v; want 502 and ErrUpstreamFailed", resp.StatusCode, c.err)
		}
		if n := seen.Load(); n != 1 {
			t.Errorf("upstream saw the DELETE %d times, want 1", n)
		}
	})

	t.Run("idle connections are closed after IdleConnTimeout", func(t *testing.T) {
		var closedConns atomic.Int32
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
		srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
			if s == http.StateClosed {
				closedConns.Add(1)
			}
		}
		srv.Start()
		t.Cleanup(srv.Close)
		up := node.Upstream{Node: "a", Address: srv.Listener.Addr().String()}
		p := newProxy(t, Options{IdleConnTimeout: 20 * time.Millisecond})
		e := startEdge(t, p, up)
		getN(t, e.addr, 1)
		testsupport.WaitFor(t, 5*time.Second, "the idle connection to close", func() bool {
			return p.pool.IdleCount(up.Address) == 0 && closedConns.Load() == 1
		})
	})

	t.Run("at most MaxIdleConnsPerHost connections stay idle", func(t *testing.T) {
		const inFlight, maxIdle = 4, 2
		var arrived sync.WaitGroup
		arrived.Add(inFlight)
		release := make(chan struct{})
		up := upstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
			arrived.Done()
			<-release
			io.WriteString(w, "ok")
		})
		p := newProxy(t, Options{MaxIdleConnsPerHost: maxIdle})
		e := startEdge(t, p, up)
		done := make(chan struct{}, inFlight)
		for i := 0; i < inFlight; i++ {
			go func() {
				defer func() { done <- struct{}{} }()
				rawDo(t, e.addr, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
			}()
		}
		arrived.Wait()
		close(release)
		for i := 0; i < inFlight; i++ {
			<-done
		}
		if n := p.pool.IdleCount(up.Address); n != maxIdle {
			t.Errorf("idle connections = %d, want %d", n, maxIdle)
		}
		p.Close()
		if n := p.pool.IdleCount(up.Address); n != 0 {
			t.Errorf("after Close, idle connections = %d, want 0", n)
		}
	})
}

func TestResponseHeaderTimeoutOnThePooledClient(t *testing.T) {
	p := newProxy(t, Options{ResponseHeaderTimeout: 100 * time.Millisecond})
	up := silent(t, nil)
	e := startEdge(t, p, up)
	resp, _ := rawDo(t, e.addr, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	c := e.next(t)
	if resp.StatusCode != 504 || !errors.Is(c.err, ErrUpstreamTimeout) {
		t.Errorf("got %d, %v; want 504 and ErrUpstreamTimeout", resp.StatusCode, c.err)
	}
	if n := p.pool.IdleCount(up.Address); n != 0 {
		t.Errorf("idle connections = %d, want 0: a timed-out connection is not reused", n)
	}
}

func TestHTTP2GetsTakeThePooledClient(t *testing.T) {
	got := make(chan *http.Request, 1)
	up := rawKeepAlive(t, nil, func(r *http.Request, _ int) (string, bool) {
		got <- r
		return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false
	})
	ups := []node.Upstream{{Node: "a", Address: up}}
	p := newProxy(t, Options{})
	calls := make(chan call, 1)
	edge := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, err := p.Forward(w, r, ups)
		calls <- call{res, err}
	}))
	edge.EnableHTTP2 = true
	edge.StartTLS()
	t.Cleanup(edge.Close)
	c := edge.Client()
	t.Cleanup(c.CloseIdleConnections)

	resp, err := c.Get(edge.URL + "/h2?x=1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != 200 || string(b) != "ok" {
		t.Fatalf("response = %s %d %q, want HTTP/2 200 ok", resp.Proto, resp.StatusCode, b)
	}
	if cl := <-calls; cl.err != nil {
		t.Errorf("Forward error = %v", cl.err)
	}
	r := <-got
	if r.RequestURI != "/h2?x=1" || r.Header.Get("X-Forwarded-Proto") != "https" || r.ContentLength != 0 {
		t.Errorf("upstream got %s %q, X-Forwarded-Proto %q, length %d; want GET /h2?x=1 over https, no body",
			r.Method, r.RequestURI, r.Header.Get("X-Forwarded-Proto"), r.ContentLength)
	}
	// Only the pooled client keeps connections in p.pool.
	if n := p.pool.IdleCount(up); n != 1 {
		t.Errorf("pooled idle connections = %d, want 1: an HTTP/2 GET takes the pooled client", n)
	}

	// An HTTP/2 upload still goes through the transport, body and all.
	resp, err = c.Post(edge.URL+"/up", "text/plain", strings.NewReader("payload"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	<-calls
	if r := <-got; r.Method != "POST" || r.ContentLength != int64(len("payload")) {
		t.Errorf("upstream got %s with length %d, want POST with %d", r.Method, r.ContentLength, len("payload"))
	}
}

func TestRequestBodiesArriveIntactOnBothPaths(t *testing.T) {
	sizes := []struct {
		name    string
		n       int
		chunked bool // sent without a length, so forwarded chunked
	}{
		{"a small body", 5, false},
		{"a body of the largest buffered size", maxBufferedBody, false},
		{"a body one byte larger, which streams", maxBufferedBody + 1, false},
		{"a chunked body of unknown length", 3*copyBufSize + 7, true},
	}
	for _, path := range paths {
		for _, sz := range sizes {
			t.Run(path.name+"/"+sz.name, func(t *testing.T) {
				up := upstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
					b, err := io.ReadAll(r.Body)
					if err != nil {
						t.Errorf("upstream read body: %v", err)
					}
					fmt.Fprintf(w, "%d %d %s", r.ContentLength, len(b), b[:min(len(b), 5)])
				})
				e := startEdge(t, newPathProxy(t, Options{}, path.h1Off), up)
				payload := strings.Repeat("abcde", sz.n/5+1)[:sz.n]
				raw := fmt.Sprintf("POST /in HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s", sz.n, payload)
				wantLength := sz.n
				if sz.chunked {
					raw = fmt.Sprintf("POST /in HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n", sz.n, payload)
					wantLength = -1
				}
				resp, body := rawDo(t, e.addr, raw)
				c := e.next(t)
				want := fmt.Sprintf("%d %d %s", wantLength, sz.n, payload[:min(sz.n, 5)])
				if resp.StatusCode != 200 || body != want {
					t.Errorf("response = %d %q, want 200 %q", resp.StatusCode, body, want)
				}
				if c.err != nil || c.res.BytesIn != int64(sz.n) {
					t.Errorf("Forward = %+v, %v; want BytesIn %d and no error", c.res, c.err, sz.n)
				}
			})
		}
	}
}

func TestAClientLeavingDuringASmallUploadNeverReachesTheUpstream(t *testing.T) {
	var hits atomic.Int32
	up := counting(t, &hits)
	p := newProxy(t, Options{})
	e := startEdge(t, p, up)
	conn, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(conn, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\nonly ten b")
	conn.Close()
	c := e.next(t)
	checkClientGone(t, p, up, c)
	if n := hits.Load(); n != 0 {
		t.Errorf("upstream got %d requests, want 0: the body never arrived whole", n)
	}
}

// The response-header timeout counts from the request's last byte: an
// upload that takes longer to send than the timeout is not cut off
// (a streamed upload used to get a 504 mid-body).
func TestAnUploadSlowerThanTheResponseHeaderTimeoutIsAnswered(t *testing.T) {
	for _, path := range paths {
		t.Run(path.name, func(t *testing.T) {
			up := upstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
				n, _ := io.Copy(io.Discard, r.Body)
				fmt.Fprintf(w, "%d", n)
			})
			e := startEdge(t, newPathProxy(t, Options{ResponseHeaderTimeout: 200 * time.Millisecond}, path.h1Off), up)
			conn, err := net.Dial("tcp", e.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			const pieces, size = 5, 100 << 10 // streamed: more than maxBufferedBody
			fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", pieces*size)
			piece := strings.Repeat("x", size)
			// Each piece waits for the timeout to pass once more: the
			// upload takes several timeouts to send.
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for i := 0; i < pieces; i++ {
				<-tick.C
				if _, err := io.WriteString(conn, piece); err != nil {
					t.Fatalf("write piece %d: %v", i, err)
				}
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			if want := fmt.Sprint(pieces * size); resp.StatusCode != 200 || string(body) != want {
				t.Errorf("got %d %q, want 200 %q", resp.StatusCode, body, want)
			}
			e.next(t)
		})
	}
}

// An upstream that breaks off a body under an HTTP/2 client, where the
// edge aborts the stream with a panic, still has its connection closed
// (it used to leak until a GC).
func TestAResponseCutShortReleasesTheUpstreamConnectionUnderAPanic(t *testing.T) {
	closed := make(chan struct{})
	up := rawListener(t, func(c net.Conn) {
		if _, _, err := readRequestHead(c); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX")
		io.Copy(io.Discard, c) // until the edge closes its end
		close(closed)
	})
	p := newProxy(t, Options{})
	r := httptest.NewRequest("GET", "http://a/", nil)
	r.ProtoMajor, r.ProtoMinor = 2, 0
	func() {
		defer func() {
			if v := recover(); v != http.ErrAbortHandler {
				t.Errorf("Forward panicked with %v, want http.ErrAbortHandler", v)
			}
		}()
		p.Forward(httptest.NewRecorder(), r, []node.Upstream{{Node: "a", Address: up}}) // an unhijackable writer, as HTTP/2's
	}()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream connection is still open after the aborted response")
	}
}

// A proxy passes the upstream's answer: no Content-Type the upstream did
// not send (Go's server would sniff one from the body).
func TestNoContentTypeIsAddedOnBothPaths(t *testing.T) {
	for _, path := range paths {
		t.Run(path.name, func(t *testing.T) {
			up := rawKeepAlive(t, nil, func(*http.Request, int) (string, bool) {
				return "HTTP/1.1 200 OK\r\nContent-Length: 14\r\n\r\n<html></html>\n", false
			})
			e := startEdge(t, newPathProxy(t, Options{}, path.h1Off), node.Upstream{Node: "a", Address: up})
			resp, _ := rawDo(t, e.addr, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
			e.next(t)
			if ct, ok := resp.Header["Content-Type"]; ok {
				t.Errorf("Content-Type = %q, want none", ct)
			}
		})
	}
}

// Uploads over HTTP/1 and an upstream that answers before it has read
// them: the whole body still reaches it when it
// goes on reading, an answer is not held back while the client pauses, and
// a client that gives up leaves no handler waiting.
func TestStreamedUploadsAndEarlyAnswers(t *testing.T) {
	const total = 300_000 // streamed: more than maxBufferedBody

	t.Run("an upstream streaming its answer while it reads the upload gets the whole body", func(t *testing.T) {
		up := rawListener(t, func(c net.Conn) {
			req, br, err := readRequestHead(c)
			if err != nil {
				return
			}
			io.CopyN(io.Discard, br, 50_000)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nstart \r\n")
			n, _ := io.Copy(io.Discard, io.LimitReader(br, req.ContentLength-50_000))
			end := fmt.Sprint(50_000 + n)
			fmt.Fprintf(c, "%x\r\n%s\r\n0\r\n\r\n", len(end), end)
		})
		e := startEdge(t, newProxy(t, Options{}), node.Upstream{Node: "a", Address: up})
		conn, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s", total, strings.Repeat("u", 60_000))
		// The rest goes only once the answer has begun: the edge is then
		// reading the body while writing the response.
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		start := make([]byte, 6)
		if _, err := io.ReadFull(resp.Body, start); err != nil {
			t.Fatal(err)
		}
		io.WriteString(conn, strings.Repeat("u", total-60_000))
		rest, _ := io.ReadAll(resp.Body)
		if want := fmt.Sprintf("start %d", total); resp.StatusCode != 200 || string(start)+string(rest) != want {
			t.Errorf("got %d %q, want 200 %q: the upstream must read every byte of the upload", resp.StatusCode, string(start)+string(rest), want)
		}
		e.next(t)
	})

	t.Run("an early answer reaches a client that pauses its upload", func(t *testing.T) {
		up := rawListener(t, func(c net.Conn) {
			_, br, err := readRequestHead(c)
			if err != nil {
				return
			}
			io.CopyN(io.Discard, br, 100_000)
			io.WriteString(c, "HTTP/1.1 413 Content Too Large\r\nConnection: close\r\nContent-Length: 8\r\n\r\ntoo big\n")
			c.Close()
		})
		e := startEdge(t, newProxy(t, Options{}), node.Upstream{Node: "a", Address: up})
		conn, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s", 1<<20, strings.Repeat("u", 100_000))
		// The rest of the body is never sent: the answer must come anyway.
		conn.SetReadDeadline(time.Now().Add(3 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("no answer while the client paused its upload: %v", err)
		}
		if resp.StatusCode != 413 {
			t.Errorf("status = %d, want 413", resp.StatusCode)
		}
		e.next(t)
	})

	t.Run("clients that give up on an upload answered early leave no handler waiting", func(t *testing.T) {
		up := rawListener(t, func(c net.Conn) {
			if _, _, err := readRequestHead(c); err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")
			io.Copy(io.Discard, c)
		})
		e := startEdge(t, newProxy(t, Options{}), node.Upstream{Node: "a", Address: up})
		for i := 0; i < 200; i++ {
			conn, err := net.Dial("tcp", e.addr)
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(conn, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\n%s", strings.Repeat("u", i%40*1500))
			if i%2 == 0 {
				conn.(*net.TCPConn).SetLinger(0) // a reset rather than a close
			}
			conn.Close()
			e.next(t) // fails the test if Forward never returns
		}
	})
}
