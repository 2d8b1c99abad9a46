package serving

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"testing"
	"time"

	proxyproto "github.com/pires/go-proxyproto"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

// pair returns a connection accepted through wrap(listener) and the client's
// end of it; the test's cleanup closes both.
func pair(t *testing.T, wrap func(net.Listener) net.Listener, from string) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := wrap(ln)
	t.Cleanup(func() { l.Close() })
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	client, err = d.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	select {
	case server = <-accepted:
	case <-time.After(10 * time.Second):
		t.Fatal("not accepted within 10s")
	}
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { server.Close() })
	return server, client
}

func TestAClientThatStopsReadingIsCutAfterTheSendTimeout(t *testing.T) {
	const d = 200 * time.Millisecond
	server, _ := pair(t, func(l net.Listener) net.Listener { return WithSendTimeout(l, d) }, "127.0.0.1")
	// The client never reads: once the socket buffers are full, a write
	// makes no progress and fails at the send timeout.
	buf := make([]byte, 1<<20)
	var err error
	for range 1000 { // bounded: the buffers hold a few MiB at most
		if _, err = server.Write(buf); err != nil {
			break
		}
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("writing to a client that stopped reading: %v, want a timeout", err)
	}
}

func TestAStreamThatKeepsFlowingIsNotCutBySendTimeout(t *testing.T) {
	const d = 200 * time.Millisecond
	server, client := pair(t, func(l net.Listener) net.Listener { return WithSendTimeout(l, d) }, "127.0.0.1")
	go io.Copy(io.Discard, client)
	// Writing for several send timeouts: each write renews the deadline.
	end := time.Now().Add(4 * d)
	for time.Now().Before(end) {
		if _, err := server.Write(make([]byte, 1024)); err != nil {
			t.Fatalf("a write to a client that reads: %v", err)
		}
		time.Sleep(d / 10) // paces the stream; nothing waits on it
	}
}

func TestZeroSendTimeoutLeavesTheListenerAsItIs(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if got := WithSendTimeout(ln, 0); got != ln {
		t.Error("WithSendTimeout(l, 0) wrapped l")
	}
	if got := WithProxyProtocol(ln, nil, time.Second); got != ln {
		t.Error("WithProxyProtocol(l, nil) wrapped l")
	}
}

func TestAPROXYHeaderIsTakenOnlyFromTrustedSources(t *testing.T) {
	trusted := []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}
	wrap := func(l net.Listener) net.Listener { return WithProxyProtocol(l, trusted, 5*time.Second) }
	header := proxyproto.HeaderProxyFromAddrs(1, &net.TCPAddr{IP: net.ParseIP("203.0.113.7"), Port: 4000}, &net.TCPAddr{IP: net.ParseIP("127.0.0.1"), Port: 80})

	t.Run("from a trusted source, the client is the address it carries", func(t *testing.T) {
		server, client := pair(t, wrap, "127.0.0.2")
		if _, err := header.WriteTo(client); err != nil {
			t.Fatal(err)
		}
		if got := server.RemoteAddr().String(); got != "203.0.113.7:4000" {
			t.Errorf("RemoteAddr = %s, want the PROXY header's 203.0.113.7:4000", got)
		}
	})
	t.Run("from anywhere else, the connection is closed", func(t *testing.T) {
		server, client := pair(t, wrap, "127.0.0.3")
		if _, err := header.WriteTo(client); err != nil {
			t.Fatal(err)
		}
		server.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := server.Read(make([]byte, 1)); err == nil {
			t.Error("read a connection whose untrusted peer sent a PROXY header, want it refused")
		}
	})
}

func TestAConnectionCancellingPastItsBudgetIsClosed(t *testing.T) {
	g := NewResetGuard(zerolog.Nop())
	server, client := pair(t, func(l net.Listener) net.Listener { return l }, "127.0.0.1")
	ctx := g.connContext(context.Background(), server)
	req := func(major int) *http.Request {
		r := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
		r.ProtoMajor = major
		return r
	}
	for range 3 * ResetBurst {
		g.Canceled(req(1)) // HTTP/1 cancels by closing: not counted
	}
	if ctx.Err() != nil {
		t.Fatal("HTTP/1 cancellations spent the HTTP/2 budget")
	}
	for range ResetBurst {
		g.Canceled(req(2))
	}
	if ctx.Err() != nil {
		t.Fatalf("the connection was closed within its burst of %d", ResetBurst)
	}
	// Past the burst, faster than the refill: a few more spend it, however
	// slowly a loaded machine runs this loop (the limiter refills in real
	// time, at ResetRefill a second).
	for i := 0; ctx.Err() == nil && i < 10*ResetBurst; i++ {
		g.Canceled(req(2))
	}
	if ctx.Err() == nil {
		t.Error("the requests on a connection past its budget were not cancelled")
	}
	client.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := client.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("client read %v, want the connection closed by the edge", err)
	}
	if n := g.closed.Load(); n != 1 {
		t.Errorf("%d connections closed, want 1", n)
	}
}

func TestResetGuardKeepsTheServersOwnConnContext(t *testing.T) {
	type own struct{}
	srv := &http.Server{ConnContext: func(ctx context.Context, c net.Conn) context.Context {
		return context.WithValue(ctx, own{}, c)
	}}
	NewResetGuard(zerolog.Nop()).Configure(srv)
	server, _ := pair(t, func(l net.Listener) net.Listener { return l }, "127.0.0.1")
	ctx := srv.ConnContext(context.Background(), server)
	if ctx.Value(own{}) != server {
		t.Error("the server's own ConnContext was dropped")
	}
	if cc, _ := ctx.Value(clientConnKey{}).(*clientConn); cc == nil || cc.conn != server {
		t.Error("the guard's budget is missing from the connection's context")
	}
}

func TestHTTPSResponsesAdvertiseHTTP3(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := testsupport.SelfSigned(t)
	h3, err := NewHTTP3(pc.LocalAddr(), pc, nil, &tls.Config{Certificates: []tls.Certificate{cert}}, http.NotFoundHandler(), 1<<16, time.Minute, nil)
	if err != nil {
		t.Fatal(err)
	}
	if h3.Conn() != pc {
		t.Error("NewHTTP3 did not serve on the socket it was handed")
	}
	served := make(chan error, 1)
	go func() { served <- h3.Serve() }()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		h3.Shutdown(ctx, zerolog.Nop())
		if err := <-served; err != nil {
			t.Errorf("Serve after Shutdown: %v, want nil", err)
		}
	}()
	advertised := h3.Advertise(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	testsupport.WaitFor(t, 10*time.Second, "an HTTPS response to carry Alt-Svc", func() bool {
		rec := httptest.NewRecorder()
		advertised.ServeHTTP(rec, httptest.NewRequest("GET", "https://a.example/", nil))
		return rec.Header().Get("Alt-Svc") != ""
	})
}

func TestSpreadStretchesOnlyDeadlinesStillToCome(t *testing.T) {
	now := time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC)
	c := &spreadConn{stretch: 1.25}
	for _, tc := range []struct {
		name     string
		in, want time.Time
	}{
		{"none", time.Time{}, time.Time{}},
		{"in the past: a read aborted at once", time.Unix(1, 0), time.Unix(1, 0)},
		{"now", now, now},
		{"ten seconds on", now.Add(10 * time.Second), now.Add(12500 * time.Millisecond)},
		{"as far as time goes: stretched, it would wrap into the past", now.Add(math.MaxInt64), now.Add(math.MaxInt64)},
	} {
		if got := c.spread(tc.in, now); !got.Equal(tc.want) {
			t.Errorf("%s: spread(%v) = %v, want %v", tc.name, tc.in, got, tc.want)
		}
	}
}

// TestConnectionsOpenedTogetherTimeOutApart opens connections together
// that never finish their headers: each is closed at or after the server's
// header timeout, and not all at once.
func TestConnectionsOpenedTogetherTimeOutApart(t *testing.T) {
	const timeout = 300 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: timeout}
	go srv.Serve(WithSpreadDeadlines(ln))
	t.Cleanup(func() { srv.Close() })

	const n = 30
	type end struct {
		after time.Duration
		err   error
	}
	ends := make(chan end, n)
	for range n {
		// Before the dial: the server may accept the connection and set its
		// deadline before Dial returns.
		opened := time.Now()
		c, err := net.DialTimeout("tcp", ln.Addr().String(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: a.example\r\nX-Slow: "); err != nil {
			t.Fatal(err)
		}
		go func() {
			c.SetReadDeadline(time.Now().Add(10 * time.Second)) // the test's bound, far past any spread
			_, err := io.Copy(io.Discard, c)
			ends <- end{time.Since(opened), err}
		}()
	}
	first, last := time.Duration(1<<62), time.Duration(0)
	for range n {
		e := <-ends
		if e.err != nil {
			t.Fatalf("a slow connection was not closed by the server: %v", e.err)
		}
		first, last = min(first, e.after), max(last, e.after)
	}
	t.Logf("closed between %v and %v after opening", first.Round(time.Millisecond), last.Round(time.Millisecond))
	if first < timeout {
		t.Errorf("a connection was closed %v after opening, before the %v header timeout", first, timeout)
	}
	// Stretched by factors from [1, 1.5), thirty deadlines all within a
	// sixth of the timeout of each other is a chance of about 1e-13.
	if last-first < timeout/6 {
		t.Errorf("closes spread over %v only, want at least %v: the deadlines were not spread", last-first, timeout/6)
	}
}
