package admission

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/testsupport"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newFakeClock returns a clock a test moves by hand, for Options.Clock:
// connections look old without a test waiting for them to age.
func newFakeClock() *clock.Fake { return clock.NewFake(time.Now()) }

// testLimits are limits New accepts, with maxConns connections; the
// per-client limits are out of the way unless a test lowers them.
func testLimits(maxConns int) Limits {
	return Limits{
		MaxConns:          maxConns,
		ConnsPerClient:    1000,
		RequestsPerClient: 1000,
		AppShare:          DefaultAppShare,
		QueueTimeout:      time.Minute,
	}
}

// testController is a Controller and what a test reads it by: its metrics
// and its log.
type testController struct {
	*Controller
	reg *prometheus.Registry
	log *testsupport.SyncBuffer
}

func newController(t testing.TB, opts Options) *testController {
	t.Helper()
	tc := &testController{reg: prometheus.NewRegistry(), log: &testsupport.SyncBuffer{}}
	opts.Registerer = tc.reg
	opts.Log = zerolog.New(tc.log)
	c, err := New(opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	tc.Controller = c
	return tc
}

// run runs the controller's monitor until the test ends.
func (tc *testController) run(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tc.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

// metric is the value of one series of the controller's metrics, 0 when it
// does not exist.
func (tc *testController) metric(t testing.TB, name string, labels testsupport.Labels) float64 {
	t.Helper()
	v, _ := testsupport.MetricValue(t, tc.reg, name, labels)
	return v
}

func (tc *testController) shed(t testing.TB, reason string) float64 {
	t.Helper()
	return tc.metric(t, "scafo_edge_shed_total", testsupport.Labels{"reason": reason})
}

// app returns the load of the named application, the zero AppLoad when the
// controller does not know it.
func (tc *testController) app(name string) AppLoad {
	for _, a := range tc.Snapshot().Apps {
		if a.Application == name {
			return a
		}
	}
	return AppLoad{}
}

// request is a request as the edge's handler sees it, from remote.
func request(remote string, xff ...string) *http.Request {
	r := httptest.NewRequest("GET", "http://app.example/", nil)
	r.RemoteAddr = remote
	for _, v := range xff {
		r.Header.Add("X-Forwarded-For", v)
	}
	return r
}

// admitted is what one Admit returned.
type admitted struct {
	ticket Ticket
	why    Refusal
}

// admitAsync calls Admit on a goroutine of its own and returns where its
// result arrives; the test must receive it.
func admitAsync(c *Controller, r *http.Request, app string) <-chan admitted {
	ch := make(chan admitted, 1)
	go func() {
		k, why := c.Admit(r, app)
		ch <- admitted{k, why}
	}()
	return ch
}

// receive waits for an Admit started by admitAsync.
func receive(t testing.TB, ch <-chan admitted, what string) admitted {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: Admit did not return within 10s", what)
		return admitted{}
	}
}

// returnedNow reports whether an Admit started by admitAsync has returned,
// without waiting: a test asserts that a request only granted once it frees
// a slot has not been.
func returnedNow(ch <-chan admitted) (admitted, bool) {
	select {
	case a := <-ch:
		return a, true
	default:
		return admitted{}, false
	}
}

// probe is a request whose context is already cancelled: Admit takes a slot
// for it if one is free now and refuses it RefusedCanceled rather than
// queue it, so it asks "would this request have to wait?" without waiting.
func probe(remote string) *http.Request {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return request(remote).WithContext(ctx)
}

// acceptLoop accepts on ln until it is closed, handing over every
// connection; the test's cleanup closes ln, waits for the loop to end and
// closes the connections it accepted.
func acceptLoop(t testing.TB, ln net.Listener) <-chan net.Conn {
	t.Helper()
	ch := make(chan net.Conn, 256)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			ch <- conn
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for {
			select {
			case c := <-ch:
				c.Close()
			default:
				return
			}
		}
	})
	return ch
}

// accepted waits for the accept loop's next connection.
func accepted(t testing.TB, ch <-chan net.Conn, what string) net.Conn {
	t.Helper()
	select {
	case c := <-ch:
		return c
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not accepted within 10s", what)
		return nil
	}
}

// listen listens on a loopback port; the test's cleanup closes it.
func listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// dialFrom connects to addr from the loopback address from (127.0.0.2, say:
// another client address on the same box); the test's cleanup closes it.
func dialFrom(t testing.TB, from, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, from, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// closedByPeer reports whether the peer closed conn: a read ends with the
// end of the stream or a reset, within 10s, rather than data or a timeout.
func closedByPeer(conn net.Conn) error {
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer conn.SetReadDeadline(time.Time{})
	var b [1]byte
	n, err := conn.Read(b[:])
	switch {
	case n > 0:
		return fmt.Errorf("read %q, want the end of the stream", b[:n])
	case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
		return nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return errors.New("still open after 10s")
	}
	return fmt.Errorf("read: %v, want the end of the stream", err)
}

// h1Client is a raw HTTP/1.1 keep-alive connection: the test decides which
// connection each request goes on, and sees when the server closes it.
type h1Client struct {
	conn net.Conn
	br   *bufio.Reader
}

func dialH1(t testing.TB, addr string) *h1Client {
	t.Helper()
	conn := dialFrom(t, "127.0.0.1", addr)
	return &h1Client{conn: conn, br: bufio.NewReader(conn)}
}

// get sends a request for path and reads its response to its end.
func (h *h1Client) get(path string) (string, error) {
	h.conn.SetDeadline(time.Now().Add(10 * time.Second))
	defer h.conn.SetDeadline(time.Time{})
	if _, err := fmt.Fprintf(h.conn, "GET %s HTTP/1.1\r\nHost: app.example\r\n\r\n", path); err != nil {
		return "", err
	}
	return h.read()
}

// send writes a request for path without reading its response.
func (h *h1Client) send(path string) error {
	_, err := fmt.Fprintf(h.conn, "GET %s HTTP/1.1\r\nHost: app.example\r\n\r\n", path)
	return err
}

// read reads one response to its end.
func (h *h1Client) read() (string, error) {
	h.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer h.conn.SetReadDeadline(time.Time{})
	resp, err := http.ReadResponse(h.br, nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("status %d", resp.StatusCode)
	}
	return string(b), nil
}

// gate blocks the requests of a handler until the test opens it; the
// test's cleanup opens it in any case, so that no handler outlives it.
type gate struct {
	entered chan struct{}
	open    chan struct{}
	once    sync.Once
}

func newGate(t testing.TB) *gate {
	g := &gate{entered: make(chan struct{}, 64), open: make(chan struct{})}
	t.Cleanup(g.release)
	return g
}

func (g *gate) release() { g.once.Do(func() { close(g.open) }) }

// handler answers "ok" at once, and at /block once the gate opens.
func (g *gate) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/block" {
			g.entered <- struct{}{}
			<-g.open
		}
		fmt.Fprint(w, "ok")
	})
}

// serveOn serves h over plain HTTP on ln, a listener of c's, with c's
// ConnState hook, until the test ends.
func serveOn(t testing.TB, c *Controller, ln net.Listener, h http.Handler) {
	t.Helper()
	srv := &http.Server{Handler: h, ConnState: c.ConnState, ErrorLog: log.New(io.Discard, "", 0)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
}

// serve serves h on ln counted by c, with c's ConnState hook, over TLS (and
// so HTTP/2) when cert is not nil, until the test ends.
func serve(t testing.TB, c *Controller, ln net.Listener, h http.Handler, cert *tls.Certificate) {
	t.Helper()
	if cert == nil {
		serveOn(t, c, c.Listener(ln), h)
		return
	}
	// Its error log would only say that connections the tests closed or
	// that never finished a handshake ended.
	srv := &http.Server{Handler: h, ConnState: c.ConnState, ErrorLog: log.New(io.Discard, "", 0)}
	srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{*cert}, NextProtos: []string{"h2", "http/1.1"}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.ServeTLS(c.Listener(ln), "", "")
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
}

// trackUpstream counts conn as a connection c dialled to an upstream.
func trackUpstream(t testing.TB, c *Controller, conn net.Conn) net.Conn {
	t.Helper()
	tracked, err := c.DialUpstream(func() (net.Conn, error) { return conn, nil })
	if err != nil {
		t.Fatalf("DialUpstream: %v", err)
	}
	return tracked
}
