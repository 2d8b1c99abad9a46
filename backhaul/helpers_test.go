package backhaul

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// call is what one Forward through the test edge returned.
type call struct {
	res Result
	err error
}

// testEdge stands in for edge's handler: it forwards every request to ups
// and answers 502/504 itself when Forward wrote nothing, as the real
// handler does.
type testEdge struct {
	srv   *httptest.Server
	addr  string
	calls chan call
}

func startEdge(t *testing.T, p *Proxy, ups ...node.Upstream) *testEdge {
	t.Helper()
	e := &testEdge{calls: make(chan call, 64)}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		res, err := p.Forward(w, r, ups)
		if res.Status == 0 {
			switch {
			case errors.Is(err, ErrUpstreamTimeout):
				http.Error(w, "edge: upstream timeout", http.StatusGatewayTimeout)
			case errors.Is(err, ErrNoUpstream):
				http.Error(w, "edge: no upstream", http.StatusBadGateway)
			}
		}
		select {
		case e.calls <- call{res, err}:
		default:
		}
	}))
	e.addr = e.srv.Listener.Addr().String()
	t.Cleanup(e.srv.Close)
	return e
}

// next returns the next Forward result, failing the test after a deadline.
func (e *testEdge) next(t *testing.T) call {
	t.Helper()
	select {
	case c := <-e.calls:
		return c
	case <-time.After(5 * time.Second):
		t.Fatal("Forward never returned")
		return call{}
	}
}

// newProxy returns a Proxy closed at the end of the test or benchmark.
func newProxy(t testing.TB, opts Options) *Proxy {
	t.Helper()
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// upstream starts a loopback upstream serving h.
func upstream(t *testing.T, name string, h http.HandlerFunc) node.Upstream {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return node.Upstream{Node: name, Address: srv.Listener.Addr().String()}
}

// named answers with its name, so a test sees who served.
func named(t *testing.T, name string) node.Upstream {
	return upstream(t, name, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, name)
	})
}

// refused returns an upstream on a loopback port nothing listens on.
func refused(t *testing.T, name string) node.Upstream {
	return node.Upstream{Node: name, Address: testsupport.ClosedAddr(t)}
}

// rawListener accepts connections and hands each to serve; it is stopped,
// and its connections closed, at the end of the test.
func rawListener(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveEach(t, ln, nil, func(_ int, c net.Conn) { serve(c) })
	return ln.Addr().String()
}

// serveEach accepts ln's connections and hands each, with its number from
// 0, to serve on a goroutine of its own, calling accepted (when not nil)
// first, on the accepting goroutine; at the end of the test it closes ln
// and every connection and waits for those goroutines.
func serveEach(t *testing.T, ln net.Listener, accepted func(n int), serve func(n int, c net.Conn)) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for n := 0; ; n++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if accepted != nil {
				accepted(n)
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				serve(n, c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// readRequestHead reads one request's head from c.
func readRequestHead(c net.Conn) (*http.Request, *bufio.Reader, error) {
	br := bufio.NewReader(c)
	req, err := http.ReadRequest(br)
	return req, br, err
}

// rawDo sends raw bytes to addr and reads one response; Go's client would
// clean the odd paths these tests need to send.
func rawDo(t *testing.T, addr, raw string) (*http.Response, string) {
	t.Helper()
	return rawExchange(t, addr, http.MethodGet, raw)
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\r\n")
	return l
}

// client returns an HTTP client whose idle connections are closed at the
// end of the test, so goleak sees no stray connection goroutines.
func client(t *testing.T) *http.Client {
	t.Helper()
	tr := &http.Transport{DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}
}

func get(t *testing.T, c *http.Client, url string) (int, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// newFakeClock returns a clock for ejection periods that a test moves.
func newFakeClock() *clock.Fake {
	return clock.NewFake(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
}

// healthOf returns the health entry for addr, or a zero one.
func healthOf(p *Proxy, addr string) UpstreamHealth {
	for _, h := range p.Health() {
		if h.Address == addr {
			return h
		}
	}
	return UpstreamHealth{}
}

// checkFailedAfterConnect checks what a failure after connecting must leave
// behind: nothing written, no failover (the first upstream may have acted on
// the request, so the spare must not see it), and the first upstream not
// counted as failing, since it connected.
func checkFailedAfterConnect(t *testing.T, p *Proxy, first node.Upstream, c call, spareHits *atomic.Int32) {
	t.Helper()
	if c.res.Status != 0 || c.res.Failovers != 0 || c.res.Node != first.Node {
		t.Errorf("Result = %+v, want nothing written, no failover, node %q", c.res, first.Node)
	}
	if n := spareHits.Load(); n != 0 {
		t.Errorf("the second upstream got %d requests, want 0: the first may have acted on it", n)
	}
	if h := healthOf(p, first.Address); h.Failures != 0 {
		t.Errorf("failures = %d, want 0: it connected", h.Failures)
	}
}
