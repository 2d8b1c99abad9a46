package backhaul

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/node"
)

// silent accepts, reads the request head and never answers. got receives a
// value per request read.
func silent(t *testing.T, got chan<- struct{}) node.Upstream {
	addr := rawListener(t, func(c net.Conn) {
		if _, _, err := readRequestHead(c); err != nil {
			return
		}
		if got != nil {
			got <- struct{}{}
		}
		io.Copy(io.Discard, c) // until the proxy or the test closes it
	})
	return node.Upstream{Node: "silent", Address: addr}
}

// scripted answers every request with raw bytes and then resets the
// connection, as a crashing upstream would.
func scripted(t *testing.T, name, raw string) node.Upstream {
	addr := rawListener(t, func(c net.Conn) {
		if _, _, err := readRequestHead(c); err != nil {
			return
		}
		io.WriteString(c, raw)
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) // close with RST, not FIN
		}
	})
	return node.Upstream{Node: name, Address: addr}
}

// counting answers 200 and counts the requests it saw.
func counting(t *testing.T, n *atomic.Int32) node.Upstream {
	return upstream(t, "spare", func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		io.WriteString(w, "spare")
	})
}

func TestFailuresAfterConnectingAreNotFailedOver(t *testing.T) {
	tests := []struct {
		name       string
		first      func(t *testing.T) node.Upstream
		opts       Options
		wantStatus int
		wantErr    []error
	}{
		{
			name:       "an upstream that never answers times out as a 504",
			first:      func(t *testing.T) node.Upstream { return silent(t, nil) },
			opts:       Options{ResponseHeaderTimeout: 100 * time.Millisecond},
			wantStatus: 504, wantErr: []error{ErrUpstreamTimeout},
		},
		{
			name:       "a malformed response is a 502",
			first:      func(t *testing.T) node.Upstream { return scripted(t, "bad", "SPDY/9 what\r\n\r\n") },
			wantStatus: 502, wantErr: []error{ErrNoUpstream, ErrUpstreamFailed},
		},
		{
			name:       "a connection reset before the response is a 502",
			first:      func(t *testing.T) node.Upstream { return scripted(t, "reset", "") },
			wantStatus: 502, wantErr: []error{ErrNoUpstream, ErrUpstreamFailed},
		},
		{
			name: "response headers over 1 MiB are a 502",
			first: func(t *testing.T) node.Upstream {
				return scripted(t, "huge", "HTTP/1.1 200 OK\r\n"+strings.Repeat("X-Pad: "+strings.Repeat("p", 1000)+"\r\n", 1100)+"\r\n")
			},
			wantStatus: 502, wantErr: []error{ErrNoUpstream, ErrUpstreamFailed},
		},
		{
			name:       "a response header cut short is a 502",
			first:      func(t *testing.T) node.Upstream { return scripted(t, "short", "HTTP/1.1 200 OK\r\nContent-Le") },
			wantStatus: 502, wantErr: []error{ErrNoUpstream, ErrUpstreamFailed},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var spareHits atomic.Int32
			first := tt.first(t)
			p := newProxy(t, tt.opts)
			e := startEdge(t, p, first, counting(t, &spareHits))
			resp, body := rawDo(t, e.addr, "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc")
			c := e.next(t)
			if resp.StatusCode != tt.wantStatus {
				t.Errorf("status = %d %q, want %d", resp.StatusCode, body, tt.wantStatus)
			}
			for _, want := range tt.wantErr {
				if !errors.Is(c.err, want) {
					t.Errorf("Forward error = %v, want it to match %v", c.err, want)
				}
			}
			checkFailedAfterConnect(t, p, first, c, &spareHits)
		})
	}
}

func TestAnUpstreamCutOffMidBodyIsSeenAsTruncated(t *testing.T) {
	tests := []struct {
		name string
		raw  string
	}{
		{"a body shorter than its Content-Length", "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789"},
		{"a chunked body without its last chunk", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\na\r\n0123456789\r\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			up := scripted(t, "a", tt.raw)
			e := startEdge(t, newProxy(t, Options{}), up)
			resp, err := client(t).Get(e.srv.URL + "/")
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil {
				t.Errorf("client read %q and a clean end, want an error: the truncation must show", b)
			}
			c := e.next(t)
			if c.err == nil || c.res.Status != 200 {
				t.Errorf("Forward = %+v, %v; want status 200 written and an error", c.res, c.err)
			}
			if errors.Is(c.err, context.Canceled) {
				t.Errorf("Forward error %v blames the client", c.err)
			}
		})
	}
}

func TestAClientThatLeavesIsNotAnUpstreamFailure(t *testing.T) {
	t.Run("leaving while the upstream has not answered", func(t *testing.T) {
		reached := make(chan struct{}, 1)
		up := silent(t, reached)
		p := newProxy(t, Options{})
		e := startEdge(t, p, up)
		conn, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(conn, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		select {
		case <-reached:
		case <-time.After(5 * time.Second):
			t.Fatal("request never reached the upstream")
		}
		conn.Close()
		c := e.next(t)
		checkClientGone(t, p, up, c)
	})
	t.Run("leaving in the middle of an upload", func(t *testing.T) {
		reading := make(chan struct{}, 1)
		up := upstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
			buf := make([]byte, 10)
			io.ReadFull(r.Body, buf)
			reading <- struct{}{}
			io.Copy(io.Discard, r.Body)
		})
		p := newProxy(t, Options{})
		e := startEdge(t, p, up)
		conn, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(conn, "PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\n"+strings.Repeat("x", 5000))
		select {
		case <-reading:
		case <-time.After(5 * time.Second):
			t.Fatal("upload never reached the upstream")
		}
		conn.Close()
		c := e.next(t)
		checkClientGone(t, p, up, c)
	})
	t.Run("leaving in the middle of a streamed response", func(t *testing.T) {
		up := upstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			for {
				if _, err := io.WriteString(w, "data: tick\n\n"); err != nil {
					return
				}
				http.NewResponseController(w).Flush()
				select {
				case <-r.Context().Done():
					return
				case <-time.After(time.Millisecond):
				}
			}
		})
		p := newProxy(t, Options{})
		e := startEdge(t, p, up)
		conn, err := net.Dial("tcp", e.addr)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(conn, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		br := bufio.NewReader(conn)
		if _, err := http.ReadResponse(br, nil); err != nil {
			t.Fatal(err)
		}
		conn.Close()
		c := e.next(t)
		if !errors.Is(c.err, context.Canceled) || c.res.Status != 200 {
			t.Errorf("Forward = %+v, %v; want 200 written then an error matching context.Canceled", c.res, c.err)
		}
		if h := healthOf(p, up.Address); h.Failures != 0 {
			t.Errorf("failures = %d, want 0", h.Failures)
		}
	})
}

func checkClientGone(t *testing.T, p *Proxy, up node.Upstream, c call) {
	t.Helper()
	if !errors.Is(c.err, context.Canceled) {
		t.Errorf("Forward error = %v, want it to match context.Canceled", c.err)
	}
	if errors.Is(c.err, ErrNoUpstream) || errors.Is(c.err, ErrUpstreamTimeout) {
		t.Errorf("Forward error = %v must not read as an upstream failure (no 502/504)", c.err)
	}
	if h := healthOf(p, up.Address); h.Failures != 0 {
		t.Errorf("failures = %d, want 0: the client left, the upstream did not fail", h.Failures)
	}
}

func TestBytesSentRightAfterAnUpgradeRequestAreTunnelled(t *testing.T) {
	// The client pipelines its first frame behind the upgrade request,
	// without waiting for the 101.
	up := rawListener(t, func(c net.Conn) {
		req, br, err := readRequestHead(c)
		if err != nil || req.Header.Get("Upgrade") != "echo" {
			return
		}
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		buf := make([]byte, 5)
		if _, err := io.ReadFull(br, buf); err != nil {
			return
		}
		c.Write(buf)
	})
	e := startEdge(t, newProxy(t, Options{}), node.Upstream{Node: "a", Address: up})
	conn, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(conn, "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\nearly")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("response = %v, %v; want 101", resp, err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(br, buf); err != nil || string(buf) != "early" {
		t.Errorf("echo = %q, %v; want \"early\"", buf, err)
	}
	conn.Close()
	if c := e.next(t); c.res.Status != 101 || c.res.BytesIn != 5 || c.res.BytesOut != 5 {
		t.Errorf("Result = %+v, want 101 with 5 bytes each way", c.res)
	}
}

func TestAnUpstreamSwitchingToAnotherProtocolIsRefused(t *testing.T) {
	up := scripted(t, "a", "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n")
	e := startEdge(t, newProxy(t, Options{}), up)
	resp, _ := rawDo(t, e.addr, "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
	c := e.next(t)
	if resp.StatusCode != 502 || !errors.Is(c.err, ErrUpstreamFailed) {
		t.Errorf("got %d, %v; want 502 and ErrUpstreamFailed", resp.StatusCode, c.err)
	}
}

// Many hung requests are released by the timeout and leave nothing behind
// (TestMain checks goroutines).
func TestTimeoutsReleaseEveryHungRequest(t *testing.T) {
	up := silent(t, nil)
	p := newProxy(t, Options{ResponseHeaderTimeout: 100 * time.Millisecond})
	e := startEdge(t, p, up)
	c := client(t)
	const n = 20
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			resp, err := c.Get(e.srv.URL + "/")
			if err != nil {
				errs <- err
				return
			}
			resp.Body.Close()
			if resp.StatusCode != 504 {
				err = fmt.Errorf("status %d, want 504", resp.StatusCode)
			}
			errs <- err
		}()
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

func TestExpectContinueUploadsPass(t *testing.T) {
	up := upstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %q", r.Header.Get("Expect"), b)
	})
	e := startEdge(t, newProxy(t, Options{}), up)
	conn, err := net.Dial("tcp", e.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(conn, "POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
	br := bufio.NewReader(conn)
	// The edge's server sends 100 once Forward reads the body.
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100") {
		t.Fatalf("interim = %q, %v; want 100 Continue", line, err)
	}
	br.ReadString('\n')
	io.WriteString(conn, "hello")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || string(b) != `100-continue "hello"` {
		t.Errorf("got %d %s, want 200 with the body", resp.StatusCode, b)
	}
	e.next(t)
}

// Request trailers pass, but never those that frame, route, claim an
// origin for the request (an upstream merging trailers into headers would
// believe an X-Forwarded-For there) or that Connection names.
func TestRequestTrailersAreForwarded(t *testing.T) {
	up := upstream(t, "a", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		var names []string
		for k := range r.Trailer {
			names = append(names, k)
		}
		slices.Sort(names)
		fmt.Fprintf(w, "%s %v", r.Trailer.Get("Checksum"), names)
	})
	e := startEdge(t, newProxy(t, Options{}), up)
	// X-Sec is named in Connection: hop-by-hop, as a trailer too. A
	// Cookie trailer would be merged into the head by some upstreams.
	_, body := rawDo(t, e.addr, "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: X-Sec\r\n"+
		"Trailer: Checksum, X-Forwarded-For, X_Forwarded_For, X-Real-Ip, Forwarded, Host\r\n\r\n"+
		"5\r\nhello\r\n0\r\nChecksum: abc\r\nX-Forwarded-For: 6.6.6.6\r\nX_Forwarded_For: 7.7.7.7\r\n"+
		"X-Real-Ip: 6.6.6.6\r\nForwarded: for=6.6.6.6\r\nHost: evil\r\nContent-Length: 5\r\nX-Sec: s\r\nCookie: z=1\r\n\r\n")
	if want := "abc [Checksum]"; body != want {
		t.Errorf("upstream saw trailers %q, want %q", body, want)
	}
	e.next(t)
}

func TestKillingTheFirstUpstreamUnderLoadFailsOver(t *testing.T) {
	srvA := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "a") }))
	t.Cleanup(srvA.Close)
	a := node.Upstream{Node: "a", Address: srvA.Listener.Addr().String()}
	p := newProxy(t, Options{})
	e := startEdge(t, p, a, named(t, "b"))
	// The test edge drops results its buffer cannot hold; none are needed.
	c := client(t)

	const workers, perWorker, killAt = 8, 150, 300
	var sent, failed, afterKill, fromB atomic.Int64
	killed := make(chan struct{})
	errs := make(chan error, workers)
	for range workers {
		go func() {
			for range perWorker {
				if sent.Add(1) == killAt {
					// Refuse new connections, then cut the open ones,
					// requests in flight included.
					srvA.Listener.Close()
					srvA.CloseClientConnections()
					close(killed)
				}
				select {
				case <-killed:
					afterKill.Add(1)
				default:
				}
				resp, err := c.Get(e.srv.URL + "/")
				if err != nil {
					errs <- err
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					failed.Add(1)
				} else if string(b) == "b" {
					fromB.Add(1)
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("sent %d, failed %d, sent after the kill %d, served by b %d", sent.Load(), failed.Load(), afterKill.Load(), fromB.Load())
	if failed.Load() > workers {
		t.Errorf("%d requests failed, want at most the %d in flight when a was killed", failed.Load(), workers)
	}
	if fromB.Load() < afterKill.Load()-workers {
		t.Errorf("b served %d, want at least the %d sent after the kill less those in flight", fromB.Load(), afterKill.Load())
	}
}
