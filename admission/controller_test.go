package admission

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

func TestANilControllerAdmitsEverythingAndCountsNothing(t *testing.T) {
	var c *Controller
	k, why := c.Admit(request("192.0.2.1:1"), "app")
	if why != Admitted {
		t.Errorf("nil Admit = %v, want admitted", why)
	}
	k.Release()
	Ticket{}.Release()
	ln := listen(t)
	if got := c.Listener(ln); got != ln {
		t.Errorf("nil Listener wrapped the listener")
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	if got := trackUpstream(t, c, a); got != a {
		t.Errorf("a nil controller's DialUpstream wrapped the connection")
	}
	c.ConnState(a, http.StateIdle)
	c.Run(context.Background()) // returns at once
	if s := c.Snapshot(); s.MaxConns != 0 || s.Pressure {
		t.Errorf("nil Snapshot = %+v, want the zero Status", s)
	}
}

func TestNewRefusesLimitsItCannotEnforce(t *testing.T) {
	cases := []struct {
		name    string
		limits  func(l *Limits)
		wantErr string
	}{
		{"no connection budget", func(l *Limits) { l.MaxConns = 0 }, "MaxConns"},
		{"no connections per client", func(l *Limits) { l.ConnsPerClient = 0 }, "connections per client"},
		{"no requests per client", func(l *Limits) { l.RequestsPerClient = 0 }, "requests per client"},
		{"no application share", func(l *Limits) { l.AppShare = 0 }, "application share"},
		{"a negative queue timeout", func(l *Limits) { l.QueueTimeout = -1 }, "queue timeout"},
	}
	for _, tt := range cases {
		t.Run(tt.name, func(t *testing.T) {
			l := testLimits(100)
			tt.limits(&l)
			if _, err := New(Options{Limits: l}); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("New = %v, want an error about %q", err, tt.wantErr)
			}
		})
	}
	t.Run("a second controller on one registry", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		if _, err := New(Options{Limits: testLimits(100), Registerer: reg}); err != nil {
			t.Fatal(err)
		}
		if _, err := New(Options{Limits: testLimits(100), Registerer: reg}); err == nil {
			t.Error("New registered its metrics twice on one registry without an error")
		}
	})
}

func TestEveryShedReasonIsExportedFromTheStart(t *testing.T) {
	c := newController(t, Options{Limits: testLimits(100)})
	for _, r := range ShedReasons {
		if v, ok := testsupport.MetricValue(t, c.reg, "scafo_edge_shed_total", testsupport.Labels{"reason": r}); !ok || v != 0 {
			t.Errorf("scafo_edge_shed_total{reason=%s} = %v (exists %v), want 0", r, v, ok)
		}
	}
	for _, why := range []Refusal{RefusedMemory, RefusedClientRequests, RefusedClientRate, RefusedAppQueueFull, RefusedAppQueueTimeout} {
		found := false
		for _, r := range ShedReasons {
			found = found || r == why.String()
		}
		if !found {
			t.Errorf("refusal %v is not among the shed reasons %v", why, ShedReasons)
		}
	}
	if v, ok := testsupport.MetricValue(t, c.reg, "scafo_edge_pressure", nil); !ok || v != 0 {
		t.Errorf("scafo_edge_pressure = %v (exists %v), want 0", v, ok)
	}
}

// quicServer listens for QUIC on a loopback UDP port through c's
// QUICListener and hands over every connection it accepts, until the test
// ends.
func quicServer(t *testing.T, c *Controller, cert tls.Certificate) (string, <-chan *quic.Conn) {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// A transport of its own, closed at the end, closes every connection
	// the server still holds.
	tr := &quic.Transport{Conn: pc}
	// Not early: the edge takes connections once their handshake is
	// complete (QUICListener's contract).
	ql, err := tr.Listen(&tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h3"}}, nil)
	if err != nil {
		pc.Close()
		t.Fatal(err)
	}
	l := c.QUICListener(ql)
	ch := make(chan *quic.Conn, 16)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			conn, err := l.Accept(ctx)
			if err != nil {
				return
			}
			ch <- conn
		}
	}()
	t.Cleanup(func() {
		cancel()
		l.Close()
		<-done
		tr.Close()
		pc.Close()
	})
	return pc.LocalAddr().String(), ch
}

// tryDialQUIC connects to addr from the loopback address from; the test's
// cleanup closes the connection and its socket.
func tryDialQUIC(t *testing.T, from, addr string, roots *x509.CertPool) (*quic.Conn, error) {
	t.Helper()
	pc, err := net.ListenPacket("udp", from+":0")
	if err != nil {
		t.Fatal(err)
	}
	tr := &quic.Transport{Conn: pc}
	t.Cleanup(func() {
		tr.Close()
		pc.Close()
	})
	raddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := tr.Dial(ctx, raddr, &tls.Config{RootCAs: roots, ServerName: "localhost", NextProtos: []string{"h3"}}, nil)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { conn.CloseWithError(0, "") })
	return conn, nil
}

func dialQUIC(t *testing.T, from, addr string, roots *x509.CertPool) *quic.Conn {
	t.Helper()
	conn, err := tryDialQUIC(t, from, addr, roots)
	if err != nil {
		t.Fatalf("QUIC dial from %s: %v", from, err)
	}
	return conn
}

// refusedExcessiveLoad reports whether the server closed the connection
// being dialed with H3_EXCESSIVE_LOAD, waiting up to 10s. Closed during the
// handshake (the dial fails), the client sees only APPLICATION_ERROR: RFC
// 9000 §10.2.3 hides an application's code until the handshake is done.
func refusedExcessiveLoad(conn *quic.Conn, err error) error {
	if err == nil {
		select {
		case <-conn.Context().Done():
		case <-time.After(10 * time.Second):
			return errors.New("still open 10s later")
		}
		err = context.Cause(conn.Context())
	}
	var appErr *quic.ApplicationError
	if errors.As(err, &appErr) && appErr.Remote && appErr.ErrorCode == 0x107 {
		return nil
	}
	var trErr *quic.TransportError
	if errors.As(err, &trErr) && trErr.Remote && trErr.ErrorCode == quic.ApplicationErrorErrorCode {
		return nil
	}
	return fmt.Errorf("closed with %v, want the server's H3_EXCESSIVE_LOAD", err)
}

func TestAQUICConnectionIsCountedAgainstTheBudgetAndItsAddressShare(t *testing.T) {
	t.Parallel()
	cert, roots := testsupport.SelfSigned(t)
	l := testLimits(10)
	l.ConnsPerClient = 1
	c := newController(t, Options{Limits: l})
	addr, conns := quicServer(t, c.Controller, cert)

	first := dialQUIC(t, "127.0.0.1", addr, roots)
	receiveQUIC(t, conns, "the first connection")
	if s := c.Snapshot(); s.HTTP3Conns != 1 || s.ClientConns != 0 || s.Clients != 1 {
		t.Errorf("Snapshot = %d HTTP/3 and %d TCP connections of %d addresses, want 1, 0 of 1", s.HTTP3Conns, s.ClientConns, s.Clients)
	}
	// On an idle box the address may pass its share.
	second := dialQUIC(t, "127.0.0.1", addr, roots)
	receiveQUIC(t, conns, "a second connection of the address on an idle box")
	holdUpstreams(t, c.Controller, 7) // 9 of 10: the high-water mark
	t.Run("past its client address's share under pressure it is closed with H3_EXCESSIVE_LOAD", func(t *testing.T) {
		if err := refusedExcessiveLoad(tryDialQUIC(t, "127.0.0.1", addr, roots)); err != nil {
			t.Error(err)
		}
		// Counted just after the close the client saw.
		testsupport.WaitFor(t, 10*time.Second, "scafo_edge_shed_total{reason=client_conns} to be 1", func() bool {
			return c.shed(t, "client_conns") == 1
		})
	})
	dialQUIC(t, "127.0.0.2", addr, roots)
	receiveQUIC(t, conns, "a connection of another address")
	t.Run("at the budget it is closed with H3_EXCESSIVE_LOAD", func(t *testing.T) {
		if err := refusedExcessiveLoad(tryDialQUIC(t, "127.0.0.3", addr, roots)); err != nil {
			t.Error(err)
		}
	})
	t.Run("HTTP/3 connections holding the budget do not keep TCP out", func(t *testing.T) {
		ln := c.Listener(listen(t))
		conns := acceptLoop(t, ln)
		client := dialFrom(t, "127.0.0.4", ln.Addr().String())
		accepted(t, conns, "a TCP connection while HTTP/3 holds the whole budget").Close()
		client.Close()
	})
	first.CloseWithError(0, "")
	second.CloseWithError(0, "")
	testsupport.WaitFor(t, 10*time.Second, "the closed connections to be given back", func() bool {
		s := c.Snapshot()
		return s.HTTP3Conns == 1 && s.Clients == 1
	})
	dialQUIC(t, "127.0.0.1", addr, roots)
	receiveQUIC(t, conns, "a connection of the first address once its others closed")
}

func receiveQUIC(t *testing.T, ch <-chan *quic.Conn, what string) *quic.Conn {
	t.Helper()
	select {
	case conn := <-ch:
		return conn
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not accepted within 10s", what)
		return nil
	}
}

// BenchmarkAdmit is one request of a client address and an application
// already known: Admit and Release allocate nothing.
func BenchmarkAdmit(b *testing.B) {
	c := newController(b, Options{Limits: testLimits(1000)})
	r := request("192.0.2.1:1234", "198.51.100.1")
	held, why := c.Admit(r, "app") // keeps the address's entry and the application
	if why != Admitted {
		b.Fatal(why)
	}
	defer held.Release()
	b.ReportAllocs()
	for b.Loop() {
		k, why := c.Admit(r, "app")
		if why != Admitted {
			b.Fatal(why)
		}
		k.Release()
	}
}

// BenchmarkAdmitParallel is BenchmarkAdmit from many goroutines, each its
// own client address, over four applications.
func BenchmarkAdmitParallel(b *testing.B) {
	c := newController(b, Options{Limits: testLimits(100000)})
	b.ReportAllocs()
	var next atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		n := next.Add(1)
		r := request(fmt.Sprintf("192.0.2.%d:1", n%250))
		app := fmt.Sprintf("app%d", n%4)
		held, _ := c.Admit(r, app)
		defer held.Release()
		for pb.Next() {
			k, why := c.Admit(r, app)
			if why != Admitted {
				b.Error(why)
				return
			}
			k.Release()
		}
	})
}

func TestAdmitAndReleaseAllocateNothingForAKnownClientAndApplication(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's bookkeeping allocates")
	}
	c := newController(t, Options{Limits: testLimits(1000), Proxies: testProxies, TrustedProxies: testProxies})
	// One as a server's connection carries it: noted on its connection.
	onConn := request("192.0.2.2:1234")
	onConn = onConn.WithContext(context.WithValue(onConn.Context(), connKey{}, &trackedConn{c: c.Controller}))
	for _, r := range []*http.Request{request("192.0.2.1:1234"), request("10.0.0.1:80", "198.51.100.1, 10.0.0.2"), onConn} {
		held, why := c.Admit(r, "app")
		if why != Admitted {
			t.Fatal(why)
		}
		allocs := testing.AllocsPerRun(1000, func() {
			k, _ := c.Admit(r, "app")
			k.Release()
		})
		held.Release()
		if allocs != 0 {
			t.Errorf("Admit and Release from %s allocate %v times, want 0", r.RemoteAddr, allocs)
		}
	}
}

func TestPastTheBudgetARequestIsRefusedOnlyBeyondTheOverdraft(t *testing.T) {
	t.Parallel()
	l := testLimits(4)
	l.Overdraft = 2
	l.AppShare = 1
	c := newController(t, Options{Limits: l})
	// upstream counts a connection to an upstream until the test ends.
	upstream := func() {
		a, b := net.Pipe()
		tracked := trackUpstream(t, c.Controller, a)
		t.Cleanup(func() { tracked.Close(); b.Close() })
	}
	// Four upstream connections spend the budget, and no client
	// connection is idle to give one back.
	for range 4 {
		upstream()
	}
	for i := range 2 {
		k, why := c.Admit(request(fmt.Sprintf("192.0.2.%d:1", i+1)), "app")
		if why != Admitted {
			t.Fatalf("request %d within the overdraft = %v, want admitted", i, why)
		}
		t.Cleanup(k.Release)
		upstream() // its upstream leg
	}
	if _, why := c.Admit(request("192.0.2.9:1"), "app"); why != RefusedBudget {
		t.Errorf("a request past the budget and the overdraft = %v, want %v", why, RefusedBudget)
	}
	if v := c.shed(t, "budget"); v != 1 {
		t.Errorf("scafo_edge_shed_total{reason=budget} = %v, want 1", v)
	}
}

// Each refusal logged says what happens, not only its reason.
func TestEveryRefusalLoggedHasAMessage(t *testing.T) {
	for r := RefusedMemory; r <= RefusedBudget; r++ {
		if r == RefusedCanceled {
			continue // the client went: nothing refused, nothing logged
		}
		if refusalMessages[r.String()] == "" {
			t.Errorf("refusal %q has no log message", r)
		}
	}
}
