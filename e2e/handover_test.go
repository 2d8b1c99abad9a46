package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/scafo/scafo-edge/certs/certstest"
	"github.com/scafo/scafo-edge/handover"
	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
	"github.com/scafo/scafo-edge/node/nodetest"
)

// handoverLoad keeps requests going to an edge's fixed addresses in every
// protocol while the process behind them is replaced, and counts.
type handoverLoad struct {
	stop chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	ok      map[string]int // answered, by protocol
	serials map[string]int // certificate serials seen over TLS
	slowest time.Duration
	errs    []string

	sent, refused, failed, retried atomic.Int64
}

// request is one protocol's way of sending one request: it returns the
// certificate serial ("" without TLS).
type request func(ctx context.Context) (serial string, err error)

func (l *handoverLoad) run(proto string, workers int, send request) {
	for range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				l.once(proto, send)
			}
		}()
	}
}

func (l *handoverLoad) once(proto string, send request) {
	l.sent.Add(1)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	serial, err := send(ctx)
	took := time.Since(start)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.slowest = max(l.slowest, took)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			l.refused.Add(1)
		} else {
			l.failed.Add(1)
		}
		if len(l.errs) < 10 {
			l.errs = append(l.errs, proto+": "+err.Error())
		}
		return
	}
	l.ok[proto]++
	if serial != "" {
		l.serials[serial]++
	}
}

func (l *handoverLoad) answered(proto string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ok[proto]
}

func (l *handoverLoad) halt() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// get sends a GET through rt and checks the upstream answered.
func get(ctx context.Context, rt http.RoundTripper, url, host string) (string, error) {
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Host = host
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("body: %w", err)
	}
	if resp.StatusCode != 200 || !strings.HasPrefix(string(b), "A /") {
		return "", fmt.Errorf("%s %s: %d %q", resp.Proto, host, resp.StatusCode, b)
	}
	if resp.TLS == nil || len(resp.TLS.PeerCertificates) == 0 {
		return "", nil
	}
	return resp.TLS.PeerCertificates[0].SerialNumber.String(), nil
}

// wsEchoServer is an upstream that echoes every WebSocket message.
func wsEchoServer(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		nc := websocket.NetConn(r.Context(), c, websocket.MessageText)
		defer nc.Close()
		io.Copy(nc, nc)
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestUpgradeUnderLoad replaces a running edge by a second process on the
// same state directory and addresses while HTTP/1.1 (new connections and
// kept-alive ones), HTTPS, HTTP/2 and HTTP/3 requests keep coming: no
// connection is refused, no request fails, the old process exits 0, the new
// one serves the certificate the old one had without an ACME order, says
// /readyz fresh before it has polled the node itself, and a WebSocket
// opened on the old process keeps echoing until the old one's shutdown
// timeout.
func TestUpgradeUnderLoad(t *testing.T) {
	httpPort, httpsPort, adminPort := testsupport.FreePort(t), testsupport.FreePort(t), testsupport.FreePort(t)
	p := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: httpPort, TLSPort: httpsPort})
	rootFile := pebbleRootFile(t, p)
	a, ws := app(t, "A"), wsEchoServer(t)
	n := nodetest.New(t, nodetest.Options{})
	n.SetDocument(&node.Document{V: 1, Routes: []node.Route{
		{Host: "shop.example", Application: "shop", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(a)}}},
		// Hosts under a wildcard key get no certificate: plain HTTP is
		// proxied for them, not redirected.
		{Host: "*.plain.example", Application: "plain", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(a)}}},
		{Host: "*.ws.example", Application: "ws", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(ws)}}},
	}})
	const shutdownTimeout = 3 * time.Second
	args := []string{"serve", "--node", n.URL(), "--poll-interval", "100ms", "--state-dir", t.TempDir(),
		"--tls", "acme", "--acme-ca", p.DirectoryURL, "--acme-ca-root", rootFile, "--cert-store", "local",
		"--http-addr", fmt.Sprintf("127.0.0.1:%d", httpPort), "--https-addr", fmt.Sprintf("127.0.0.1:%d", httpsPort),
		"--admin-addr", fmt.Sprintf("127.0.0.1:%d", adminPort), "--shutdown-timeout", shutdownTimeout.String()}
	old := startEdgeBinary(t, edgeBinary, nil, args...)
	waitEdgeReady(t, old)

	roots := p.IssuerRoots(t)
	httpURL := fmt.Sprintf("http://127.0.0.1:%d/", httpPort)
	httpsURL := fmt.Sprintf("https://127.0.0.1:%d/", httpsPort)
	tlsConf := &tls.Config{RootCAs: roots, ServerName: "shop.example"}
	// Each transport its own copy: one that speaks HTTP/2 adds h2 to the
	// config's NextProtos.
	h1 := &http.Transport{TLSClientConfig: tlsConf.Clone(), TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{}}
	h2 := &http.Transport{TLSClientConfig: tlsConf.Clone(), ForceAttemptHTTP2: true}
	h3 := &http3.Transport{
		TLSClientConfig: tlsConf.Clone(),
		Dial: func(ctx context.Context, _ string, tc *tls.Config, qc *quic.Config) (*quic.Conn, error) {
			return quic.DialAddr(ctx, fmt.Sprintf("127.0.0.1:%d", httpsPort), tc, qc)
		},
	}
	plain := &http.Transport{}
	fresh := &http.Transport{DisableKeepAlives: true, TLSClientConfig: tlsConf.Clone()}
	t.Cleanup(func() {
		for _, tr := range []*http.Transport{h1, h2, plain, fresh} {
			tr.CloseIdleConnections()
		}
		h3.Close()
	})
	// The first HTTPS request orders shop.example's certificate.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	serial, err := get(ctx, h2, httpsURL, "shop.example")
	if err != nil {
		t.Fatalf("first HTTPS request: %v\n%s", err, old.logText())
	}
	p.WaitOrderCount(t, 1)

	conn, _, err := websocket.Dial(ctx, httpURL, &websocket.DialOptions{Host: "echo.ws.example"})
	if err != nil {
		t.Fatalf("open WebSocket on the old edge: %v", err)
	}
	defer conn.CloseNow()
	echo := func(msg string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := conn.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			return err
		}
		_, got, err := conn.Read(ctx)
		if err == nil && string(got) != msg {
			err = fmt.Errorf("echo %q, want %q", got, msg)
		}
		return err
	}
	if err := echo("before"); err != nil {
		t.Fatalf("WebSocket on the old edge: %v", err)
	}

	ld := &handoverLoad{stop: make(chan struct{}), ok: map[string]int{}, serials: map[string]int{}}
	defer ld.halt()
	ld.run("HTTP/1.1 new connections", 2, func(ctx context.Context) (string, error) {
		return get(ctx, fresh, httpURL, "a.plain.example")
	})
	ld.run("HTTP/1.1 kept alive", 2, func(ctx context.Context) (string, error) {
		return get(ctx, plain, httpURL, "a.plain.example")
	})
	ld.run("HTTPS new connections", 2, func(ctx context.Context) (string, error) {
		return get(ctx, fresh, httpsURL, "shop.example")
	})
	ld.run("HTTPS HTTP/1.1 kept alive", 2, func(ctx context.Context) (string, error) {
		return get(ctx, h1, httpsURL, "shop.example")
	})
	ld.run("HTTP/2", 2, func(ctx context.Context) (string, error) {
		return get(ctx, h2, httpsURL, "shop.example")
	})
	ld.run("HTTP/3", 2, func(ctx context.Context) (string, error) {
		// A connection-level failure (a QUIC handshake the old edge
		// refused as it closed, a connection closed on its GOAWAY) sent
		// the GET nowhere or harmlessly: it is tried once more, as
		// browsers do, and counted.
		s, err := get(ctx, h3, httpsURL, "shop.example")
		if err != nil && ctx.Err() == nil {
			ld.retried.Add(1)
			s, err = get(ctx, h3, httpsURL, "shop.example")
		}
		return s, err
	})
	protos := []string{"HTTP/1.1 new connections", "HTTP/1.1 kept alive", "HTTPS new connections", "HTTPS HTTP/1.1 kept alive", "HTTP/2", "HTTP/3"}
	answeredEach := func(atLeast map[string]int, more int) func() error {
		return func() error {
			for _, proto := range protos {
				if got := ld.answered(proto); got < atLeast[proto]+more {
					ld.mu.Lock()
					defer ld.mu.Unlock()
					return fmt.Errorf("%s: %d answered; errors: %q", proto, got, ld.errs)
				}
			}
			return nil
		}
	}
	testsupport.WaitForNil(t, 30*time.Second, "every protocol answered by the old edge", answeredEach(nil, 10))

	// From now on the node does not answer: a fresh /readyz on the new
	// edge can only come from the document the old one handed over.
	n.SetStatus(http.StatusServiceUnavailable)
	replaced := time.Now()
	newEdge := startEdgeBinary(t, edgeBinary, nil, args...)
	if code, body := newEdge.admin(t, "/readyz"); code != 200 || !strings.HasPrefix(body, "ready: fresh") {
		t.Errorf("/readyz on the new edge = %d %q, want ready: fresh", code, body)
	}

	// The WebSocket, on the old process, keeps echoing until the old one's
	// shutdown timeout cuts it.
	var lastEcho time.Duration
	for i := 0; ; i++ {
		if err := echo(fmt.Sprintf("after the handover %d", i)); err != nil {
			break
		}
		lastEcho = time.Since(replaced)
		select {
		case <-old.done:
		case <-time.After(100 * time.Millisecond):
			continue
		}
		break
	}
	select {
	case <-old.done:
	case <-time.After(shutdownTimeout + 20*time.Second):
		t.Fatalf("old edge still running %v after the new one started\n%s", time.Since(replaced), old.logText())
	}
	oldExited := time.Since(replaced)
	if old.err != nil {
		t.Errorf("old edge exit: %v, want 0\n%s", old.err, old.output())
	}
	if lastEcho < shutdownTimeout/2 {
		t.Errorf("WebSocket on the old edge echoed until %v after the handover, want about the shutdown timeout (%v)", lastEcho, shutdownTimeout)
	}

	after := map[string]int{}
	for _, proto := range protos {
		after[proto] = ld.answered(proto)
	}
	testsupport.WaitForNil(t, 30*time.Second, "every protocol answered by the new edge alone", answeredEach(after, 10))
	ld.halt()

	ld.mu.Lock()
	defer ld.mu.Unlock()
	t.Logf("figures: one replacement under load: %d requests sent, %d refused, %d failed (%d HTTP/3 GETs tried twice), longest request %v; the WebSocket on the old edge echoed until %v after the new one started, the old exited 0 after %v; answered %v",
		ld.sent.Load(), ld.refused.Load(), ld.failed.Load(), ld.retried.Load(), ld.slowest.Round(time.Millisecond),
		lastEcho.Round(time.Millisecond), oldExited.Round(time.Millisecond), ld.ok)
	for name, e := range map[string]*runningEdge{"old": old, "new": newEdge} {
		for _, line := range strings.Split(e.logText(), "\n") {
			if strings.Contains(line, `"handover`) || strings.Contains(line, "handed over") {
				t.Logf("%s edge: %s", name, line)
			}
		}
	}
	if ld.refused.Load() != 0 || ld.failed.Load() != 0 {
		t.Errorf("refused %d, failed %d, want none: %v", ld.refused.Load(), ld.failed.Load(), ld.errs)
	}
	if len(ld.serials) != 1 || ld.serials[serial] == 0 {
		t.Errorf("certificate serials served: %v, want only %s", ld.serials, serial)
	}
	if got := p.OrderCount(); got != 1 {
		t.Errorf("Pebble orders = %d, want 1: the new edge must serve the old one's certificate from edge.db", got)
	}
	if got := newEdge.metric(t, "scafo_edge_handovers_total", testsupport.Labels{"result": "received"}); got != 1 {
		t.Errorf(`new edge's scafo_edge_handovers_total{result="received"} = %v, want 1`, got)
	}
	if !old.logged("handover: a new edge took the listening sockets") {
		t.Errorf("old edge did not log the handover\n%s", old.logText())
	}
}

// TestUpgradeFallsBackWhenTheOldEdgeDoesNotAnswer: something listens on the
// handover socket and never answers (an edge that hangs). The new edge says
// so in one line and starts the ordinary way.
func TestUpgradeFallsBackWhenTheOldEdgeDoesNotAnswer(t *testing.T) {
	state := t.TempDir()
	l, before := handoverSocket(t, state)
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	e := startEdge(t, "--routes-file", oneRoute(t), "--tls", "off", "--state-dir", state)
	waitEdgeReady(t, e)
	if got := e.countLogs("handover"); got != 1 {
		t.Errorf("%d handover log lines, want one saying it fell back\n%s", got, e.logText())
	}
	if !e.logged("binding the listeners") {
		t.Errorf("the fallback line does not say what the edge does instead\n%s", e.logText())
	}
	if got := e.metric(t, "scafo_edge_handovers_total", testsupport.Labels{"result": "fell_back"}); got != 1 {
		t.Errorf(`scafo_edge_handovers_total{result="fell_back"} = %v, want 1`, got)
	}
	assertOffers(t, state, before)
}

// TestStaleHandoverSocketDoesNotBlockStartUp: an edge that crashed left its
// handover socket behind; the next one starts at once and offers its own.
func TestStaleHandoverSocketDoesNotBlockStartUp(t *testing.T) {
	state := t.TempDir()
	l, before := handoverSocket(t, state)
	l.Close()
	start := time.Now()
	e := startEdge(t, "--routes-file", oneRoute(t), "--tls", "off", "--state-dir", state)
	waitEdgeReady(t, e)
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("start-up took %v with a stale handover socket", took)
	}
	if got := e.metric(t, "scafo_edge_handovers_total", testsupport.Labels{"result": "fell_back"}); got != 0 {
		t.Errorf(`scafo_edge_handovers_total{result="fell_back"} = %v, want 0: a stale socket is no peer`, got)
	}
	assertOffers(t, state, before)
}

// assertOffers checks the edge on state has put its own handover socket,
// owner-only, in place of the file that was there (before; nil: none).
func assertOffers(t *testing.T, state string, before os.FileInfo) {
	t.Helper()
	path := filepath.Join(state, handover.SocketFile)
	testsupport.WaitForNil(t, 10*time.Second, "the edge's own handover socket", func() error {
		fi, err := os.Lstat(path)
		switch {
		case err != nil:
			return err
		case before != nil && os.SameFile(fi, before):
			return errors.New("still the socket file that was there before the edge started")
		case fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600:
			return fmt.Errorf("mode %v, want a socket with 0600", fi.Mode())
		}
		return nil
	})
}

// oneRoute writes a one-route document for --routes-file.
func oneRoute(t *testing.T) string {
	t.Helper()
	return writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{
		{Host: "a.example", Application: "a", Upstreams: []node.Upstream{{Node: "n", Address: "127.0.0.1:1"}}},
	}})
}

// handoverSocket puts a socket file where an edge on state would offer its
// sockets, as another process would; it stays when the listener closes.
func handoverSocket(t *testing.T, state string) (*net.UnixListener, os.FileInfo) {
	t.Helper()
	path := filepath.Join(state, handover.SocketFile)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return l, fi
}

// TestShuttingDownEdgeHandsNothingOver: an edge told to stop (SIGTERM, as
// docker stop sends) stops offering its sockets before it closes them, so
// a successor started meanwhile finds nobody offering and binds its own,
// instead of being refused sockets already closed (and, had it taken them
// just before the signal, of being left without its release for the whole
// drain: serve hands off to a successor that got in first).
func TestShuttingDownEdgeHandsNothingOver(t *testing.T) {
	arrived := make(chan struct{}, 1)
	release := make(chan struct{})
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-release
		io.WriteString(w, "late")
	}))
	defer upstream.Close()
	defer close(release)

	state := t.TempDir()
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{
		{Host: "slow.example", Application: "slow", Upstreams: []node.Upstream{{Node: "n", Address: upstream.Listener.Addr().String()}}},
	}})
	e := startEdge(t, "--routes-file", routes, "--tls", "off", "--state-dir", state, "--shutdown-timeout", "20s")
	waitEdgeReady(t, e)
	assertOffers(t, state, nil)

	answered := make(chan string, 1)
	go func() {
		req, _ := http.NewRequest("GET", "http://"+e.HTTPAddr+"/", nil)
		req.Host = "slow.example"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		answered <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()
	select { // a request in flight keeps the edge draining
	case <-arrived:
	case got := <-answered:
		t.Fatalf("the request answered %q without reaching the upstream", got)
	case <-time.After(10 * time.Second):
		t.Fatal("the request never reached the upstream")
	}

	e.cmd.Process.Signal(syscall.SIGTERM)
	testsupport.WaitFor(t, 10*time.Second, "the edge to start shutting down", func() bool { return e.logged("shutting down") })

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tk, err := handover.Take(ctx, state, handover.Serves{HTTP: "127.0.0.1:0", HTTPS: "127.0.0.1:0", HTTP3: "127.0.0.1:0", Admin: "127.0.0.1:0"})
	if err == nil {
		tk.Sockets.Close()
		tk.Close()
		t.Fatal("a draining edge handed its sockets over; its successor would wait for edge.db until the drain ends")
	}
	if !errors.Is(err, handover.ErrNoPeer) {
		t.Errorf("Take from a draining edge: %v, want ErrNoPeer", err)
	}

	release <- struct{}{}
	select {
	case got := <-answered:
		if got != "200 late" {
			t.Errorf("the request in flight at SIGTERM got %q, want 200 late", got)
		}
	case <-time.After(10 * time.Second):
		t.Error("the request in flight at SIGTERM was never answered")
	}
	if err := e.stop(t); err != nil {
		t.Errorf("edge exit: %v", err)
	}
}

// TestASecondEdgeServingOtherAddressesTakesNothing: an edge started on the
// production state directory with other addresses (a debug instance, a typo
// in a port) is not an upgrade of the running edge. The running edge keeps
// its sockets and serves on, saying why once; the second one falls back to
// edge.db's lock and exits naming it, as before the handover existed.
func TestASecondEdgeServingOtherAddressesTakesNothing(t *testing.T) {
	state := t.TempDir()
	routes := oneRoute(t)
	first := startEdge(t, "--routes-file", routes, "--tls", "off", "--state-dir", state)
	waitEdgeReady(t, first)

	other := fmt.Sprintf("127.0.0.1:%d", testsupport.FreePort(t))
	code, out := runEdgeToExit(t, edgeBinary, nil, "--routes-file", routes, "--tls", "off", "--state-dir", state, "--http-addr", other)
	if code == 0 {
		t.Errorf("the second edge exited 0, want it to fail on edge.db's lock\n%s", out)
	}
	for _, want := range []string{"this edge serves http on " + first.HTTPAddr + "; the successor asks for " + other, "locked by another process"} {
		if !strings.Contains(out, want) {
			t.Errorf("the second edge's output lacks %q\n%s", want, out)
		}
	}
	// A route whose upstream refuses: 502 from the first edge, which still
	// holds its listener.
	if got, _ := first.get(t, "a.example", "/"); got != http.StatusBadGateway {
		t.Errorf("the first edge answered %d after the second one came and went, want 502 (still serving)", got)
	}
	if !first.logged("this edge serves http on") {
		t.Errorf("the first edge does not say why it kept its sockets\n%s", first.logText())
	}
	if got := first.metric(t, "scafo_edge_handovers_total", testsupport.Labels{"result": "given"}); got != 0 {
		t.Errorf(`scafo_edge_handovers_total{result="given"} = %v, want 0`, got)
	}
}

// TestAHandingOverEdgeDoesNotWaitOutASilentConnection: a connection that
// never sends its first request (a slowloris's, or a socket a browser
// opened ahead of need) keeps the edge handing over for a short wait only,
// not for the header timeout (60 s and more) nor the shutdown timeout.
func TestAHandingOverEdgeDoesNotWaitOutASilentConnection(t *testing.T) {
	const shutdownTimeout = 2 * time.Minute
	args := []string{"serve", "--routes-file", oneRoute(t), "--tls", "off", "--state-dir", t.TempDir(),
		"--http-addr", fmt.Sprintf("127.0.0.1:%d", testsupport.FreePort(t)),
		"--admin-addr", fmt.Sprintf("127.0.0.1:%d", testsupport.FreePort(t)),
		"--shutdown-timeout", shutdownTimeout.String(), "--read-header-timeout", "5m"}
	old := startEdgeBinary(t, edgeBinary, nil, args...)
	waitEdgeReady(t, old)

	silent, err := net.Dial("tcp", old.HTTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	testsupport.WaitFor(t, 10*time.Second, "the old edge to accept the silent connection", func() bool {
		return old.metric(t, "scafo_edge_conns", testsupport.Labels{"kind": "client"}) >= 1
	})

	replaced := time.Now()
	successor := startEdgeBinary(t, edgeBinary, nil, args...)
	waitEdgeReady(t, successor)
	select {
	case <-old.done:
	case <-time.After(shutdownTimeout / 2):
		t.Fatalf("the old edge still runs %v after its successor started, held by a connection that sent nothing\n%s", time.Since(replaced), old.logText())
	}
	t.Logf("figures: the old edge exited %v after its successor started, with a silent connection open", time.Since(replaced).Round(time.Millisecond))
	if old.err != nil {
		t.Errorf("the old edge exited with %v, want 0\n%s", old.err, old.output())
	}
	// The connection was the old edge's, and is closed with it.
	silent.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := silent.Read(make([]byte, 1)); err == nil {
		t.Errorf("the silent connection read %d bytes, want its end", n)
	}
}
