//go:build linux

package admission

import (
	"bufio"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pires/go-proxyproto"

	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/testsupport"
)

// plainServer serves "ok" on a plain listener counted by a controller on a
// fake clock (its monitor not running), with a header timeout of
// headTimeout; news counts the connections its server was given.
type plainServer struct {
	tc   *testController
	clk  *clock.Fake
	addr string
	ln   net.Listener // the controller's
	news atomic.Int64
}

const testHeadTimeout = 10 * time.Second

func servePlain(t *testing.T, l Limits) *plainServer {
	t.Helper()
	return servePlainFor(t, l, testHeadTimeout)
}

func servePlainFor(t *testing.T, l Limits, headTimeout time.Duration) *plainServer {
	t.Helper()
	return servePlainWith(t, l, headTimeout, false)
}

// servePlainWith is servePlainFor; with proxied, a PROXY protocol header
// may come first, and the server's listener reads it as the edge's does.
func servePlainWith(t *testing.T, l Limits, headTimeout time.Duration, proxied bool) *plainServer {
	t.Helper()
	ps := &plainServer{clk: newFakeClock()}
	ps.tc = newController(t, Options{Limits: l, Clock: ps.clk})
	raw := listen(t)
	ps.addr = raw.Addr().String()
	ps.ln = ps.tc.PlainListener(raw, headTimeout, proxied)
	if ps.ln.(*listener).heads == nil {
		t.Fatal("PlainListener awaits no heads on Linux")
	}
	served := ps.ln
	if proxied {
		served = &proxyproto.Listener{Listener: ps.ln, ReadHeaderTimeout: headTimeout}
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Remote", r.RemoteAddr)
			io.WriteString(w, "ok "+r.Header.Get("X-Slow"))
		}),
		MaxHeaderBytes:    1024,
		ReadHeaderTimeout: time.Hour,
		ErrorLog:          log.New(io.Discard, "", 0),
		ConnState: func(c net.Conn, st http.ConnState) {
			if st == http.StateNew {
				ps.news.Add(1)
			}
			ps.tc.ConnState(c, st)
		},
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(served)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return ps
}

func (ps *plainServer) waiting(t *testing.T) float64 {
	t.Helper()
	return ps.tc.metric(t, "scafo_edge_waiting_heads", nil)
}

func (ps *plainServer) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testsupport.WaitFor(t, 10*time.Second, what, cond)
}

// startHead opens a connection from from that sends the start of a head,
// and waits until it waits for the rest and is listed for shedding. The
// gauge counts it a moment before it is listed, so both are waited for.
func (ps *plainServer) startHead(t *testing.T, from, start string) net.Conn {
	t.Helper()
	before := ps.waiting(t)
	conn := dialFrom(t, from, ps.addr)
	if _, err := io.WriteString(conn, start); err != nil {
		t.Fatal(err)
	}
	ps.waitFor(t, "the head to wait", func() bool {
		return ps.waiting(t) == before+1 && ps.tc.arriving(conn)
	})
	return conn
}

// answer reads conn's answer: its status line and body.
func answer(conn net.Conn) (string, error) {
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.Status + ": " + string(b), err
}

// A first request head that has not ended when its connection is accepted
// waits for the rest outside the server, whatever way its lines end and
// whatever came before it; once it has ended, the server gets the
// connection and reads every byte of it.
func TestAFirstHeadWaitsOutsideTheServerUntilItEnds(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name          string
		start, pieces string
	}{
		{"CRLF", "GET / HTTP/1.1\r\nHost: a\r\nX-Slow: ", "a|b|c\r\n|\r\n"},
		{"LF", "GET / HTTP/1.1\nHost: a\nX-Slow: ", "ab|c\n|\n"},
		{"the blank line split", "GET / HTTP/1.1\r\nHost: a\r\nX-Slow: abc\r", "\n\r|\n"},
		{"nothing at the accept", "", "GET / HTTP/1.1\r\n|Host: a\r\nX-Slow: abc\r\n\r\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ps := servePlain(t, testLimits(100))
			conn := dialFrom(t, "127.0.0.2", ps.addr)
			if tt.start != "" {
				if _, err := io.WriteString(conn, tt.start); err != nil {
					t.Fatal(err)
				}
			}
			ps.waitFor(t, "the head to wait", func() bool { return ps.waiting(t) == 1 })
			pieces := strings.Split(tt.pieces, "|")
			for _, p := range pieces[:len(pieces)-1] {
				ps.trickle(t, conn, p) // looked at, and still waiting
			}
			if got := ps.news.Load(); got != 0 {
				t.Fatalf("the server was given %d connections before the head ended, want 0", got)
			}
			if _, err := io.WriteString(conn, pieces[len(pieces)-1]); err != nil {
				t.Fatal(err)
			}
			got, err := answer(conn)
			if err != nil || got != "200 OK: ok abc" {
				t.Fatalf("answer = %q, %v; want \"200 OK: ok abc\"", got, err)
			}
			if n := ps.waiting(t); n != 0 {
				t.Errorf("scafo_edge_waiting_heads = %v after the head came, want 0", n)
			}
		})
	}
}

// A visitor's head, whole when its connection is accepted, goes to the
// server at once; a keep-alive connection's next head is the server's to
// read.
func TestAHeadInWhenAcceptedGoesStraightToTheServer(t *testing.T) {
	t.Parallel()
	ps := servePlain(t, testLimits(100))
	h := dialH1(t, ps.addr)
	for i := range 3 {
		if _, err := h.get("/"); err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
	}
	if got := ps.news.Load(); got != 1 {
		t.Errorf("the server was given %d connections, want 1", got)
	}
}

// Slow first heads cost the server nothing while they wait: no connection
// of theirs reaches it, and each is counted against the budget.
func TestWaitingHeadsAreCountedButNotServed(t *testing.T) {
	t.Parallel()
	ps := servePlain(t, testLimits(100))
	const n = 40
	conns := make([]net.Conn, n)
	for i := range conns {
		conns[i] = ps.startHead(t, "127.0.0.2", slowHeaders)
	}
	if got := ps.news.Load(); got != 0 {
		t.Fatalf("the server was given %d connections, want 0", got)
	}
	if got := ps.tc.clientConns.Load(); got != n {
		t.Errorf("client connections counted = %d, want %d", got, n)
	}
	if got := ps.tc.arrivingFirst(); got != n {
		t.Errorf("slow first requests listed for shedding = %d, want %d", got, n)
	}
	for i, conn := range conns {
		if _, err := io.WriteString(conn, "\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		if got, err := answer(conn); err != nil || got != "200 OK: ok a" {
			t.Fatalf("connection %d: answer = %q, %v", i+1, got, err)
		}
	}
}

// A head still waiting at the header timeout (stretched 1 to 1.5 times)
// is closed, as the server would have closed it, and given back to the
// budget; one within it waits on.
func TestAWaitingHeadIsClosedAtItsHeaderTimeout(t *testing.T) {
	t.Parallel()
	ps := servePlain(t, testLimits(100))
	conn := ps.startHead(t, "127.0.0.2", slowHeaders)
	ps.clk.Advance(testHeadTimeout - time.Millisecond)
	ps.tc.expireHeads(ps.clk.Now())
	if got := ps.waiting(t); got != 1 {
		t.Fatalf("scafo_edge_waiting_heads = %v within the header timeout, want 1", got)
	}
	ps.clk.Advance(testHeadTimeout/2 + time.Millisecond)
	ps.tc.expireHeads(ps.clk.Now())
	// A FIN, as the server's close would have been: what was only
	// peeked at is taken first.
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := conn.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("read past the header timeout: %d, %v; want the end of the stream", n, err)
	}
	if got := ps.waiting(t); got != 0 {
		t.Errorf("scafo_edge_waiting_heads = %v past the header timeout, want 0", got)
	}
	if got := ps.tc.clientConns.Load(); got != 0 {
		t.Errorf("client connections counted = %d past the header timeout, want 0", got)
	}
}

// A client that closes or resets while its head waits is the server's to
// hear: it gets the connection and what was sent, and ends it.
func TestAClientThatGoesWhileItsHeadWaitsIsLetGo(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"close", "half-close", "reset"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			ps := servePlain(t, testLimits(100))
			conn := ps.startHead(t, "127.0.0.2", slowHeaders)
			switch how {
			case "reset":
				conn.(*net.TCPConn).SetLinger(0)
				conn.Close()
			case "close":
				conn.Close()
			case "half-close":
				conn.(*net.TCPConn).CloseWrite()
			}
			ps.waitFor(t, "the connection to be let go", func() bool {
				return ps.waiting(t) == 0 && ps.tc.clientConns.Load() == 0
			})
			if got := ps.news.Load(); got != 1 {
				t.Errorf("the server was given %d connections, want 1", got)
			}
		})
	}
}

// A head that has not ended in headPeek bytes is the server's to judge
// against its --max-header-bytes.
func TestAHeadTooLargeToWaitForGoesToTheServer(t *testing.T) {
	t.Parallel()
	ps := servePlain(t, testLimits(100))
	conn := ps.startHead(t, "127.0.0.2", slowHeaders)
	if _, err := io.WriteString(conn, strings.Repeat("a", 6*headPeek)); err != nil { // past the server's limit, its slack included
		t.Fatal(err)
	}
	// The server answers before reading the rest, and its close may
	// reset what follows the answer.
	if got, err := answer(conn); !strings.HasPrefix(got, "431 ") {
		t.Fatalf("answer = %q, %v; want 431 from the server", got, err)
	}
}

// A head handed over before it has ended (headPeek bytes of it) has till
// its wait's deadline to end, not a fresh header timeout of its server's.
func TestAHeadHandedOverUnfinishedKeepsItsDeadline(t *testing.T) {
	t.Parallel()
	ps := servePlainFor(t, testLimits(100), 200*time.Millisecond)
	conn := ps.startHead(t, "127.0.0.2", slowHeaders)
	if _, err := io.WriteString(conn, strings.Repeat("a", headPeek)); err != nil {
		t.Fatal(err)
	}
	ps.waitFor(t, "the server to get it", func() bool { return ps.news.Load() == 1 })
	// The server's own header timeout is an hour.
	if err := closedByPeer(conn); err != nil {
		t.Fatalf("past the wait's deadline: %v", err)
	}
}

// What net/http refuses with a 400 as soon as it reads a line goes to the
// server at once, so that the client hears it then; and so does what
// starts with no method (a TLS handshake sent to the plain port), which the
// server reads as it comes.
func TestAHeadTheServerRefusesGoesToItAtOnce(t *testing.T) {
	t.Parallel()
	for _, head := range []string{
		"GARBAGE\r\n",
		"GET /\r\n",
		"GET / HTTP/1.1\r\nHost fast.test\r\nX",
		"\r\n",
		"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
	} {
		t.Run(head, func(t *testing.T) {
			t.Parallel()
			ps := servePlain(t, testLimits(100))
			conn := dialFrom(t, "127.0.0.2", ps.addr)
			if _, err := io.WriteString(conn, head); err != nil {
				t.Fatal(err)
			}
			ps.waitFor(t, "the server to get it", func() bool { return ps.news.Load() == 1 })
			if strings.HasPrefix(head, "\x16") {
				return
			}
			if got, err := answer(conn); !strings.HasPrefix(got, "400 ") {
				t.Fatalf("answer = %q, %v; want 400", got, err)
			}
		})
	}
}

// Closing the listener (an upgrade hands its socket on) gives its server
// every connection whose head waits, then the end: they were accepted,
// and the server drains them.
func TestClosingThePlainListenerHandsItsWaitingHeadsToTheServer(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	tc := newController(t, Options{Limits: testLimits(100), Clock: clk})
	raw := listen(t)
	ln := tc.PlainListener(raw, testHeadTimeout, false)
	got := make(chan net.Conn, 8)
	done := make(chan error, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				done <- err
				return
			}
			got <- c
		}
	}()
	// Ones that waited closeYoungerThan, whether they sent something or
	// nothing, are closed, as the server's Shutdown would close them.
	quiet := dialFrom(t, "127.0.0.2", raw.Addr().String())
	old := dialFrom(t, "127.0.0.2", raw.Addr().String())
	old.Write([]byte(slowHeaders))
	testsupport.WaitFor(t, 10*time.Second, "the heads to wait", func() bool { return tc.waitingHeads() == 2 })
	clk.Advance(closeYoungerThan)
	const n = 3
	for range n {
		dialFrom(t, "127.0.0.2", raw.Addr().String()).Write([]byte(slowHeaders))
	}
	testsupport.WaitFor(t, 10*time.Second, "the heads to wait", func() bool { return tc.waitingHeads() == 2+n })
	ln.Close()
	for _, c := range []net.Conn{quiet, old} {
		if err := closedByPeer(c); err != nil {
			t.Errorf("a connection quiet or old at the close: %v", err)
		}
	}
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept after the close: %v, want net.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Accept did not return the end within 10s of the close")
	}
	if len(got) != n {
		t.Fatalf("Accept returned %d connections before the end, want %d", len(got), n)
	}
	for range n {
		c := <-got
		buf := make([]byte, len(slowHeaders))
		if _, err := io.ReadFull(c, buf); err != nil || string(buf) != slowHeaders {
			t.Errorf("read %q, %v from a handed-over connection; want its head's start", buf, err)
		}
		c.Close()
	}
}

// A connection accepted and waiting, its request not yet sent, when the
// listener closes (an upgrade: the successor holds the socket now) goes to
// the server too, and its request is answered when it comes. Its client
// writes after its connect returns, and the accept can come first: closed
// here, that request was lost (issue 44).
//
// Behind a PROXY protocol listener the same holds, whether the header has
// come or not: the client address it carries still reaches the server.
func TestAConnectionThatHasSentNothingWhenThePlainListenerClosesIsAnswered(t *testing.T) {
	t.Parallel()
	const proxyHeader = "PROXY TCP4 192.0.2.7 127.0.0.1 4000 80\r\n"
	for _, tt := range []struct {
		name    string
		proxied bool
		before  string
	}{
		{"nothing sent", false, ""},
		{"part of the request line sent", false, "GE"},
		{"PROXY, nothing sent", true, ""},
		{"PROXY, its header sent", true, proxyHeader},
		{"PROXY, its header and part of the request line sent", true, proxyHeader + "GE"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ps := servePlainWith(t, testLimits(100), testHeadTimeout, tt.proxied)
			conn := dialFrom(t, "127.0.0.2", ps.addr)
			if tt.before != "" {
				io.WriteString(conn, tt.before)
			}
			ps.waitFor(t, "the connection to wait for its head", func() bool { return ps.waiting(t) == 1 })
			ps.ln.Close()
			ps.waitFor(t, "the server to get it", func() bool { return ps.news.Load() == 1 })
			all, from := "GET / HTTP/1.1\r\nHost: a\r\nX-Slow: late\r\n\r\n", "127.0.0.2:"
			if tt.proxied {
				all, from = proxyHeader+all, "192.0.2.7:4000"
			}
			io.WriteString(conn, strings.TrimPrefix(all, tt.before))
			conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatalf("the request sent after the close: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(body) != "ok late" || !strings.HasPrefix(resp.Header.Get("X-Remote"), from) {
				t.Errorf("answer %q from %q; want ok late, from %s", body, resp.Header.Get("X-Remote"), from)
			}
		})
	}
}

// A plain listener closed before its first Accept accepts nothing, starts
// nothing, and its Accept returns the end.
func TestAPlainListenerClosedBeforeServingStartsNothing(t *testing.T) {
	t.Parallel()
	tc := newController(t, Options{Limits: testLimits(100), Clock: newFakeClock()})
	ln := tc.PlainListener(listen(t), testHeadTimeout, false)
	ln.Close()
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after the close: %v, want net.ErrClosed", err)
	}
	tc.headsMu.Lock()
	n := len(tc.heads)
	tc.headsMu.Unlock()
	if n != 0 {
		t.Errorf("%d listeners' heads noted, want 0", n)
	}
}

// theWaitingHead returns the one connection waiting for its head, and its
// pacing's count of the times bytes came.
func (ps *plainServer) theWaitingHead(t *testing.T) (*waitingHead, int) {
	t.Helper()
	h := ps.ln.(*listener).heads
	h.judgeMu.Lock()
	defer h.judgeMu.Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.waiting) != 1 {
		t.Fatalf("%d heads wait, want 1", len(h.waiting))
	}
	for _, w := range h.waiting {
		return w, w.events
	}
	return nil, 0
}

// trickle sends b and waits for the poller to have looked at it.
func (ps *plainServer) trickle(t *testing.T, conn net.Conn, b string) {
	t.Helper()
	_, before := ps.theWaitingHead(t)
	if _, err := io.WriteString(conn, b); err != nil {
		t.Fatal(err)
	}
	ps.waitFor(t, "the poller to look at "+b, func() bool {
		_, n := ps.theWaitingHead(t)
		return n > before
	})
}

// A head that keeps trickling is looked at only at its turns once bytes
// came headPaceAfter times and it waited slowAge: the kernel holds its bytes
// meanwhile, and the end of its head is heard at the next turn, when the
// kernel's mark is lowered for its server. Its client's end is heard at
// once.
func TestATricklingHeadWaitsForItsTurns(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"head", "close"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			ps := servePlain(t, testLimits(100))
			ps.tc.contended.Store(true) // heads are paced only under contention
			conn := ps.startHead(t, "127.0.0.2", slowHeaders)
			ps.clk.Advance(slowAge)
			w, _ := ps.theWaitingHead(t)
			value := "a" // slowHeaders' last byte
			for !w.paced.Load() {
				if len(value) > headPaceAfter {
					t.Fatalf("not paced after bytes came %d times over %v", headPaceAfter, slowAge)
				}
				ps.trickle(t, conn, "a")
				value += "a"
			}
			if got := rcvLowat(t, w.t); got != headPeek {
				t.Fatalf("SO_RCVLOWAT = %d while paced, want %d", got, headPeek)
			}
			if end == "close" {
				conn.(*net.TCPConn).CloseWrite()
				ps.waitFor(t, "the server to get it", func() bool { return ps.news.Load() == 1 })
				return
			}
			if _, err := io.WriteString(conn, "\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			ps.tc.headTurns(ps.clk.Now()) // not its turn
			if got := ps.news.Load(); got != 0 {
				t.Fatalf("the server got it before its turn")
			}
			ps.clk.Advance(paceEvery * 3 / 2)
			ps.tc.headTurns(ps.clk.Now())
			if got, err := answer(conn); err != nil || got != "200 OK: ok "+value {
				t.Fatalf("answer = %q, %v; want \"200 OK: ok %s\"", got, err, value)
			}
			if got := rcvLowat(t, w.t); got > 1 {
				t.Errorf("SO_RCVLOWAT = %d once handed over, want a byte", got)
			}
		})
	}
}

// A paced head that ended after its last turn is the server's at its
// deadline, not closed: a read made in time would have had it.
func TestAPacedHeadThatEndedIsServedAtItsDeadline(t *testing.T) {
	t.Parallel()
	ps := servePlain(t, testLimits(100))
	ps.tc.contended.Store(true) // heads are paced only under contention
	conn := ps.startHead(t, "127.0.0.2", slowHeaders)
	ps.clk.Advance(slowAge)
	w, _ := ps.theWaitingHead(t)
	for i := 0; !w.paced.Load(); i++ {
		if i == headPaceAfter {
			t.Fatalf("not paced after bytes came %d times over %v", headPaceAfter, slowAge)
		}
		ps.trickle(t, conn, "a")
	}
	if _, err := io.WriteString(conn, "\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	ps.clk.Advance(testHeadTimeout * 3 / 2) // past any deadline, its turn not taken
	ps.tc.expireHeads(ps.clk.Now())
	// Its server has a moment to read it, not a deadline already past
	// (helper-28 saw one reset so through the binary).
	if by := w.t.headDeadline.Load(); by != 0 && by < ps.clk.Now().UnixNano() {
		t.Errorf("handed over with its head due %v ago", time.Duration(ps.clk.Now().UnixNano()-by))
	}
	if got, err := answer(conn); err != nil || !strings.HasPrefix(got, "200 OK") {
		t.Fatalf("answer = %q, %v; want 200", got, err)
	}
}

// A header line folded onto the one before (obs-fold, which net/http
// reads as part of it) does not end the wait.
func TestAFoldedHeaderLineKeepsItsHeadWaiting(t *testing.T) {
	t.Parallel()
	ps := servePlain(t, testLimits(100))
	ps.tc.contended.Store(true) // heads are paced only under contention
	conn := ps.startHead(t, "127.0.0.2", "GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n")
	ps.trickle(t, conn, " b\r\n")
	ps.trickle(t, conn, "Y: c")
	if got := ps.news.Load(); got != 0 {
		t.Fatalf("the server was given %d connections before the head ended, want 0", got)
	}
}

// Nobody short of anything: a head that keeps trickling in the epoll set
// is looked at as its bytes come, never paced, and answered the moment it
// ends (issue 46). Once the box is contended it is paced; once the
// contention is over it is looked at as its bytes come again.
func TestAWaitingHeadIsPacedOnlyUnderContention(t *testing.T) {
	t.Parallel()
	ps := servePlain(t, testLimits(100))
	conn := ps.startHead(t, "127.0.0.2", slowHeaders)
	ps.clk.Advance(slowAge)
	w, _ := ps.theWaitingHead(t)
	for range 3 * headPaceAfter {
		ps.trickle(t, conn, "a")
	}
	if w.paced.Load() {
		t.Fatalf("paced after bytes came %d times over %v with the box not contended", 3*headPaceAfter, slowAge)
	}
	ps.tc.contended.Store(true)
	for i := 0; !w.paced.Load(); i++ {
		if i > headPaceAfter {
			t.Fatalf("not paced after bytes came %d times under contention", i)
		}
		ps.trickle(t, conn, "a")
	}
	ps.tc.contended.Store(false)
	ps.tc.headTurns(ps.clk.Now()) // before its turn: the contention is over
	if w.paced.Load() {
		t.Fatal("still paced once the contention was over")
	}
	if got := rcvLowat(t, w.t); got > 1 {
		t.Errorf("SO_RCVLOWAT = %d once unpaced, want a byte", got)
	}
	if _, err := io.WriteString(conn, "\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if got, err := answer(conn); err != nil || !strings.HasPrefix(got, "200 OK") {
		t.Fatalf("answer = %q, %v; want 200 without a turn", got, err)
	}
}
