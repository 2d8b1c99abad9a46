package admission

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"runtime"
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

// acceptedConn accepts a connection through a controller on a fake clock
// whose monitor does not run, so that the clock's only timers are
// pacing's.
func acceptedConn(t *testing.T) (tc *testController, clk *clock.Fake, client, server net.Conn) {
	t.Helper()
	clk = newFakeClock()
	tc = newController(t, Options{Limits: testLimits(100), Clock: clk})
	ln := listen(t)
	ch := acceptLoop(t, tc.Listener(ln))
	client = dialFrom(t, "127.0.0.1", ln.Addr().String())
	server = accepted(t, ch, "the client's connection")
	t.Cleanup(func() { server.Close() })
	return tc, clk, client, server
}

// pacedConn is acceptedConn with the edge's side read as it arrives, with a
// buffer of bufSize.
func pacedConn(t *testing.T, bufSize int) (tc *testController, clk *clock.Fake, client, server net.Conn, r *edgeReader) {
	t.Helper()
	tc, clk, client, server = acceptedConn(t)
	// Heads are paced only while the box is contended.
	tc.contended.Store(true)
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

func (tc *testController) pacedHeads(t *testing.T) float64 {
	t.Helper()
	return tc.metric(t, "scafo_edge_paced_heads_total", nil)
}

// A head that trickles in is read in turns, each twice as far from the one
// before as the last, up to paceEvery<<paceDoublings: a turn's timer is
// armed a millisecond before it, and the byte waiting is read once it
// comes.
func TestATricklingHeadIsReadLessOftenTheLongerItTrickles(t *testing.T) {
	t.Parallel()
	tc, clk, client, _, r := pacedConn(t, 4096)
	trickle(t, client, r, slowHeaders)
	for range trickleReads - 1 {
		trickle(t, client, r, "a")
	}
	if got := tc.pacedHeads(t); got != 1 {
		t.Fatalf("scafo_edge_paced_heads_total = %v after %d short reads, want 1", got, trickleReads)
	}
	for i := range paceDoublings + 2 {
		every := paceEvery << min(i, paceDoublings)
		if _, err := io.WriteString(client, "b"); err != nil {
			t.Fatal(err)
		}
		testsupport.WaitFor(t, 10*time.Second, "the read to wait for its turn", func() bool { return clk.Waiting() == 1 })
		if n, ok := r.readNow(); ok {
			t.Fatalf("turn %d: read %d bytes before its turn", i, n)
		}
		clk.Advance(every - time.Millisecond)
		// The same timer still armed: the read has not had its turn.
		if d, ok := clk.Next(); !ok || d > every/2+time.Millisecond {
			t.Fatalf("turn %d: %v after the last read the turn's timer is not armed (next in %v, %v)", i, every-time.Millisecond, d, ok)
		}
		if n, ok := r.readNow(); ok {
			t.Fatalf("turn %d: read %d bytes %v after the last read, before its turn", i, n, every-time.Millisecond)
		}
		clk.Advance(every/2 + time.Millisecond)
		r.receive(t, 1, "a paced byte, once its turn came")
	}
	if got := tc.pacedHeads(t); got != 1 {
		t.Errorf("scafo_edge_paced_heads_total = %v, want 1: a head is counted once", got)
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
			if got := tc.pacedHeads(t); got != 0 {
				t.Errorf("scafo_edge_paced_heads_total = %v, want 0", got)
			}
		})
	}
}

// syncConn is a connection accepted through a controller on a fake clock
// (its monitor not running), its edge side read by the test itself, one
// read at a time, as a server reads a request head: the server reports the
// head in after the read that ends it returns.
func syncConn(t *testing.T) (tc *testController, clk *clock.Fake, client, server net.Conn) {
	t.Helper()
	tc, clk, client, server = acceptedConn(t)
	tc.contended.Store(true) // heads are paced only under contention
	tc.ConnState(server, http.StateNew)
	clk.Advance(slowAge) // the head has been on its way long enough to be paced
	return tc, clk, client, server
}

// pacedSyncConn is syncConn with its head's trickleReads short reads made,
// of quietFrom bytes each: its next read waits its turn, and holds the
// poller's wake-ups meanwhile.
func pacedSyncConn(t *testing.T) (tc *testController, clk *clock.Fake, client, server net.Conn) {
	t.Helper()
	tc, clk, client, server = syncConn(t)
	for range trickleReads {
		readOne(t, client, server, strings.Repeat("a", quietFrom))
	}
	return tc, clk, client, server
}

// readingInIOWait reports whether a read of conn is parked in the poller,
// waiting for its socket to be readable.
func readingInIOWait(conn net.Conn) bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	read := fmt.Sprintf("(*trackedConn).Read(%p", conn)
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, " [IO wait") && strings.Contains(g, read) {
			return true
		}
	}
	return false
}

// readParked starts a read of server, waits until it is parked in the
// poller, and sends b, which must wake it: a read that is not paced is
// woken by the first byte.
func readParked(t *testing.T, client, server net.Conn, b string) {
	t.Helper()
	got := make(chan int, 1)
	go func() {
		n, _ := server.Read(make([]byte, 4096))
		got <- n
	}()
	testsupport.WaitFor(t, 10*time.Second, "the read to wait for bytes", func() bool { return readingInIOWait(server) })
	if _, err := io.WriteString(client, b); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-got:
		if n == 0 {
			t.Fatalf("read %q: the connection ended", b)
		}
	case <-time.After(10 * time.Second):
		server.Close()
		<-got
		t.Fatalf("%q sent to a parked read did not wake it in 10s", b)
	}
}

// readOne sends b and reads it on the edge's side in one read, failing if
// that read waits for its turn (the clock does not move).
func readOne(t *testing.T, client, server net.Conn, b string) {
	t.Helper()
	if _, err := io.WriteString(client, b); err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	go func() {
		buf := make([]byte, 4096)
		n, err := server.Read(buf)
		if err == nil && n != len(b) {
			err = fmt.Errorf("read %d bytes of %d", n, len(b))
		}
		got <- err
	}()
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("read %q: %v", b, err)
		}
	case <-time.After(10 * time.Second):
		server.Close() // ends the read
		<-got
		t.Fatalf("read %q: it waited for a turn, the clock standing still", b)
	}
}

// Between requests, an HTTP/1 connection's next request head is counted
// afresh: a visitor's short keep-alive requests never add up to pacing,
// and a head that trickles is paced as a first one is.
func TestEachRequestHeadIsCountedAfresh(t *testing.T) {
	t.Parallel()
	tc, clk, client, server := syncConn(t)
	for range trickleReads {
		readOne(t, client, server, "a")
	}
	if got := tc.pacedHeads(t); got != 1 {
		t.Fatalf("scafo_edge_paced_heads_total = %v after the first head's %d short reads, want 1", got, trickleReads)
	}
	// The first head is in: its server turns the connection active, then
	// idle. Keep-alive requests of a short read each are not paced.
	for range 3 * trickleReads {
		tc.ConnState(server, http.StateActive)
		tc.ConnState(server, http.StateIdle)
		readOne(t, client, server, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	}
	// A head that trickles is, once it has come in trickleReads short reads.
	trickleNextHead(t, tc, clk, client, server, 2)
	waitsItsTurn(t, clk, client, server)
}

// waitsItsTurn checks that server's next read waits for its turn: it
// returns once the connection is closed, not before.
func waitsItsTurn(t *testing.T, clk *clock.Fake, client, server net.Conn) {
	t.Helper()
	got := readInTurn(t, clk, client, server, "c")
	server.Close()
	<-got
}

// readInTurn sends b and starts a read of it on the edge's side, which it
// checks waits for its turn; the read's byte count comes on the channel.
func readInTurn(t *testing.T, clk *clock.Fake, client, server net.Conn, b string) <-chan int {
	t.Helper()
	if _, err := io.WriteString(client, b); err != nil {
		t.Fatal(err)
	}
	got := make(chan int, 1)
	go func() {
		n, _ := server.Read(make([]byte, 4096))
		got <- n
	}()
	testsupport.WaitFor(t, 10*time.Second, "the read to wait for its turn", func() bool { return clk.Waiting() == 1 })
	select {
	case n := <-got:
		t.Fatalf("read %d bytes before its turn", n)
	default:
	}
	return got
}

// A read whose turn falls after the connection's read deadline is made a
// little before the deadline: a byte that came in time is read, and with
// none the read fails at the deadline, as an unpaced read would have.
func TestAPacedReadEndsAtItsDeadline(t *testing.T) {
	t.Parallel()
	for _, waiting := range []string{"", "c"} {
		tc, _, client, server := pacedSyncConn(t)
		if _, err := io.WriteString(client, waiting); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(2 * paceDeadlineLead)
		server.SetReadDeadline(deadline)
		type result struct {
			n   int
			err error
			at  time.Time
		}
		got := make(chan result, 1)
		go func() {
			n, err := server.Read(make([]byte, 16))
			got <- result{n, err, time.Now()}
		}()
		var r result
		select {
		case r = <-got:
		case <-time.After(10 * time.Second):
			server.Close()
			<-got
			t.Fatalf("%d bytes waiting: the read waited for its turn past its deadline, the clock standing still", len(waiting))
		}
		if waiting == "" {
			if !errors.Is(r.err, os.ErrDeadlineExceeded) {
				t.Fatalf("nothing waiting: the read at its deadline: %d bytes, %v, want a timeout", r.n, r.err)
			}
			continue
		}
		if r.n != len(waiting) || r.err != nil {
			t.Fatalf("%q waiting: the read before its deadline: %d bytes, %v, want %d", waiting, r.n, r.err, len(waiting))
		}
		if !r.at.Before(deadline) {
			t.Fatalf("%q waiting: read %v after its deadline", waiting, r.at.Sub(deadline))
		}
		// That read ended the head: a short body after it wakes a read.
		tc.ConnState(server, http.StateActive)
		server.SetReadDeadline(time.Time{})
		readParked(t, client, server, "body")
	}
}

// A read that finds a backlog is followed by one at once, and a short one
// after it waits its turn again: a client sending faster than a trickle
// is read as it sends (so that the kernel holds little of it, and
// --max-header-bytes ends a head too large), and a burst buys no unpaced
// trickle.
func TestABacklogIsReadAsItComesAndBuysNoTrickle(t *testing.T) {
	t.Parallel()
	tc, clk, client, server := syncConn(t)
	for range trickleReads {
		readOne(t, client, server, "a")
	}
	if _, err := io.WriteString(client, strings.Repeat("x", trickleBytes)); err != nil {
		t.Fatal(err)
	}
	r := startReader(server, 4096)
	testsupport.WaitFor(t, 10*time.Second, "the read to wait for its turn", func() bool { return clk.Waiting() == 1 })
	clk.Advance(paceEvery * 3 / 2)
	r.receive(t, trickleBytes, "the backlog, at its turn")
	for range 3 {
		trickle(t, client, r, strings.Repeat("y", trickleBytes)) // read at once, the clock standing still
	}
	if _, err := io.WriteString(client, "d"); err != nil {
		t.Fatal(err)
	}
	r.receive(t, 1, "the short read after a backlog")
	if _, err := io.WriteString(client, "e"); err != nil {
		t.Fatal(err)
	}
	testsupport.WaitFor(t, 10*time.Second, "the read after a short one to wait for its turn", func() bool { return clk.Waiting() == 1 })
	if n, ok := r.readNow(); ok {
		t.Fatalf("read %d bytes before its turn", n)
	}
	// Its turn counts from paceEvery again: the backlog undid the turn
	// taken before it, which would have made this one twice as far.
	clk.Advance(paceEvery * 3 / 2)
	r.receive(t, 1, "the short read after a backlog, a first turn on")
	if got := tc.pacedHeads(t); got != 1 {
		t.Errorf("scafo_edge_paced_heads_total = %v, want 1", got)
	}
}

// takeTurn sends b and reads it on the edge's side in one read that waits
// its turn of every: its timer armed a millisecond before, b read once
// every and its jitter have passed.
func takeTurn(t *testing.T, clk *clock.Fake, client, server net.Conn, b string, every time.Duration) {
	t.Helper()
	got := readInTurn(t, clk, client, server, b)
	clk.Advance(every - time.Millisecond)
	if d, ok := clk.Next(); !ok || d > every/2+time.Millisecond {
		t.Fatalf("a turn of %v: %v on, its timer is not armed (next in %v, %v)", every, every-time.Millisecond, d, ok)
	}
	clk.Advance(every/2 + time.Millisecond)
	select {
	case n := <-got:
		if n != len(b) {
			t.Fatalf("a turn of %v: read %d bytes, want %d", every, n, len(b))
		}
	case <-time.After(10 * time.Second):
		server.Close()
		<-got
		t.Fatalf("a turn of %v: not read %v on", every, every*3/2)
	}
}

// A backlog found at the longest turn, and the next head of a keep-alive
// connection, start the turns from paceEvery again.
func TestTurnsStartFromASecondAfterABacklogAndForEachHead(t *testing.T) {
	t.Parallel()
	tc, clk, client, server := pacedSyncConn(t)
	for i := range paceDoublings {
		takeTurn(t, clk, client, server, "b", paceEvery<<i)
	}
	takeTurn(t, clk, client, server, strings.Repeat("x", trickleBytes), paceEvery<<paceDoublings) // a backlog
	readOne(t, client, server, "c")                                                               // at once, after it
	takeTurn(t, clk, client, server, "d", paceEvery)
	takeTurn(t, clk, client, server, "e", 2*paceEvery)

	trickleNextHead(t, tc, clk, client, server, 2)
	takeTurn(t, clk, client, server, "g", paceEvery)
}

// trickleNextHead ends server's request and sends the next head a byte a
// read, trickleReads of them, slowAge after the last request: it is
// paced, the wantPaced'th head so.
func trickleNextHead(t *testing.T, tc *testController, clk *clock.Fake, client, server net.Conn, wantPaced float64) {
	t.Helper()
	tc.ConnState(server, http.StateActive)
	tc.ConnState(server, http.StateIdle)
	clk.Advance(slowAge)
	for range trickleReads {
		readOne(t, client, server, "b")
	}
	if got := tc.pacedHeads(t); got != wantPaced {
		t.Fatalf("scafo_edge_paced_heads_total = %v after a trickling keep-alive head, want %v", got, wantPaced)
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
func pacingServer(t *testing.T) (tc *testController, clk *clock.Fake, dial func(from, proto string) *countedClient) {
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
	return tc, clk, func(from, proto string) *countedClient {
		c := &countedClient{}
		c.Conn = tls.Client(writeCounter{Conn: dialFrom(t, from, ln.Addr().String()), c: c},
			&tls.Config{RootCAs: roots, ServerName: "localhost", NextProtos: []string{proto}})
		select {
		case c.server = <-counted.accepted:
		case <-time.After(10 * time.Second):
			t.Fatalf("a connection from %s: not accepted in 10s", from)
		}
		if err := c.Handshake(); err != nil {
			t.Fatalf("handshake from %s: %v", from, err)
		}
		if got := c.ConnectionState().NegotiatedProtocol; got != proto {
			t.Fatalf("handshake from %s: protocol %q, want %q", from, got, proto)
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
	tc.contended.Store(true) // heads are paced only under contention

	pre := dial("127.0.0.2", "http/1.1")
	clk.Advance(30 * time.Second)
	req := "GET / HTTP/1.1\r\nHost: app.example\r\nCookie: " + strings.Repeat("c", 3000) + "\r\n"
	pre.send(t, req[:1400])
	pre.send(t, req[1400:])
	got := pre.answer()
	if _, err := io.WriteString(pre, "\r\n"); err != nil {
		t.Fatal(err)
	}
	awaitAnswer(t, got, clk, 0, "the preconnected connection's request, the clock standing still")
	if got := tc.pacedHeads(t); got != 0 {
		t.Fatalf("scafo_edge_paced_heads_total = %v after the preconnected request, want 0", got)
	}

	slow := dial("127.0.0.3", "http/1.1")
	clk.Advance(slowAge)
	slow.send(t, "GET / HTTP/1.1\r\nHost: app.example\r\nX-Slow: ")
	// The handshake's short reads count: a byte at a time until the
	// connection is paced, within trickleReads of them.
	for i := 0; tc.pacedHeads(t) == 0; i++ {
		if i == trickleReads {
			t.Fatalf("scafo_edge_paced_heads_total = 0 after %d short reads of a request, want 1", i+1)
		}
		slow.send(t, "a")
	}
	got = slow.answer()
	if _, err := io.WriteString(slow, "\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	awaitAnswer(t, got, clk, paceEvery*3/2, "the trickled request, the clock moving a turn at a time")
}

// HTTP/2 frames are often short (a WINDOW_UPDATE, a PING), and the HTTP/2
// server bounds a connection's work itself: once its preface is in, its
// reads are never paced.
func TestHTTP2ConnectionsAreNotPaced(t *testing.T) {
	t.Parallel()
	tc, _, dial := pacingServer(t)
	c := dial("127.0.0.2", "h2")
	// The preface and an empty SETTINGS at once, as clients send them.
	c.send(t, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"+"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
	ping := "\x00\x00\x08\x06\x00\x00\x00\x00\x00" + "12345678"
	for range 3 {
		for i := range len(ping) {
			c.send(t, ping[i:i+1]) // a TLS record each, read each: the clock never moves
		}
	}
	if got := tc.pacedHeads(t); got != 0 {
		t.Errorf("scafo_edge_paced_heads_total = %v, want 0", got)
	}
}

// A head is paced only once it has been on its way slowAge: a client that
// trickles a few bytes and goes would otherwise leave its connection
// waiting a turn, counted against the budget, after it went.
func TestAHeadIsPacedOnlyAfterItsFirstSecond(t *testing.T) {
	t.Parallel()
	tc, clk, client, server := acceptedConn(t)
	tc.contended.Store(true) // heads are paced only under contention
	tc.ConnState(server, http.StateNew)
	for range 2 * trickleReads {
		readOne(t, client, server, "a") // the clock standing still: never waits
	}
	if got := tc.pacedHeads(t); got != 0 {
		t.Fatalf("scafo_edge_paced_heads_total = %v within the head's first second, want 0", got)
	}
	clk.Advance(slowAge)
	readOne(t, client, server, "a")
	if got := tc.pacedHeads(t); got != 1 {
		t.Fatalf("scafo_edge_paced_heads_total = %v once the head was on its way %v, want 1", got, slowAge)
	}
	waitsItsTurn(t, clk, client, server)
}

// Nobody short of anything: a head that keeps trickling into the server is
// read as it comes, however long it trickles, as net/http would read it
// (issue 46); the first short read under contention paces it.
func TestATricklingHeadIsPacedOnlyUnderContention(t *testing.T) {
	t.Parallel()
	tc, clk, client, server := acceptedConn(t)
	tc.ConnState(server, http.StateNew)
	clk.Advance(slowAge)
	for range 4 * trickleReads {
		readOne(t, client, server, "a") // at once: no turn, no clock moved
	}
	if got := tc.pacedHeads(t); got != 0 {
		t.Fatalf("scafo_edge_paced_heads_total = %v with the box not contended, want 0", got)
	}
	tc.contended.Store(true)
	readOne(t, client, server, "a")
	if got := tc.pacedHeads(t); got != 1 {
		t.Fatalf("scafo_edge_paced_heads_total = %v after a short read under contention, want 1", got)
	}
	if _, err := io.WriteString(client, "b"); err != nil {
		t.Fatal(err)
	}
	read := make(chan error, 1)
	go func() {
		_, err := server.Read(make([]byte, 64))
		read <- err
	}()
	testsupport.WaitFor(t, 10*time.Second, "the read to wait for its turn", func() bool { return clk.Waiting() == 1 })
	clk.Advance(paceEvery * 3 / 2)
	select {
	case err := <-read:
		if err != nil {
			t.Fatalf("the paced read: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the paced read did not end at its turn")
	}
}
