package admission

import (
	"bufio"
	"crypto/tls"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/testsupport"
)

// edgeReader reads the edge's side of a connection as a server would, each
// read's byte count going to reads as it returns; reads is closed at the
// first error.
type edgeReader struct {
	reads chan int
}

func startReader(conn net.Conn, bufSize int) *edgeReader {
	r := &edgeReader{reads: make(chan int, 1024)}
	go func() {
		defer close(r.reads)
		buf := make([]byte, bufSize)
		for {
			n, err := conn.Read(buf)
			if n > 0 {
				r.reads <- n
			}
			if err != nil {
				return
			}
		}
	}()
	return r
}

// receive waits for the edge to have read n bytes.
func (r *edgeReader) receive(t *testing.T, n int, what string) {
	t.Helper()
	for got := 0; got < n; {
		select {
		case m, ok := <-r.reads:
			if !ok {
				t.Fatalf("%s: the connection ended after %d of %d bytes", what, got, n)
			}
			got += m
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the edge read %d of %d bytes in 10s", what, got, n)
		}
	}
}

// readNow reports a read that has returned, if any.
func (r *edgeReader) readNow() (int, bool) {
	select {
	case n, ok := <-r.reads:
		return n, ok
	default:
		return 0, false
	}
}

// pacedConn accepts a connection through a controller on a fake clock whose
// monitor does not run, so that the clock's only timers are pacing's; the
// edge's side is read with a buffer of bufSize.
func pacedConn(t *testing.T, bufSize int) (tc *testController, clk *clock.Fake, client, server net.Conn, r *edgeReader) {
	t.Helper()
	clk = newFakeClock()
	tc = newController(t, Options{Limits: testLimits(100), Clock: clk})
	ln := listen(t)
	ch := acceptLoop(t, tc.Listener(ln))
	client = dialFrom(t, "127.0.0.1", ln.Addr().String())
	server = accepted(t, ch, "the client's connection")
	t.Cleanup(func() { server.Close() })
	return tc, clk, client, server, startReader(server, bufSize)
}

// trickle sends b and waits for the edge to read it, so that each call is
// at least one read of its own.
func trickle(t *testing.T, client net.Conn, r *edgeReader, b string) {
	t.Helper()
	if _, err := io.WriteString(client, b); err != nil {
		t.Fatalf("send %q: %v", b, err)
	}
	r.receive(t, len(b), "send "+b)
}

func (tc *testController) pacedConns(t *testing.T) float64 {
	t.Helper()
	return tc.metric(t, "scafo_edge_paced_conns_total", nil)
}

func TestAFirstRequestThatTricklesInIsReadOnceASecond(t *testing.T) {
	t.Parallel()
	tc, clk, client, _, r := pacedConn(t, 4096)
	trickle(t, client, r, slowHeaders)
	for range trickleReads - 1 {
		trickle(t, client, r, "a")
	}
	if got := tc.pacedConns(t); got != 1 {
		t.Fatalf("scafo_edge_paced_conns_total = %v after %d short reads, want 1", got, trickleReads)
	}
	for i := range 3 {
		if _, err := io.WriteString(client, "b"); err != nil {
			t.Fatal(err)
		}
		testsupport.WaitFor(t, 10*time.Second, "the read to wait for its turn", func() bool { return clk.Waiting() == 1 })
		if n, ok := r.readNow(); ok {
			t.Fatalf("byte %d: read %d bytes before its turn", i, n)
		}
		clk.Advance(paceEvery - time.Millisecond)
		if n, ok := r.readNow(); ok {
			t.Fatalf("byte %d: read %d bytes %v after the last read, before its turn", i, n, paceEvery-time.Millisecond)
		}
		clk.Advance(paceJitter + time.Millisecond)
		r.receive(t, 1, "a paced byte, once its turn came")
	}
	if got := tc.pacedConns(t); got != 1 {
		t.Errorf("scafo_edge_paced_conns_total = %v, want 1: a connection is counted once", got)
	}
}

// A visitor's first request comes in full segments and one short last one,
// after a TLS handshake's short reads or a PROXY header's: it is read the
// moment it arrives, however long the connection waited for it.
func TestAVisitorsFirstRequestIsNeverPaced(t *testing.T) {
	t.Parallel()
	const segment = 1448
	for _, tt := range []struct {
		name    string
		bufSize int
		sends   []int
		wait    time.Duration // the clock moves this much after the first two sends
	}{
		{"a TLS handshake, then a large request", 4096, []int{300, 64, segment, segment, segment, 700}, 0},
		{"a preconnect: a handshake, and a request half a minute later", 4096, []int{300, 64, segment, segment, 200}, 30 * time.Second},
		{"a PROXY header, a handshake and a short request", 4096, []int{56, 300, 64, 400}, 0},
		{"short reads one fewer than pacing takes, then full ones", 4096, []int{100, 100, 100, 100, 100, segment, segment, segment}, 5 * time.Second},
		{"reads as short as a nearly full buffer offers", 300, []int{1200, 1200, 1200, 1200, 1200, 1200, 1200}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tc, clk, client, _, r := pacedConn(t, tt.bufSize)
			for i, n := range tt.sends {
				if i == 2 {
					clk.Advance(tt.wait)
				}
				trickle(t, client, r, strings.Repeat("x", n))
			}
			if n := clk.Waiting(); n != 0 {
				t.Errorf("%d reads wait for a turn, want none", n)
			}
			if got := tc.pacedConns(t); got != 0 {
				t.Errorf("scafo_edge_paced_conns_total = %v, want 0", got)
			}
		})
	}
}

func TestAPacedConnectionIsReadAtOnceWhenItsRequestBegins(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	tc := newController(t, Options{Limits: testLimits(100), Clock: clk})
	ln := listen(t)
	ch := acceptLoop(t, tc.Listener(ln))
	client := dialFrom(t, "127.0.0.1", ln.Addr().String())
	server := accepted(t, ch, "the client's connection")
	t.Cleanup(func() { server.Close() })
	tc.ConnState(server, http.StateNew)
	// Read here, one read a byte, as a server reads a request: the last
	// read returns before the request's headers are reported in.
	buf := make([]byte, 4096)
	for range trickleReads {
		if _, err := io.WriteString(client, "a"); err != nil {
			t.Fatal(err)
		}
		server.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := server.Read(buf); err != nil {
			t.Fatalf("a read before pacing: %v", err)
		}
	}
	if got := tc.pacedConns(t); got != 1 {
		t.Fatalf("scafo_edge_paced_conns_total = %v, want 1", got)
	}
	// Its server reports the request's headers in: the connection is
	// active, then idle between requests, and its reads are its own again.
	tc.ConnState(server, http.StateActive)
	tc.ConnState(server, http.StateIdle)
	server.SetReadDeadline(time.Time{})
	r := startReader(server, 4096)
	for range trickleReads + 2 {
		trickle(t, client, r, "b")
	}
	if n := clk.Waiting(); n != 0 {
		t.Errorf("%d reads wait for a turn after the first request, want none", n)
	}
}

func TestClosingAPacedConnectionEndsTheReadWaitingForItsTurn(t *testing.T) {
	t.Parallel()
	tc, clk, client, server, r := pacedConn(t, 4096)
	for range trickleReads {
		trickle(t, client, r, "a")
	}
	testsupport.WaitFor(t, 10*time.Second, "the next read to wait for its turn", func() bool { return clk.Waiting() == 1 })
	// Closed as shedding closes one, from another goroutine: the
	// descriptor is given back at once, and the reader is not left
	// waiting a second on the clock (which does not move here).
	server.Close()
	select {
	case _, ok := <-r.reads:
		if ok {
			t.Fatal("a paced read returned bytes after its connection was closed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a paced read still waits 10s after its connection was closed")
	}
	if n := tc.Snapshot().ClientConns; n != 0 {
		t.Errorf("client connections = %d after the close, want 0", n)
	}
}

// readCounter sits between the edge's listener and its server and hands
// over each connection it accepts with a count of the bytes the server has
// read from it, so that a test can send a request in pieces the server
// reads one at a time.
type readCounter struct {
	net.Listener
	accepted chan *countedConn
}

func (l *readCounter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	cc := &countedConn{Conn: c}
	l.accepted <- cc
	return cc, nil
}

type countedConn struct {
	net.Conn
	read atomic.Int64
}

func (c *countedConn) NetConn() net.Conn { return c.Conn }

func (c *countedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// countedClient is a client's connection over TLS, and how many bytes it
// has written and the server has read.
type countedClient struct {
	*tls.Conn
	written atomic.Int64
	server  *countedConn
}

type writeCounter struct {
	net.Conn
	c *countedClient
}

func (w writeCounter) Write(p []byte) (int, error) {
	n, err := w.Conn.Write(p)
	w.c.written.Add(int64(n))
	return n, err
}

// send sends b and waits for the server to have read every byte written
// so far.
func (c *countedClient) send(t *testing.T, b string) {
	t.Helper()
	if _, err := io.WriteString(c, b); err != nil {
		t.Fatalf("send %q: %v", b, err)
	}
	c.waitRead(t, "the server to read "+b)
}

func (c *countedClient) waitRead(t *testing.T, what string) {
	t.Helper()
	testsupport.WaitFor(t, 10*time.Second, what, func() bool { return c.server.read.Load() == c.written.Load() })
}

// answer reads the response to the request c sends.
func (c *countedClient) answer() <-chan error {
	got := make(chan error, 1)
	go func() {
		h := &h1Client{conn: c, br: bufio.NewReader(c)}
		_, err := h.read()
		got <- err
	}()
	return got
}

// pacingServer serves "ok" over TLS through a controller on a fake clock,
// its monitor running; dial opens a connection from a loopback address
// and completes its handshake.
func pacingServer(t *testing.T) (tc *testController, clk *clock.Fake, dial func(from string) *countedClient) {
	t.Helper()
	clk = newFakeClock()
	tc = newController(t, Options{Limits: testLimits(100), Clock: clk})
	tc.run(t)
	cert, roots := testsupport.SelfSigned(t)
	ln := listen(t)
	counted := &readCounter{Listener: tc.Listener(ln), accepted: make(chan *countedConn, 16)}
	srv := &http.Server{Handler: newGate(t).handler(), ConnState: tc.ConnState, ErrorLog: log.New(io.Discard, "", 0),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.ServeTLS(counted, "", "")
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return tc, clk, func(from string) *countedClient {
		c := &countedClient{}
		c.Conn = tls.Client(writeCounter{Conn: dialFrom(t, from, ln.Addr().String()), c: c},
			&tls.Config{RootCAs: roots, ServerName: "localhost", NextProtos: []string{"http/1.1"}})
		select {
		case c.server = <-counted.accepted:
		case <-time.After(10 * time.Second):
			t.Fatalf("a connection from %s: not accepted in 10s", from)
		}
		if err := c.Handshake(); err != nil {
			t.Fatalf("handshake from %s: %v", from, err)
		}
		c.waitRead(t, "the server to read the handshake")
		return c
	}
}

// awaitAnswer waits for got, moving clk by step (if not zero) while it
// waits.
func awaitAnswer(t *testing.T, got <-chan error, clk *clock.Fake, step time.Duration, what string) {
	t.Helper()
	var err error
	testsupport.WaitFor(t, 10*time.Second, what, func() bool {
		select {
		case err = <-got:
			return true
		default:
			clk.Advance(step)
			return false
		}
	})
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// Through crypto/tls and net/http: a connection opened ahead of need,
// whose request comes half a minute after its handshake, is read and
// answered at once; a request whose headers trickle in after the
// handshake is read in turns and answered once they are in.
func TestOverTLSAPreconnectedRequestIsServedAtOnceAndATricklingOneInTurns(t *testing.T) {
	t.Parallel()
	tc, clk, dial := pacingServer(t)

	pre := dial("127.0.0.2")
	clk.Advance(30 * time.Second)
	req := "GET / HTTP/1.1\r\nHost: app.example\r\nCookie: " + strings.Repeat("c", 3000) + "\r\n"
	pre.send(t, req[:1400])
	pre.send(t, req[1400:])
	got := pre.answer()
	if _, err := io.WriteString(pre, "\r\n"); err != nil {
		t.Fatal(err)
	}
	awaitAnswer(t, got, clk, 0, "the preconnected connection's request, the clock standing still")
	if got := tc.pacedConns(t); got != 0 {
		t.Fatalf("scafo_edge_paced_conns_total = %v after the preconnected request, want 0", got)
	}

	slow := dial("127.0.0.3")
	slow.send(t, "GET / HTTP/1.1\r\nHost: app.example\r\nX-Slow: ")
	// The handshake's short reads count: a byte at a time until the
	// connection is paced, within trickleReads of them.
	for i := 0; tc.pacedConns(t) == 0; i++ {
		if i == trickleReads {
			t.Fatalf("scafo_edge_paced_conns_total = 0 after %d short reads of a request, want 1", i+1)
		}
		slow.send(t, "a")
	}
	got = slow.answer()
	if _, err := io.WriteString(slow, "\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	awaitAnswer(t, got, clk, paceEvery+paceJitter, "the trickled request, the clock moving a turn at a time")
}
