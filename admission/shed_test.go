package admission

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/testsupport"
)

// Pressure starts at 90% of MaxConns, and shedding goes to just under 80%:
// with a budget of 20, at 18 connections, down to 15.
const (
	shedMaxConns = 20
	shedHigh     = 18
	shedLow      = 16
)

func (tc *testController) pressure(t *testing.T) float64 {
	t.Helper()
	return tc.metric(t, "scafo_edge_pressure", nil)
}

// waitPressure waits for an episode of pressure to start, on the gauge and
// in Snapshot (the gauge moves first).
func (tc *testController) waitPressure(t *testing.T) {
	t.Helper()
	testsupport.WaitFor(t, 10*time.Second, "an episode of pressure", func() bool {
		return tc.pressure(t) == 1 && tc.Snapshot().Pressure
	})
}

// waitCalm moves the clock on until the episode of pressure ends: it ends
// once connections and memory have stayed under their low-water marks for
// calmFor of the controller's clock.
func (tc *testController) waitCalm(t *testing.T, clk *clock.Fake) {
	t.Helper()
	testsupport.WaitFor(t, 10*time.Second, "the episode to end", func() bool {
		clk.Advance(100 * time.Millisecond)
		return tc.pressure(t) == 0 && !tc.Snapshot().Pressure
	})
}

// Log lines of an episode.
const (
	episodeStart = "overload: closing idle connections"
	episodeEnd   = "overload over"
)

func (tc *testController) waitIdle(t *testing.T, n int) {
	t.Helper()
	testsupport.WaitFor(t, 10*time.Second, fmt.Sprintf("%d idle connections", n), func() bool { return tc.Snapshot().IdleConns == n })
}

func (g *gate) waitEntered(t *testing.T) {
	t.Helper()
	select {
	case <-g.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the blocked request never reached its handler")
	}
}

// keepAliveClients opens n HTTP/1.1 keep-alive connections one after the
// other, each doing one request, so that they are idle oldest first; the
// clk moves a millisecond between them.
func keepAliveClients(t *testing.T, c *testController, clk *clock.Fake, addr string, n int) []*h1Client {
	t.Helper()
	idleBefore := c.Snapshot().IdleConns
	var out []*h1Client
	for i := range n {
		h := dialH1(t, addr)
		if _, err := h.get("/"); err != nil {
			t.Fatalf("request on connection %d: %v", i+1, err)
		}
		c.waitIdle(t, idleBefore+i+1)
		clk.Advance(time.Millisecond)
		out = append(out, h)
	}
	return out
}

func TestUnderPressureTheOldestIdleConnectionsAreClosedFirst(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	c := newController(t, Options{Limits: testLimits(shedMaxConns), Clock: clk})
	c.run(t)
	g := newGate(t)
	ln := listen(t)
	serve(t, c.Controller, ln, g.handler(), nil)
	addr := ln.Addr().String()

	idle := keepAliveClients(t, c, clk, addr, shedLow)
	active := dialH1(t, addr)
	if err := active.send("/block"); err != nil {
		t.Fatal(err)
	}
	g.waitEntered(t)
	// The eighteenth connection reaches the high-water mark; none is old
	// enough to shed yet.
	idle = append(idle, keepAliveClients(t, c, clk, addr, 1)...)
	c.waitPressure(t)
	if s := c.Snapshot(); !s.Pressure || s.PressureReason == "" || s.ClientConns != shedHigh {
		t.Errorf("Snapshot = pressure %v (%q) at %d connections, want pressure with a reason at %d", s.Pressure, s.PressureReason, s.ClientConns, shedHigh)
	}
	if n := len(c.log.LogEntries(episodeStart)); n != 1 {
		t.Errorf("the episode's start logged %d times, want once:\n%s", n, c.log.String())
	}

	// Now they are old enough: the oldest go, to just under the low-water
	// mark (15 of 20).
	clk.Advance(time.Second)
	testsupport.WaitFor(t, 10*time.Second, "idle connections to be shed", func() bool { return c.Snapshot().ClientConns < shedLow })
	const shed = shedHigh - shedLow + 1
	if got := shedHigh - int(c.Snapshot().ClientConns); got != shed {
		t.Fatalf("%d connections shed from %d, want %d: to just under the low-water mark %d", got, shedHigh, shed, shedLow)
	}
	for i, h := range idle {
		if i < shed {
			if err := closedByPeer(h.conn); err != nil {
				t.Errorf("idle connection %d (of the %d oldest): %v", i+1, shed, err)
			}
			continue
		}
		if _, err := h.get("/"); err != nil {
			t.Errorf("idle connection %d, newer than the %d shed: %v", i+1, shed, err)
		}
	}
	if got := c.shed(t, "idle_closed"); got != shed {
		t.Errorf("scafo_edge_shed_total{reason=idle_closed} = %v, want %d", got, shed)
	}

	// The request in flight all along was never cut.
	g.release()
	if body, err := active.read(); err != nil || body != "ok" {
		t.Errorf("the request in flight during the episode = %q, %v; want ok", body, err)
	}

	// Under the low-water mark for long enough, the episode ends, logged
	// once; waiting out the calm, the short idle timeout no longer holds.
	c.waitCalm(t, clk)
	for msg, what := range map[string]string{episodeStart: "start", episodeEnd: "end"} {
		if n := len(c.log.LogEntries(msg)); n != 1 {
			t.Errorf("the episode's %s logged %d times, want once:\n%s", what, n, c.log.String())
		}
	}
	for i, h := range idle[shed:] {
		if _, err := h.get("/"); err != nil {
			t.Errorf("idle connection %d, idle past the short timeout while the episode calmed: %v", shed+i+1, err)
		}
	}
	if got := c.metric(t, "scafo_edge_pressure_episodes_total", nil); got != 1 {
		t.Errorf("scafo_edge_pressure_episodes_total = %v, want 1", got)
	}
}

// watchedConn is a client's connection that reports when the client closes
// it.
type watchedConn struct {
	net.Conn
	once   sync.Once
	closed chan struct{}
}

func (w *watchedConn) Close() error {
	w.once.Do(func() { close(w.closed) })
	return w.Conn.Close()
}

// h2Client is a Go HTTP/2 client (one connection at a time) that knows the
// connections it dialed.
type h2Client struct {
	client *http.Client
	mu     sync.Mutex
	conns  []*watchedConn
}

func newH2Client(t *testing.T, roots *x509.CertPool) *h2Client {
	t.Helper()
	h := &h2Client{}
	d := net.Dialer{Timeout: 5 * time.Second}
	tr := &http.Transport{
		ForceAttemptHTTP2: true,
		TLSClientConfig:   &tls.Config{RootCAs: roots, ServerName: "localhost"},
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			w := &watchedConn{Conn: conn, closed: make(chan struct{})}
			h.mu.Lock()
			h.conns = append(h.conns, w)
			h.mu.Unlock()
			return w, nil
		},
	}
	t.Cleanup(tr.CloseIdleConnections)
	h.client = &http.Client{Transport: tr, Timeout: 10 * time.Second}
	return h
}

// get fetches url over HTTP/2 and reports whether it went on a connection
// used before.
func (h *h2Client) get(url string) (reused bool, err error) {
	trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", url, nil)
	if err != nil {
		return false, err
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		return false, err
	case resp.ProtoMajor != 2:
		return false, fmt.Errorf("answered over %s, want HTTP/2", resp.Proto)
	case resp.StatusCode != 200 || string(b) != "ok":
		return false, fmt.Errorf("answered %d %q", resp.StatusCode, b)
	}
	return reused, nil
}

func (h *h2Client) dialed() []*watchedConn {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*watchedConn(nil), h.conns...)
}

func waitClientClosed(t *testing.T, w *watchedConn, what string) {
	t.Helper()
	select {
	case <-w.closed:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: still open 10s later", what)
	}
}

func TestUnderPressureAnIdleHTTP2ConnectionIsToldToGoAwayAndNoRequestFails(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	const maxConns = 10 // pressure at 9 connections, shedding down to 8
	c := newController(t, Options{Limits: testLimits(maxConns), Clock: clk})
	c.run(t)
	g := newGate(t)
	cert, roots := testsupport.SelfSigned(t)
	ln := listen(t)
	serve(t, c.Controller, ln, g.handler(), &cert)
	url := "https://" + ln.Addr().String() + "/"

	idle := newH2Client(t, roots)
	if _, err := idle.get(url); err != nil {
		t.Fatal(err)
	}
	c.waitIdle(t, 1)
	busy := newH2Client(t, roots)
	busyDone := make(chan error, 1)
	go func() {
		_, err := busy.get(url + "block")
		busyDone <- err
	}()
	g.waitEntered(t)

	// Both are old now; seven connections that have sent nothing yet, too
	// young to shed, bring the count to 9.
	clk.Advance(time.Second)
	for range 7 {
		dialFrom(t, "127.0.0.1", ln.Addr().String())
	}
	waitClientClosed(t, idle.dialed()[0], "the idle HTTP/2 connection told to go away")
	if got := c.shed(t, "idle_closed"); got != 1 {
		t.Errorf("scafo_edge_shed_total{reason=idle_closed} = %v, want 1: one connection past the low-water mark", got)
	}
	reused, err := idle.get(url)
	if err != nil {
		t.Fatalf("the next request of the client whose connection went away: %v", err)
	}
	if reused || len(idle.dialed()) != 2 {
		t.Errorf("the next request went on a connection used before %v, %d dialed; want a new connection", reused, len(idle.dialed()))
	}

	// The stream in flight all along on the other connection was never cut.
	g.release()
	select {
	case err := <-busyDone:
		if err != nil {
			t.Errorf("the request in flight during the episode: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the request in flight never finished")
	}
	if n := len(busy.dialed()); n != 1 {
		t.Errorf("the busy client dialed %d connections, want its one", n)
	}
}

func TestUnderPressureOnlyAsManyHTTP2ConnectionsAsNeededAreToldToGoAway(t *testing.T) {
	t.Parallel()
	clk := newFakeClock()
	const maxConns = 10 // pressure at 9 connections, shedding to under 8
	c := newController(t, Options{Limits: testLimits(maxConns), Clock: clk})
	c.run(t)
	cert, roots := testsupport.SelfSigned(t)
	ln := listen(t)
	serve(t, c.Controller, ln, newGate(t).handler(), &cert)
	url := "https://" + ln.Addr().String() + "/"

	var clients []*h2Client
	for i := range 3 {
		h := newH2Client(t, roots)
		if _, err := h.get(url); err != nil {
			t.Fatal(err)
		}
		c.waitIdle(t, i+1)
		clk.Advance(time.Millisecond)
		clients = append(clients, h)
	}
	clk.Advance(time.Second)
	for range 6 {
		dialFrom(t, "127.0.0.1", ln.Addr().String())
	}
	// From 9 to 7: the two oldest go away. A connection told to go away
	// counts as gone: shedding does not go on to the third while they
	// finish.
	for i, h := range clients[:2] {
		waitClientClosed(t, h.dialed()[0], fmt.Sprintf("idle HTTP/2 connection %d (of the two oldest)", i+1))
	}
	if got := c.shed(t, "idle_closed"); got != 2 {
		t.Errorf("scafo_edge_shed_total{reason=idle_closed} = %v, want 2: from 9 connections to under the low-water mark 8", got)
	}
	reused, err := clients[2].get(url)
	if err != nil {
		t.Fatalf("the newest client: %v", err)
	}
	if !reused {
		t.Error("the newest client's request went on a new connection: its idle one was told to go away too")
	}
	for i, h := range clients[:2] {
		if reused, err := h.get(url); err != nil || reused {
			t.Errorf("client %d whose connection went away: reused %v, %v; want a new connection", i+1, reused, err)
		}
	}
}

func TestPastTheMemoryHighWaterMarkNewRequestsAreRefusedUntilUnderTheLowOne(t *testing.T) {
	t.Parallel()
	var use, samples atomic.Int64
	l := testLimits(100)
	l.MemoryLimit = 1000 // high-water mark 750, low 650
	clk := newFakeClock()
	c := newController(t, Options{Limits: l, Clock: clk, MemoryInUse: func() int64 {
		samples.Add(1)
		return use.Load()
	}})
	c.run(t)
	admit := func() Refusal {
		k, why := c.Admit(request("192.0.2.1:1"), "app")
		k.Release()
		return why
	}
	sampledTwice := func(what string) {
		t.Helper()
		n := samples.Load()
		testsupport.WaitFor(t, 10*time.Second, what, func() bool { return samples.Load() >= n+2 })
	}
	use.Store(749)
	sampledTwice("memory sampled under the high-water mark")
	if why := admit(); why != Admitted || c.Snapshot().MemoryHigh || c.Snapshot().Pressure {
		t.Fatalf("Admit under the high-water mark = %v (%+v), want admitted", why, c.Snapshot())
	}

	use.Store(750)
	testsupport.WaitFor(t, 10*time.Second, "memory past its high-water mark", func() bool { return c.Snapshot().MemoryHigh })
	if why := admit(); why != RefusedMemory {
		t.Errorf("Admit past the memory high-water mark = %v, want %v", why, RefusedMemory)
	}
	c.waitPressure(t)
	if s := c.Snapshot(); s.PressureReason != "memory past the high-water mark" {
		t.Errorf("pressure reason = %q, want memory's", s.PressureReason)
	}

	use.Store(651) // between the marks: still high
	sampledTwice("memory sampled between the marks")
	if why := admit(); why != RefusedMemory {
		t.Errorf("Admit between the marks after memory was high = %v, want %v", why, RefusedMemory)
	}

	use.Store(649)
	testsupport.WaitFor(t, 10*time.Second, "memory back under its low-water mark", func() bool { return !c.Snapshot().MemoryHigh })
	if why := admit(); why != Admitted {
		t.Errorf("Admit under the low-water mark = %v, want admitted", why)
	}
	c.waitCalm(t, clk)
	if got := c.shed(t, "memory"); got != 2 {
		t.Errorf("scafo_edge_shed_total{reason=memory} = %v, want 2", got)
	}
	if n := len(c.log.LogEntries("while memory is past its high-water mark")); n < 1 {
		t.Errorf("memory refusals not logged:\n%s", c.log.String())
	}
	for msg, what := range map[string]string{episodeStart: "start", episodeEnd: "end"} {
		if n := len(c.log.LogEntries(msg)); n != 1 {
			t.Errorf("the episode's %s logged %d times, want once:\n%s", what, n, c.log.String())
		}
	}
}

// silentConnections starts a running controller and a server, and opens
// shedHigh connections that send nothing, one a millisecond of its clock
// apart, oldest first: enough for an episode of pressure.
func silentConnections(t *testing.T) (*testController, *clock.Fake, []net.Conn) {
	t.Helper()
	clk := newFakeClock()
	c := newController(t, Options{Limits: testLimits(shedMaxConns), Clock: clk})
	c.run(t)
	ln := listen(t)
	serve(t, c.Controller, ln, newGate(t).handler(), nil)
	var conns []net.Conn
	for i := range shedHigh {
		conns = append(conns, dialFrom(t, "127.0.0.1", ln.Addr().String()))
		c.waitIdle(t, i+1)
		clk.Advance(time.Millisecond)
	}
	return c, clk, conns
}

func TestAConnectionThatHasSentNothingIsShedLikeAnIdleOne(t *testing.T) {
	t.Parallel()
	c, clk, silent := silentConnections(t)
	c.waitPressure(t)
	clk.Advance(time.Second)
	testsupport.WaitFor(t, 10*time.Second, "silent connections to be shed", func() bool { return c.Snapshot().ClientConns < shedLow })
	for i, conn := range silent[:shedHigh-shedLow+1] {
		if err := closedByPeer(conn); err != nil {
			t.Errorf("silent connection %d (of the oldest): %v", i+1, err)
		}
	}
	// The newest is still served.
	h := &h1Client{conn: silent[len(silent)-1], br: bufio.NewReader(silent[len(silent)-1])}
	if _, err := h.get("/"); err != nil {
		t.Errorf("the newest silent connection: %v", err)
	}
}

func TestAtTheBudgetANewConnectionIsServedOnceAnIdleOneIsOldEnoughToClose(t *testing.T) {
	cases := []struct {
		name      string
		age       time.Duration // how long the idle connections have been idle
		wantPause bool
	}{
		{name: "an idle connection old enough is closed for it", age: time.Second},
		{name: "connections idle less than 250ms are spared: it waits in the backlog", age: 0, wantPause: true},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			const maxConns = 4
			clk := newFakeClock()
			c := newController(t, Options{Limits: testLimits(maxConns), Clock: clk})
			c.run(t)
			ln := listen(t)
			serve(t, c.Controller, ln, newGate(t).handler(), nil)
			addr := ln.Addr().String()
			idle := keepAliveClients(t, c, clk, addr, maxConns)
			clk.Advance(tt.age)

			next := dialH1(t, addr)
			if tt.wantPause {
				testsupport.WaitFor(t, 10*time.Second, "Accept to wait for room", func() bool { return c.Snapshot().AcceptPaused })
				for i, h := range idle {
					if _, err := h.get("/"); err != nil {
						t.Fatalf("idle connection %d, younger than 250ms: %v", i+1, err)
					}
				}
				idle[0].conn.Close()
			}
			if _, err := next.get("/"); err != nil {
				t.Fatalf("the connection past the budget: %v", err)
			}
			if tt.wantPause {
				return
			}
			// Shedding goes on down to the low-water mark (3 of 4) while the
			// episode lasts: the oldest go first, the newest stays.
			if closed := oldestClosedFirst(t, idle); closed < 1 || closed == len(idle) {
				t.Errorf("%d of %d idle connections closed, want the oldest and not the newest", closed, len(idle))
			}
		})
	}
}

// oldestClosedFirst sends a request on each connection, oldest first, and
// fails the test unless those the server closed all come before those it
// still serves; it returns how many it closed.
func oldestClosedFirst(t *testing.T, conns []*h1Client) int {
	t.Helper()
	closed, alive := 0, 0
	for i, h := range conns {
		_, err := h.get("/")
		switch {
		case err == nil:
			alive++
		case alive > 0:
			t.Errorf("connection %d closed after a newer one was kept: %v", i+1, err)
		default:
			closed++
		}
	}
	return closed
}

// Accept does not wait for the monitor: at the budget it closes the oldest
// idle connection itself. Here nothing else would (no Run), and the
// connections are idle as a server reports them through ConnState.
func TestAtTheBudgetAcceptClosesTheOldestIdleConnectionItself(t *testing.T) {
	t.Parallel()
	const maxConns = 4
	clk := newFakeClock()
	c := newController(t, Options{Limits: testLimits(maxConns), Clock: clk})
	ln := listen(t)
	cl := c.Listener(ln)
	t.Cleanup(func() { cl.Close() })
	var clients []net.Conn
	for range maxConns {
		clients = append(clients, dialFrom(t, "127.0.0.1", ln.Addr().String()))
		conn, err := cl.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		c.ConnState(conn, http.StateNew)
		c.ConnState(conn, http.StateActive)
		c.ConnState(conn, http.StateIdle)
		clk.Advance(time.Millisecond)
	}
	clk.Advance(time.Second)
	next := dialFrom(t, "127.0.0.1", ln.Addr().String())
	got := make(chan net.Conn, 1)
	go func() {
		conn, _ := cl.Accept()
		got <- conn
	}()
	select {
	case conn := <-got:
		if conn == nil {
			t.Fatal("Accept failed")
		}
		defer conn.Close()
		if conn.RemoteAddr().String() != next.LocalAddr().String() {
			t.Errorf("accepted %s, want the new %s", conn.RemoteAddr(), next.LocalAddr())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Accept at the budget did not make room from an idle connection within 10s")
	}
	if err := closedByPeer(clients[0]); err != nil {
		t.Errorf("the oldest idle connection: %v", err)
	}
	if got := c.metric(t, "scafo_edge_accept_pauses_total", nil); got != 0 {
		t.Errorf("scafo_edge_accept_pauses_total = %v, want 0: room was made without waiting", got)
	}
	if s := c.Snapshot(); s.ClientConns != maxConns || s.IdleConns != maxConns-1 {
		t.Errorf("Snapshot = %d connections, %d idle; want %d and %d", s.ClientConns, s.IdleConns, maxConns, maxConns-1)
	}
}

func TestAConnectionWhoseRequestIsArrivingIsNotShed(t *testing.T) {
	t.Parallel()
	c, clk, conns := silentConnections(t)
	// The oldest has begun its request; the rest of its headers are slow
	// to come. Its server still reports it new: only its bytes tell.
	oldest := conns[0]
	if _, err := io.WriteString(oldest, "GET / HTTP/1.1\r\nHost: app.example\r\n"); err != nil {
		t.Fatal(err)
	}
	testsupport.WaitFor(t, 10*time.Second, "the edge to read the first bytes of the oldest's request", func() bool {
		arriving := false
		c.conns.each(func(t *trackedConn, _ net.Conn) { arriving = arriving || t.arriving.Load() })
		return arriving
	})
	c.waitPressure(t)
	clk.Advance(time.Second)
	testsupport.WaitFor(t, 10*time.Second, "silent connections to be shed", func() bool { return c.Snapshot().ClientConns < shedLow })
	for i, conn := range conns[1 : shedHigh-shedLow+2] {
		if err := closedByPeer(conn); err != nil {
			t.Errorf("silent connection %d (of the oldest after the arriving one): %v", i+2, err)
		}
	}
	if _, err := io.WriteString(oldest, "\r\n"); err != nil {
		t.Fatalf("the rest of the arriving request: %v", err)
	}
	h := &h1Client{conn: oldest, br: bufio.NewReader(oldest)}
	if _, err := h.read(); err != nil {
		t.Errorf("the request that was arriving under pressure: %v, want it answered", err)
	}
}
