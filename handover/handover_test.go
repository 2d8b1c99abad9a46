package handover

import (
	"bufio"
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

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(takeAsChildEnv); dir != "" {
		os.Exit(takeAsChild(dir))
	}
	if dir := os.Getenv(silentAsChildEnv); dir != "" {
		os.Exit(silentAsChild(dir))
	}
	goleak.VerifyTestMain(m)
}

const testDoc = `{"v":1,"routes":[{"host":"app.example","application":"app","upstreams":[{"node":"n1","address":"127.0.0.1:1"}]}]}`

// process is one in-process "edge": three TCP listeners and a UDP socket,
// each TCP one answering with the process's name.
type process struct {
	name    string
	socks   Sockets
	gate    Gate
	servers []*http.Server
	served  sync.WaitGroup
}

// bindProcess binds fresh loopback sockets, as an edge starting cold does.
func bindProcess(t *testing.T, name string) *process {
	t.Helper()
	var s Sockets
	for _, dst := range []*net.Listener{&s.HTTP, &s.HTTPS, &s.Admin} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		*dst = l
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.HTTP3 = pc
	return &process{name: name, socks: s}
}

// serve answers on every TCP socket with p's name until shutdown.
func (p *process) serve(t *testing.T) {
	t.Helper()
	for _, l := range []net.Listener{p.socks.HTTP, p.socks.HTTPS, p.socks.Admin} {
		srv := &http.Server{
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.WriteString(w, p.name)
			}),
			ConnState: p.gate.ConnState,
		}
		p.servers = append(p.servers, srv)
		p.served.Add(1)
		gl := p.gate.Listener(l)
		go func() {
			defer p.served.Done()
			srv.Serve(gl)
		}()
	}
	t.Cleanup(p.shutdown)
}

// shutdown stops p accepting, waits for the connections it accepted to
// send their first request, then shuts its servers down, as an edge handing
// over does; the sockets stay open wherever a successor holds them.
func (p *process) shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p.gate.Stop()
	p.gate.Wait(ctx)
	for _, srv := range p.servers {
		srv.Shutdown(ctx)
	}
	p.served.Wait()
	p.socks.Close()
}

// load keeps dialling new connections and sending requests on kept-alive
// ones to addr, and counts what happened.
type load struct {
	t                       *testing.T
	dialed, refused, failed atomic.Int64
	mu                      sync.Mutex
	by                      map[string]int // responses by body
	stop                    chan struct{}
	wg                      sync.WaitGroup
}

func startLoad(t *testing.T, addr string) *load {
	t.Helper()
	ld := &load{t: t, by: map[string]int{}, stop: make(chan struct{})}
	// Fresh connections: every attempt is a new TCP handshake. Each
	// goroutine has one connection in flight at a time.
	for range 8 {
		ld.wg.Add(1)
		go func() {
			defer ld.wg.Done()
			for !ld.stopped() {
				ld.once(addr)
			}
		}()
	}
	// Kept-alive connections: the old process closes them when it stops;
	// the client's retry of an idempotent request on a reused connection
	// must carry them over.
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	for range 2 {
		ld.wg.Add(1)
		go func() {
			defer ld.wg.Done()
			for !ld.stopped() {
				resp, err := client.Get("http://" + addr + "/")
				if err != nil {
					ld.failed.Add(1)
					t.Errorf("keep-alive request: %v", err)
					continue
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				ld.record(string(body), err)
			}
		}()
	}
	t.Cleanup(func() {
		ld.halt()
		tr.CloseIdleConnections()
	})
	return ld
}

func (ld *load) stopped() bool {
	select {
	case <-ld.stop:
		return true
	default:
		return false
	}
}

func (ld *load) halt() {
	select {
	case <-ld.stop:
	default:
		close(ld.stop)
	}
	ld.wg.Wait()
}

func (ld *load) once(addr string) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			ld.refused.Add(1)
		} else {
			ld.failed.Add(1)
		}
		ld.t.Errorf("dial: %v", err)
		return
	}
	defer c.Close()
	ld.dialed.Add(1)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		ld.record("", fmt.Errorf("read response: %w", err))
		return
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		err = fmt.Errorf("read body: %w", err)
	}
	ld.record(string(body), err)
}

func (ld *load) record(body string, err error) {
	if err != nil {
		ld.failed.Add(1)
		ld.t.Errorf("request: %v", err)
		return
	}
	ld.mu.Lock()
	ld.by[body]++
	ld.mu.Unlock()
}

func (ld *load) count(body string) int {
	ld.mu.Lock()
	defer ld.mu.Unlock()
	return ld.by[body]
}

func testUpdate(t *testing.T) *node.Update {
	t.Helper()
	doc, err := node.Parse([]byte(testDoc))
	if err != nil {
		t.Fatal(err)
	}
	return &node.Update{Doc: doc, Body: []byte(testDoc), Fingerprint: node.Fingerprint([]byte(testDoc)), FetchedAt: time.Date(2026, 12, 1, 11, 0, 0, 0, time.UTC)}
}

func listen(t *testing.T, dir string) *Offer {
	t.Helper()
	o, err := Listen(dir, zerolog.Nop())
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() { o.Close() })
	return o
}

// wait runs o.Wait in the background.
func wait(t *testing.T, o *Offer, socks Sockets) <-chan *Handoff {
	t.Helper()
	got := make(chan *Handoff, 1)
	go func() {
		h, err := o.Wait(context.Background(), socks)
		if err != nil {
			close(got)
			return
		}
		got <- h
	}()
	return got
}

// handOver runs the exchange between a fresh old process (not serving)
// and a successor on dir; everything is closed when the test ends.
func handOver(t *testing.T, dir string) (*process, *Taken, *Handoff) {
	t.Helper()
	old := bindProcess(t, "old")
	t.Cleanup(func() { old.socks.Close() })
	handoffs := wait(t, listen(t, dir), old.socks)
	tk := take(t, dir)
	t.Cleanup(func() { tk.Sockets.Close() })
	h := <-handoffs
	if h == nil {
		t.Fatal("Wait returned no handoff")
	}
	t.Cleanup(func() { h.Close() })
	return old, tk, h
}

func take(t *testing.T, dir string) *Taken {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tk, err := Take(ctx, dir, loopbackServes)
	if err != nil {
		t.Fatalf("Take: %v", err)
	}
	t.Cleanup(func() { tk.Close() })
	return tk
}

func TestHandoverRefusesNoConnection(t *testing.T) {
	dir := t.TempDir()
	old := bindProcess(t, "old")
	old.serve(t)
	addr := old.socks.HTTP.Addr().String()
	offer := listen(t, dir)
	handoffs := wait(t, offer, old.socks)

	ld := startLoad(t, addr)
	testsupport.WaitFor(t, 5*time.Second, "requests answered by the old process", func() bool { return ld.count("old") >= 20 })

	tk := take(t, dir)
	h := <-handoffs
	if h == nil {
		t.Fatal("Wait returned no handoff")
	}
	defer h.Close()
	for role, pair := range map[string][2]net.Addr{
		"http":  {tk.Sockets.HTTP.Addr(), old.socks.HTTP.Addr()},
		"https": {tk.Sockets.HTTPS.Addr(), old.socks.HTTPS.Addr()},
		"admin": {tk.Sockets.Admin.Addr(), old.socks.Admin.Addr()},
		"http3": {tk.Sockets.HTTP3.LocalAddr(), old.socks.HTTP3.LocalAddr()},
	} {
		if pair[0].String() != pair[1].String() {
			t.Errorf("%s socket taken at %s, want the old one's %s", role, pair[0], pair[1])
		}
	}

	// The old process lets go. Until the new one accepts, new connections
	// are queued by the kernel, not refused: some are dialled in that gap
	// (while the old one stops its work), with their requests, and
	// answered by the new process.
	var (
		mu     sync.Mutex
		events []string
		queued []net.Conn
	)
	event := func(e string) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}
	defer func() {
		for _, c := range queued {
			c.Close()
		}
	}()
	ran := make(chan error, 1)
	go func() {
		ran <- h.Run(Steps{
			StopAccepting: func() { event("stop accepting"); old.gate.Stop() },
			Settle:        func(ctx context.Context) error { event("settle"); return old.gate.Wait(ctx) },
			StopWork: func() *node.Update {
				event("stop work")
				for range 4 {
					c, err := net.DialTimeout("tcp", addr, 5*time.Second)
					if err != nil {
						t.Errorf("dial while nobody accepts: %v", err)
						continue
					}
					fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
					queued = append(queued, c)
				}
				return testUpdate(t)
			},
			CloseState: func() error { event("close state"); return nil },
			StopHTTP3: func(ctx context.Context) {
				event("stop http3")
				select {
				case <-tk.http3:
					t.Error("the successor was told HTTP/3 was released before it was")
				default:
				}
				old.socks.HTTP3.Close()
			},
		})
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	doc, err := tk.Released(ctx)
	if err != nil {
		t.Fatalf("Released: %v", err)
	}
	event("successor: released")
	if doc == nil || doc.Fingerprint != node.Fingerprint([]byte(testDoc)) || doc.Stale || !doc.FetchedAt.Equal(testUpdate(t).FetchedAt) {
		t.Fatalf("Released document = %+v, want the handed-over one, fresh", doc)
	}
	if err := tk.HTTP3Released(ctx); err != nil {
		t.Fatalf("HTTP3Released: %v", err)
	}
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}
	mu.Lock()
	got := strings.Join(events, ", ")
	mu.Unlock()
	if want := "stop accepting, settle, stop work, close state, successor: released, stop http3"; got != want && got != strings.Replace(want, "successor: released, stop http3", "stop http3, successor: released", 1) {
		t.Errorf("steps: %s\nwant: %s", got, want)
	}
	old.shutdown()
	successor := &process{name: "new", socks: tk.Sockets}
	successor.serve(t)
	for _, c := range queued {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		b, err := io.ReadAll(c)
		if err != nil || !strings.HasSuffix(string(b), "\r\n\r\nnew") {
			t.Errorf("connection dialled while nobody accepted: %q, %v; want an answer from the new process", b, err)
		}
	}
	testsupport.WaitFor(t, 5*time.Second, "requests answered by the new process", func() bool { return ld.count("new") >= 20 })
	ld.halt()

	// The UDP socket is the same socket: a datagram to the old address
	// reaches the new process.
	sender, err := net.Dial("udp", tk.Sockets.HTTP3.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer sender.Close()
	sender.Write([]byte("ping"))
	tk.Sockets.HTTP3.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 16)
	n, _, err := tk.Sockets.HTTP3.ReadFrom(buf)
	if err != nil || string(buf[:n]) != "ping" {
		t.Fatalf("datagram on the inherited UDP socket: %q, %v", buf[:n], err)
	}

	t.Logf("figures: %d connections dialled, %d refused, %d failed; answered by old %d, by new %d",
		ld.dialed.Load(), ld.refused.Load(), ld.failed.Load(), ld.count("old"), ld.count("new"))
	if r, f := ld.refused.Load(), ld.failed.Load(); r != 0 || f != 0 {
		t.Errorf("refused %d, failed %d; want none", r, f)
	}
	if _, err := os.Lstat(filepath.Join(dir, SocketFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("handover socket after the handoff: %v, want it removed until the new edge offers", err)
	}
}

func TestTakeWithoutPeer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, path string)
	}{
		{"no socket file means no peer", func(t *testing.T, path string) {}},
		{"a stale socket left by a crashed edge means no peer", func(t *testing.T, path string) {
			l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			l.SetUnlinkOnClose(false)
			l.Close()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, SocketFile)
			tc.setup(t, path)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			tk, err := Take(ctx, dir, loopbackServes)
			if !errors.Is(err, ErrNoPeer) {
				if tk != nil {
					tk.Close()
				}
				t.Fatalf("Take = %v, want ErrNoPeer", err)
			}
			// The new edge's own offer replaces whatever is there.
			o := listen(t, dir)
			fi, err := os.Lstat(path)
			if err != nil {
				t.Fatal(err)
			}
			if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
				t.Errorf("handover socket mode %v, want a socket with 0600", fi.Mode())
			}
			o.Close()
			if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("after Close: %v, want the socket file removed", err)
			}
		})
	}
}

func TestTakeFailsCleanly(t *testing.T) {
	for _, tc := range []struct {
		name string
		peer func(c *net.UnixConn) // what the peer does with a connection
		want string                // in Take's error
	}{
		{"a peer that never answers times out", func(c *net.UnixConn) {
			io.Copy(io.Discard, c)
		}, "deadline exceeded"},
		{"a peer that hangs up fails", func(c *net.UnixConn) {
			c.Close()
		}, "handover with the edge"},
		{"a peer speaking another protocol refuses", func(c *net.UnixConn) {
			readFrame(c)
			writeFrame(c, frame{Kind: kindRefused, Error: "want scafo-edge-handover/9"}, nil)
			io.Copy(io.Discard, c)
		}, "refused"},
		{"a peer sending garbage fails", func(c *net.UnixConn) {
			readFrame(c)
			c.Write([]byte{0xff, 0xff, 0xff, 0xff})
			io.Copy(io.Discard, c)
		}, "announced"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l, err := net.ListenUnix("unix", &net.UnixAddr{Name: filepath.Join(dir, SocketFile), Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			var peers sync.WaitGroup
			peers.Add(1)
			go func() {
				defer peers.Done()
				c, err := l.AcceptUnix()
				if err != nil {
					return
				}
				defer c.Close()
				tc.peer(c)
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			start := time.Now()
			tk, err := Take(ctx, dir, loopbackServes)
			if tk != nil {
				tk.Close()
				t.Fatal("Take succeeded against a broken peer")
			}
			if err == nil || errors.Is(err, ErrNoPeer) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Take = %v, want an error (not ErrNoPeer) mentioning %q", err, tc.want)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("Take took %v, want it bounded by its context", d)
			}
			l.Close()
			peers.Wait()
		})
	}
}

func TestOfferSurvivesAFailedSuccessor(t *testing.T) {
	dir := t.TempDir()
	old := bindProcess(t, "old")
	old.serve(t)
	offer := listen(t, dir)
	handoffs := wait(t, offer, old.socks)

	// A successor that gets the sockets and dies before its ack.
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: offer.Path(), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	if err := writeFrame(c, frame{Kind: kindHello, Protocol: protocol, Serves: &loopbackServes}, nil); err != nil {
		t.Fatal(err)
	}
	f, fds, err := readFrame(c)
	if err != nil || f.Kind != kindSockets || len(fds) != 4 {
		t.Fatalf("sockets frame = %+v with %d descriptors, %v", f, len(fds), err)
	}
	closeFDs(fds)
	c.Close()

	// The old process still serves, and the offer still stands.
	resp, err := http.Get("http://" + old.socks.HTTP.Addr().String())
	if err != nil {
		t.Fatalf("old process after a failed successor: %v", err)
	}
	resp.Body.Close()
	tk := take(t, dir)
	h := <-handoffs
	if h == nil {
		t.Fatal("no handoff to the second successor")
	}
	h.Close()
	tk.Sockets.Close()
}

func TestOldEdgeGoneBeforeRelease(t *testing.T) {
	old, tk, h := handOver(t, t.TempDir())
	old.socks.Close()
	h.Close() // the old edge dies without a word

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if doc, err := tk.Released(ctx); !errors.Is(err, ErrPeerGone) || doc != nil {
		t.Errorf("Released = %v, %v; want nil, ErrPeerGone", doc, err)
	}
	if err := tk.HTTP3Released(ctx); !errors.Is(err, ErrPeerGone) {
		t.Errorf("HTTP3Released = %v, want ErrPeerGone", err)
	}
	// The sockets outlive the old process: the new one serves on them.
	successor := &process{name: "new", socks: tk.Sockets}
	successor.serve(t)
	resp, err := http.Get("http://" + tk.Sockets.HTTP.Addr().String())
	if err != nil {
		t.Fatalf("new process on inherited socket: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "new" {
		t.Errorf("answered by %q, want new", body)
	}
}

func TestPartialSockets(t *testing.T) {
	// An edge with --tls off and no HTTP/3 hands over only what it has.
	dir := t.TempDir()
	http1, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer http1.Close()
	admin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	offer := listen(t, dir)
	handoffs := wait(t, offer, Sockets{HTTP: http1, Admin: admin})
	tk := take(t, dir)
	defer tk.Sockets.Close()
	if h := <-handoffs; h != nil {
		h.Close()
	}
	if tk.Sockets.HTTPS != nil || tk.Sockets.HTTP3 != nil || tk.Sockets.HTTP == nil || tk.Sockets.Admin == nil {
		t.Errorf("taken sockets = %+v, want HTTP and admin only", tk.Sockets)
	}
}

func TestOfferRefusesWhatItCannotHand(t *testing.T) {
	// A wrapper is not a socket: the offer refuses rather than handing an
	// edge half its listeners, and the successor falls back.
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	offer := listen(t, dir)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := offer.Wait(ctx, Sockets{HTTP: struct{ net.Listener }{l}})
		done <- err
	}()
	tctx, tcancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer tcancel()
	if tk, err := Take(tctx, dir, loopbackServes); err == nil || errors.Is(err, ErrNoPeer) {
		if tk != nil {
			tk.Close()
		}
		t.Errorf("Take = %v, want a refusal", err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Wait after cancel = %v, want context.Canceled", err)
	}
}

func TestCloseKeepsASuccessorsSocket(t *testing.T) {
	dir := t.TempDir()
	first := listen(t, dir)
	second := listen(t, dir) // the successor's offer takes the path
	first.Close()
	c, err := net.Dial("unix", second.Path())
	if err != nil {
		t.Fatalf("successor's socket after the first offer closed: %v", err)
	}
	c.Close()
}

func TestNoDescriptorLeaks(t *testing.T) {
	dir := t.TempDir()
	before := openFDs(t)
	for range 3 {
		old := bindProcess(t, "old")
		offer := listen(t, dir)
		handoffs := wait(t, offer, old.socks)
		tk := take(t, dir)
		h := <-handoffs
		h.release(nil)
		h.releaseHTTP3()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if doc, err := tk.Released(ctx); doc != nil || err != nil {
			t.Errorf("Released = %v, %v; want nil, nil", doc, err)
		}
		tk.HTTP3Released(ctx)
		cancel()
		h.Close()
		tk.Close()
		tk.Sockets.Close()
		old.socks.Close()
	}
	if after := openFDs(t); after > before {
		t.Errorf("%d descriptors open after three handovers, %d before", after, before)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("no /proc/self/fd: %v", err)
	}
	return len(ents)
}

func TestSameAddr(t *testing.T) {
	tcp := func(s string) net.Addr {
		a, err := net.ResolveTCPAddr("tcp", s)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	for _, tc := range []struct {
		name string
		want string
		have net.Addr
		same bool
	}{
		{"an empty host matches every address", ":80", tcp("[::]:80"), true},
		{"0.0.0.0 matches the dual-stack wildcard", "0.0.0.0:80", tcp("[::]:80"), true},
		{"another port differs", ":8080", tcp("[::]:80"), false},
		{"port 0 takes whatever the old edge had", "127.0.0.1:0", tcp("127.0.0.1:4321"), true},
		{"a named host is resolved", "localhost:9180", tcp("127.0.0.1:9180"), true},
		{"loopback does not match the wildcard", "127.0.0.1:80", tcp("[::]:80"), false},
		{"the wildcard does not match loopback", ":80", tcp("127.0.0.1:80"), false},
		{"a malformed flag matches nothing", "80", tcp("[::]:80"), false},
		{"a named port is looked up", ":http", tcp("[::]:80"), true},
		{"no socket matches nothing", ":80", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := SameAddr(tc.want, tc.have); got != tc.same {
				t.Errorf("SameAddr(%q, %v) = %v, want %v", tc.want, tc.have, got, tc.same)
			}
		})
	}
}

func TestRequestsWaitsForTunnels(t *testing.T) {
	var reqs Requests
	hijacked := make(chan struct{})
	release := make(chan struct{})
	srv := &http.Server{Handler: reqs.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		close(hijacked)
		<-release // the tunnel runs until here
	}))}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	defer srv.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	<-hijacked

	// Shutdown forgets the hijacked connection at once; Requests does not.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	short, cancelShort := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancelShort()
	if err := reqs.Wait(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with a tunnel open = %v, want the deadline", err)
	}
	close(release)
	if err := reqs.Wait(ctx); err != nil {
		t.Fatalf("Wait after the tunnel closed = %v", err)
	}
}

func TestGateAnswersAConnectionAcceptedBeforeStop(t *testing.T) {
	var gate Gate
	srv := &http.Server{
		Handler:     gate.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "answered") })),
		ConnState:   gate.ConnState,
		ConnContext: gate.ConnContext,
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(gate.Listener(l)) }()

	// A client connected, its request not yet sent: with a bare Shutdown
	// now, net/http would drop the request when it arrives.
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	testsupport.WaitFor(t, 5*time.Second, "the connection to be accepted", func() bool {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return gate.Wait(ctx) != nil
	})
	gate.Stop()
	if _, err := net.DialTimeout("tcp", l.Addr().String(), time.Second); err == nil {
		t.Error("dial after Stop succeeded, want the socket closed (no successor holds it)")
	}
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := gate.Wait(ctx); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve = %v, want ErrServerClosed (a stopped gate is not a failed listener)", err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("response to the request sent after Stop: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "answered" {
		t.Errorf("body %q, want answered", body)
	}
}

// heldListener hands out a connection only when told to, even after it
// is closed: a connection the kernel gave an Accept that Stop interrupts.
type heldListener struct {
	net.Listener
	entered chan struct{}
	give    chan net.Conn
}

func (l *heldListener) Accept() (net.Conn, error) {
	l.entered <- struct{}{}
	c, ok := <-l.give
	if !ok {
		return nil, net.ErrClosed
	}
	return c, nil
}

func TestGateWaitsForAnAcceptStopInterrupted(t *testing.T) {
	var gate Gate
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held := &heldListener{Listener: l, entered: make(chan struct{}, 1), give: make(chan net.Conn)}
	gl := gate.Listener(held)
	accepted := make(chan net.Conn, 1)
	go func() {
		// As a server's Serve does: accept until the end.
		for {
			c, err := gl.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	<-held.entered
	gate.Stop()

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if gate.Wait(cancelled) == nil {
		t.Fatal("Wait said the arrivals were over while an Accept could still hand out a connection")
	}
	// Stop closed l; any connection will do as the one the kernel gave.
	client, peer := net.Pipe()
	defer peer.Close()
	defer client.Close()
	held.give <- client
	c := <-accepted
	if c == nil {
		t.Fatal("Accept returned no connection")
	}
	if gate.Wait(cancelled) == nil {
		t.Fatal("Wait said the arrivals were over before the server saw the connection")
	}
	// The server reports it new, then answered.
	gate.ConnState(c, http.StateNew)
	gate.ConnState(c, http.StateIdle)
	// The listener may hold more it accepted before the stop, until its
	// Accept says it has ended.
	<-held.entered
	if gate.Wait(cancelled) == nil {
		t.Fatal("Wait said the arrivals were over before the stopped listener's Accept ended")
	}
	close(held.give)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := gate.Wait(ctx); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	gl.Close()
}

// An HTTP/1 server reports a connection active before it checks whether
// it is shutting down, and drops the request if it is: the gate waits for
// the request to reach the handler.
func TestGateWaitsForTheFirstRequestToReachTheHandler(t *testing.T) {
	var gate Gate
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gl := gate.Listener(l)
	defer gl.Close()
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, err := gl.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	gate.ConnState(c, http.StateNew)
	gate.Stop()
	// As Serve does, accept again: the stopped listener ends (and blocks
	// until closed).
	go gl.Accept()
	gate.ConnState(c, http.StateActive)

	// Long past the quiet time the request is still between the server's
	// read and its handler.
	c.(*gateConn).last.Store(time.Now().Add(-time.Hour).UnixNano())
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if gate.Wait(cancelled) == nil {
		t.Fatal("Wait returned while a request read was yet to reach the handler")
	}
	reached := false
	h := gate.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached = true }))
	r := httptest.NewRequest("GET", "/", nil)
	h.ServeHTTP(httptest.NewRecorder(), r.WithContext(gate.ConnContext(r.Context(), c)))
	if !reached {
		t.Fatal("Handler did not call the handler it wraps")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := gate.Wait(ctx); err != nil {
		t.Fatalf("Wait after the request reached the handler: %v", err)
	}
}

func TestReleasedDocumentKeepsItsStaleMark(t *testing.T) {
	for _, stale := range []bool{false, true} {
		t.Run(fmt.Sprintf("stale=%v", stale), func(t *testing.T) {
			_, tk, h := handOver(t, t.TempDir())
			u := testUpdate(t)
			u.Stale = stale
			if err := h.release(u); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			doc, err := tk.Released(ctx)
			if err != nil || doc == nil {
				t.Fatalf("Released = %v, %v", doc, err)
			}
			if doc.Stale != stale || doc.Fingerprint != u.Fingerprint || len(doc.Doc.Routes) != 1 {
				t.Errorf("Released document stale=%v fingerprint %.12s, want stale=%v fingerprint %.12s", doc.Stale, doc.Fingerprint, stale, u.Fingerprint)
			}
		})
	}
}

func TestRunGoesOnWhenAStepFails(t *testing.T) {
	_, tk, h := handOver(t, t.TempDir())
	err := h.Run(Steps{
		StopAccepting: func() {},
		// A client that connected and never sent a request.
		Settle:        func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() },
		SettleTimeout: 10 * time.Millisecond,
		StopWork:      func() *node.Update { return nil },
		CloseState:    func() error { return errors.New("disk on fire") },
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if doc, err := tk.Released(ctx); doc != nil || err != nil {
		t.Errorf("Released = %v, %v; want nil, nil", doc, err)
	}
	if err := tk.HTTP3Released(ctx); err != nil {
		t.Errorf("HTTP3Released = %v, want nil (no HTTP/3 is released at once)", err)
	}
}

func TestRequestsWaitUnderConcurrentRequests(t *testing.T) {
	var reqs Requests
	release := make(chan struct{})
	h := reqs.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	var running sync.WaitGroup
	for range 50 {
		running.Add(1)
		go func() {
			defer running.Done()
			h.ServeHTTP(nil, nil)
		}()
	}
	testsupport.WaitFor(t, 5*time.Second, "50 requests in flight", func() bool { return reqs.n.Load() == 50 })
	waited := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		waited <- reqs.Wait(ctx)
	}()
	close(release)
	if err := <-waited; err != nil {
		t.Fatalf("Wait = %v, want nil once all 50 ended", err)
	}
	running.Wait()
}

func BenchmarkRequestsHandler(b *testing.B) {
	var reqs Requests
	h := reqs.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			h.ServeHTTP(nil, nil)
		}
	})
}

// net/http skips the ConnState hook when it hands a connection to HTTP/2;
// the HTTP/2 server reports its states itself. An open HTTP/2 connection
// must not hold the gate until the settle timeout.
func TestGateSettlesWithHTTP2ConnectionsOpen(t *testing.T) {
	var gate Gate
	srv := httptest.NewUnstartedServer(named("h2"))
	srv.EnableHTTP2 = true
	srv.Config.ConnState = gate.ConnState
	srv.Listener = gate.Listener(srv.Listener)
	srv.StartTLS()
	defer srv.Close()
	c := srv.Client()
	resp, err := c.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Fatalf("negotiated %s, want HTTP/2", resp.Proto)
	}
	gate.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := gate.Wait(ctx); err != nil {
		t.Errorf("Wait with an idle HTTP/2 connection open = %v, want nil", err)
	}
	c.CloseIdleConnections()
}

// gatedServer serves "answered" behind a gate, over TLS when tls is set.
func gatedServer(t *testing.T, useTLS bool, clk clock.Clock) (*Gate, *httptest.Server) {
	gate, srv, _ := countedGatedServer(t, useTLS, clk)
	return gate, srv
}

// countedGatedServer is gatedServer, and the bytes its connections have
// read so far, counted below the gate.
func countedGatedServer(t *testing.T, useTLS bool, clk clock.Clock) (*Gate, *httptest.Server, *atomic.Int64) {
	t.Helper()
	gate := &Gate{clock: clk}
	srv := httptest.NewUnstartedServer(named("answered"))
	srv.Config.ConnState = gate.ConnState
	read := new(atomic.Int64)
	srv.Listener = gate.Listener(countingListener{Listener: srv.Listener, read: read})
	if useTLS {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return gate, srv, read
}

// countingListener adds what its connections' reads return to read.
type countingListener struct {
	net.Listener
	read *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return readCountingConn{Conn: c, read: l.read}, nil
}

// readCountingConn adds what its reads return to read.
type readCountingConn struct {
	net.Conn
	read *atomic.Int64
}

func (c readCountingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// writeCountingConn adds what its writes return to written.
type writeCountingConn struct {
	net.Conn
	written *atomic.Int64
}

func (c writeCountingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	return n, err
}

// dialPlainCase is dialPlain for TestGateWaitsOnlyForConnectionsStillArriving:
// it sends nothing.
func dialPlainCase(t *testing.T, srv *httptest.Server, _ *atomic.Int64) net.Conn {
	return dialPlain(t, srv)
}

func dialPlain(t *testing.T, srv *httptest.Server) net.Conn {
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestGateWaitsOnlyForConnectionsStillArriving(t *testing.T) {
	for _, tc := range []struct {
		name string
		tls  bool
		// open opens a connection and leaves it as the case says; sent
		// counts the bytes it writes.
		open func(t *testing.T, srv *httptest.Server, sent *atomic.Int64) net.Conn
		// trickle, if set, sends a byte of a request after Stop, the
		// gate's clock having moved on by less than its quiet time.
		trickle bool
	}{
		{"a connection opened ahead of need and silent does not hold it", false, dialPlainCase, false},
		{"a TLS connection opened ahead of need, handshake done, does not hold it", true, func(t *testing.T, srv *httptest.Server, sent *atomic.Int64) net.Conn {
			raw, err := net.Dial("tcp", srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			cfg := srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
			cfg.ServerName = "127.0.0.1" // as tls.Dial would from the address
			c := tls.Client(writeCountingConn{Conn: raw, written: sent}, cfg)
			if err := c.Handshake(); err != nil {
				t.Fatal(err)
			}
			return c
		}, false},
		{"a request still trickling in holds it", false, dialPlainCase, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fake := clock.NewFake(time.Date(2026, 12, 1, 11, 0, 0, 0, time.UTC))
			gate, srv, read := countedGatedServer(t, tc.tls, fake)
			var sent atomic.Int64
			c := tc.open(t, srv, &sent)
			defer c.Close()
			var gc *gateConn
			testsupport.WaitFor(t, 5*time.Second, "the connection to be accepted", func() bool {
				gate.mu.Lock()
				defer gate.mu.Unlock()
				for _, fresh := range gate.fresh {
					gc = fresh
				}
				return len(gate.fresh) == 1
			})
			// The client's handshake ends before the server has read its
			// last message: a read after the clock moves on would look
			// like a request arriving.
			testsupport.WaitFor(t, 5*time.Second, "the server to read all the client sent", func() bool {
				return read.Load() >= sent.Load()
			})
			gate.Stop()
			cancelled, cancel := context.WithCancel(context.Background())
			cancel()
			if tc.trickle {
				fake.Advance(quiet / 2)
				c.Write([]byte("G"))
				testsupport.WaitFor(t, 5*time.Second, "the byte to be read", func() bool {
					return gc.last.Load() == fake.Now().UnixNano()
				})
				if gate.Wait(cancelled) == nil {
					t.Error("Wait returned while a request was arriving")
				}
			}
			fake.Advance(quiet)
			// Not at once: the server's Accept, which Stop interrupted,
			// may not have returned yet, and until it does the gate
			// counts a connection on its way.
			settle, cancelSettle := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancelSettle()
			if err := gate.Wait(settle); err != nil {
				t.Errorf("Wait = %v once the connection was quiet for %v; want it settled", err, quiet)
			}
			// Drain does not guess: the connection holds it until its
			// request reaches the handler, or it closes.
			if gate.Drain(cancelled) == nil {
				t.Error("Drain returned with a connection yet to send its first request")
			}
			c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := gate.Drain(ctx); err != nil {
				t.Errorf("Drain after the connection closed: %v", err)
			}
		})
	}
}

// A connection the gate let Wait settle without (its TLS handshake paused
// longer than the quiet time) still gets its first request answered by a
// server that drains before its Shutdown.
func TestGateDrainAnswersALateFirstRequest(t *testing.T) {
	fake := clock.NewFake(time.Date(2026, 12, 1, 11, 0, 0, 0, time.UTC))
	gate, srv := gatedServer(t, false, fake)
	c := dialPlain(t, srv)
	defer c.Close()
	testsupport.WaitFor(t, 5*time.Second, "the connection to be accepted", func() bool {
		gate.mu.Lock()
		defer gate.mu.Unlock()
		return len(gate.fresh) == 1
	})
	gate.Stop()
	fake.Advance(quiet)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := gate.Wait(ctx); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	srv.Config.SetKeepAlivesEnabled(false)
	drained := make(chan error, 1)
	go func() { drained <- gate.Drain(ctx) }()
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("the late first request: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "answered" || !resp.Close {
		t.Errorf("answer %q, close %v; want answered, and the connection closed after it", body, resp.Close)
	}
	if err := <-drained; err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if err := srv.Config.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown after Drain: %v", err)
	}
}

func TestStatelessResetKey(t *testing.T) {
	dir := t.TempDir()
	first, err := StatelessResetKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if first == ([32]byte{}) {
		t.Fatal("key is all zeros")
	}
	again, err := StatelessResetKey(dir)
	if err != nil || again != first {
		t.Errorf("second call = %x, %v; want the same key %x (the next edge makes the same resets)", again, err, first)
	}
	fi, err := os.Stat(filepath.Join(dir, ResetKeyFile))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v, %v; want mode 0600", fi, err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("state directory holds %d files, want the key alone (no temporary left)", len(ents))
	}
	os.WriteFile(filepath.Join(dir, ResetKeyFile), []byte("short"), 0o600)
	if _, err := StatelessResetKey(dir); err == nil {
		t.Error("a key file of the wrong size was accepted")
	}
}

func TestStateTravelsWithTheSockets(t *testing.T) {
	for _, tc := range []struct {
		name  string
		state func() []byte
		want  []byte
	}{
		{"the offer's state reaches the successor", func() []byte { return []byte(`{"keys":[]}`) }, []byte(`{"keys":[]}`)},
		{"an offer without state hands over none", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			old := bindProcess(t, "old")
			t.Cleanup(func() { old.socks.Close() })
			offer := listen(t, dir)
			offer.State = tc.state
			handoffs := wait(t, offer, old.socks)
			tk := take(t, dir)
			t.Cleanup(func() { tk.Sockets.Close() })
			if h := <-handoffs; h != nil {
				h.Close()
			}
			if string(tk.State) != string(tc.want) {
				t.Errorf("Taken.State = %q, want %q", tk.State, tc.want)
			}
		})
	}
}

func TestCloseUnusedClosesOnlyWhatIsNotServed(t *testing.T) {
	in := bindProcess(t, "inherited")
	t.Cleanup(func() { in.socks.Close() })
	// Served: the HTTP and admin sockets; HTTPS moved and HTTP/3 is off.
	used := Sockets{HTTP: in.socks.HTTP, Admin: in.socks.Admin}
	closed := in.socks.CloseUnused(used)
	if fmt.Sprint(closed) != "[https http3]" {
		t.Errorf("CloseUnused closed %v, want [https http3]", closed)
	}
	if _, err := net.Dial("tcp", in.socks.HTTP.Addr().String()); err != nil {
		t.Errorf("the served HTTP socket was closed: %v", err)
	}
	if c, err := net.Dial("tcp", in.socks.HTTPS.Addr().String()); err == nil {
		c.Close()
		t.Error("the unused HTTPS socket still accepts")
	}
}

// heldSecondWrite holds its second Write until release is closed: a TLS
// client's second flight (its Finished), so that a handshake is caught
// half-way.
type heldSecondWrite struct {
	net.Conn
	writes  atomic.Int32
	release chan struct{}
}

func (c *heldSecondWrite) Write(p []byte) (int, error) {
	if c.writes.Add(1) == 2 {
		<-c.release
	}
	return c.Conn.Write(p)
}

// A TLS handshake begun before Stop and paused longer than the quiet time
// (its client's second flight late, as on a loaded box) lets Wait settle;
// the server, draining before its Shutdown, still completes the handshake
// and answers the first request.
func TestGateDrainAnswersAHandshakeBegunBeforeStop(t *testing.T) {
	fake := clock.NewFake(time.Date(2026, 12, 7, 11, 0, 0, 0, time.UTC))
	gate, srv, read := countedGatedServer(t, true, fake)
	raw, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	held := &heldSecondWrite{Conn: raw, release: make(chan struct{})}
	cfg := srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	cfg.ServerName = "127.0.0.1"
	c := tls.Client(held, cfg)
	defer c.Close()
	handshake := make(chan error, 1)
	go func() { handshake <- c.Handshake() }()
	testsupport.WaitFor(t, 5*time.Second, "the server to read the ClientHello and the client to answer", func() bool {
		gate.mu.Lock()
		fresh := len(gate.fresh)
		gate.mu.Unlock()
		return fresh == 1 && read.Load() > 0 && held.writes.Load() == 2
	})
	gate.Stop()
	fake.Advance(quiet)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := gate.Wait(ctx); err != nil {
		t.Fatalf("Wait: %v", err)
	}
	srv.Config.SetKeepAlivesEnabled(false)
	drained := make(chan error, 1)
	go func() { drained <- gate.Drain(ctx) }()
	close(held.release)
	if err := <-handshake; err != nil {
		t.Fatalf("the handshake begun before Stop: %v", err)
	}
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("the first request after the handshake: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "answered" {
		t.Errorf("answer %q, want answered", body)
	}
	if err := <-drained; err != nil {
		t.Fatalf("Drain: %v", err)
	}
	if err := srv.Config.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown after Drain: %v", err)
	}
}
