package e2e

// Hostile input: slowloris and slow readers, malformed and smuggling-shaped
// requests, and a flood of TLS handshakes for names nobody serves, each
// against the real binary on loopback. Like reliability_test.go, each test
// logs its figures in a "figures:" line.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/scafo/scafo-edge/certs/certstest"
	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
	"github.com/scafo/scafo-edge/serving"
)

// streamer is an upstream that answers with an endless body (capped at
// 256 MiB), for slow readers to not read.
func streamer(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := make([]byte, 32<<10)
		for range 8192 {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// slowConn is one attacking connection: it sent a prefix and then, if
// trickling, one more byte every 100ms; a reader notes when the edge closes
// it.
type slowConn struct {
	c        net.Conn
	trickle  bool
	openedAt time.Time
	closedAt atomic.Int64 // unix nanos, 0 while open
	answered atomic.Bool  // the edge wrote something before closing
}

// slowSet is a set of attacking connections and their readers.
type slowSet struct {
	conns   []*slowConn
	readers sync.WaitGroup
}

// dial opens n connections to addr, each sending prefix, and trickling one
// more byte every 100ms afterwards when trickle is set (see run).
func (s *slowSet) dial(t *testing.T, addr string, n int, prefix string, trickle bool) {
	t.Helper()
	for range n {
		// Taken before dialling: the edge's timer starts after the
		// connect, so the measured time to the close is never shorter
		// than the timeout, however the scheduler delays this goroutine.
		openedAt := time.Now()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("slow connection %d: %v", len(s.conns), err)
		}
		sc := &slowConn{c: c, trickle: trickle, openedAt: openedAt}
		s.conns = append(s.conns, sc)
		t.Cleanup(func() { c.Close() })
		io.WriteString(c, prefix)
		s.readers.Add(1)
		go func() {
			defer s.readers.Done()
			buf := make([]byte, 512)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					sc.answered.Store(true)
				}
				if err != nil {
					sc.closedAt.Store(time.Now().UnixNano())
					return
				}
			}
		}()
	}
}

// open counts the connections the edge has not closed yet.
func (s *slowSet) open() int {
	n := 0
	for _, sc := range s.conns {
		if sc.closedAt.Load() == 0 {
			n++
		}
	}
	return n
}

// run trickles a byte every 100ms to each open trickling connection and
// calls during until every connection is closed (and at least 20 times),
// then closes them all and waits for the readers.
func (s *slowSet) run(t *testing.T, within time.Duration, during func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	trickled := make(chan struct{})
	go func() {
		defer close(trickled)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			for _, sc := range s.conns {
				if sc.trickle && sc.closedAt.Load() == 0 {
					sc.c.SetWriteDeadline(time.Now().Add(time.Second))
					sc.c.Write([]byte{'a'})
				}
			}
		}
	}()
	deadline := time.Now().Add(within)
	for i := 0; s.open() > 0 || i < 20; i++ {
		if time.Now().After(deadline) {
			cancel()
			<-trickled
			t.Fatalf("%d of %d slow connections still open after %v", s.open(), len(s.conns), within)
		}
		during()
	}
	cancel()
	<-trickled
	for _, sc := range s.conns {
		sc.c.Close()
	}
	s.readers.Wait()
}

// closedAfter returns the shortest and longest time from opening to the
// edge's close, and how many connections got any bytes first.
func (s *slowSet) closedAfter() (earliest, latest time.Duration, answered int) {
	for i, sc := range s.conns {
		d := time.Duration(sc.closedAt.Load() - sc.openedAt.UnixNano())
		if i == 0 || d < earliest {
			earliest = d
		}
		latest = max(latest, d)
		if sc.answered.Load() {
			answered++
		}
	}
	return earliest, latest, answered
}

// latencyProbe times a normal client's requests during an attack.
type latencyProbe struct {
	latencies []time.Duration
	failures  []string
}

func (p *latencyProbe) do(f func() error) {
	start := time.Now()
	if err := f(); err != nil {
		p.failures = append(p.failures, err.Error())
	}
	p.latencies = append(p.latencies, time.Since(start))
}

// check reports failures and a slowest request over the bound, and returns
// the median and the worst latency.
func (p *latencyProbe) check(t *testing.T) (p50, worst time.Duration) {
	t.Helper()
	slices.Sort(p.latencies)
	p50, worst = p.latencies[len(p.latencies)/2], p.latencies[len(p.latencies)-1]
	if len(p.failures) > 0 {
		t.Errorf("the normal client's requests failed during the attack: %q", p.failures[:min(5, len(p.failures))])
	}
	// Generous for a loaded CI machine under -race; unattacked it is a
	// millisecond or two.
	if worst > 5*time.Second {
		t.Errorf("the normal client's slowest request took %v during the attack", worst)
	}
	return p50, worst
}

// TestSlowlorisAndSlowReaders opens 300 connections that send their
// headers a byte at a time, 50 that send nothing, and 20 that ask for a
// large response and never read it, while a normal client keeps requesting:
// the normal client's requests all succeed with bounded latency, and the
// read-header timeout closes every slowloris and silent connection.
func TestSlowlorisAndSlowReaders(t *testing.T) {
	a, big := app(t, "A"), streamer(t)
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{
		{Host: "a.example", Application: "a", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(a)}}},
		{Host: "big.example", Application: "big", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(big)}}},
	}})
	const headerTimeout = time.Second
	e := startEdge(t, "--routes-file", routes, "--tls", "off", "--read-header-timeout", headerTimeout.String())
	waitEdgeReady(t, e)

	const slowReaders = 20
	for range slowReaders {
		c, err := net.Dial("tcp", e.HTTPAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		io.WriteString(c, "GET /big HTTP/1.1\r\nHost: big.example\r\n\r\n")
	}
	const trickling, silent = 300, 50
	var set slowSet
	set.dial(t, e.HTTPAddr, trickling, "GET / HTTP/1.1\r\nHost: a.example\r\nX-Slow: ", true)
	set.dial(t, e.HTTPAddr, silent, "", false)

	client := faultClient(t, 1)
	var probe latencyProbe
	set.run(t, 45*time.Second, func() {
		probe.do(func() error { return expectAnswer(client, e.HTTPAddr, "a.example", "/ok", "A /ok") })
	})
	earliest, latest, answered := set.closedAfter()
	p50, worst := probe.check(t)
	t.Logf("figures: slowloris: %d connections trickling headers and %d silent, all closed by the %v read-header timeout between %v and %v after opening (%d got a response first); %d slow readers holding large responses; normal client sent %d, failed %d, latency p50 %v max %v",
		trickling, silent, headerTimeout, earliest.Round(time.Millisecond), latest.Round(time.Millisecond), answered, slowReaders,
		len(probe.latencies), len(probe.failures), p50.Round(time.Microsecond), worst.Round(time.Millisecond))
	if earliest < headerTimeout {
		t.Errorf("a slow connection closed after %v, before the %v timeout: closed by something else", earliest, headerTimeout)
	}
}

// TestSlowTLSHandshakes opens 100 connections to the HTTPS listener that
// send half a TLS record header and then a byte every 100ms, and 50 that
// send nothing, while a normal HTTPS client keeps requesting: the handshake
// timeout (Go derives it from --read-header-timeout) closes every one of
// them, and the normal client keeps its latency.
func TestSlowTLSHandshakes(t *testing.T) {
	a := app(t, "A")
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{
		{Host: "a.example", Application: "a", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(a)}}},
	}})
	// The timeout bounds the normal client's handshake and request head
	// too: 1s was crossed by a loaded CI machine under -race, and the
	// probe's fresh connection was closed before its request.
	const headerTimeout = 3 * time.Second
	state := t.TempDir()
	e := startEdge(t, "--routes-file", routes, "--tls", "internal", "--state-dir", state, "--read-header-timeout", headerTimeout.String())
	waitEdgeReady(t, e)
	httpsGetInternal(t, e, state, "a.example", "/warm") // the certificate, issued before the attack

	const trickling, silent = 100, 50
	var set slowSet
	// A handshake record announcing 512 bytes that arrive a byte at a time.
	set.dial(t, e.HTTPSAddr, trickling, "\x16\x03\x01\x02\x00\x01", true)
	set.dial(t, e.HTTPSAddr, silent, "", false)
	var probe latencyProbe
	set.run(t, 45*time.Second, func() {
		probe.do(func() error {
			if _, body := httpsGetInternal(t, e, state, "a.example", "/ok"); !strings.HasPrefix(body, "A /ok") {
				return fmt.Errorf("answered %q", body)
			}
			return nil
		})
	})
	earliest, latest, answered := set.closedAfter()
	p50, worst := probe.check(t)
	t.Logf("figures: slow TLS handshakes: %d trickling a ClientHello and %d silent, all closed by the %v handshake timeout between %v and %v after opening (%d got bytes first); normal HTTPS client sent %d, failed %d, latency p50 %v max %v",
		trickling, silent, headerTimeout, earliest.Round(time.Millisecond), latest.Round(time.Millisecond), answered,
		len(probe.latencies), len(probe.failures), p50.Round(time.Microsecond), worst.Round(time.Millisecond))
	if earliest < headerTimeout {
		t.Errorf("a slow handshake closed after %v, before the %v timeout: closed by something else", earliest, headerTimeout)
	}
}

// TestSlowReadersAreClosedByASendTimeout: a client that asks for a large
// response and never reads it would hold a client connection, an upstream
// connection and a handler forever, as the edge sets no write timeout (so
// streams can run long). --send-timeout bounds each write's progress rather
// than the whole response, and drops such a client.
func TestSlowReadersAreClosedByASendTimeout(t *testing.T) {
	big := streamer(t)
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{
		{Host: "big.example", Application: "big", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(big)}}},
	}})
	e := startEdge(t, "--routes-file", routes, "--tls", "off", "--send-timeout", "1s")
	waitEdgeReady(t, e)
	const slowReaders = 5
	var conns []net.Conn
	for range slowReaders {
		c, err := net.Dial("tcp", e.HTTPAddr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		io.WriteString(c, "GET /big HTTP/1.1\r\nHost: big.example\r\n\r\n")
		conns = append(conns, c)
	}
	testsupport.WaitForNil(t, 20*time.Second, "slow readers in flight", func() error {
		if n := e.metric(t, "scafo_edge_requests_in_flight", nil); n != slowReaders {
			return fmt.Errorf("%v in flight", n)
		}
		return nil
	})
	testsupport.WaitForNil(t, 30*time.Second, "slow readers dropped by the send timeout", func() error {
		if n := e.metric(t, "scafo_edge_requests_in_flight", nil); n != 0 {
			return fmt.Errorf("%v still in flight", n)
		}
		return nil
	})
	for i, c := range conns {
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		n, err := io.Copy(io.Discard, c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("slow reader %d: still open after draining %d bytes", i, n)
		}
	}
}

// recordingUpstream is a raw TCP upstream that keeps every request head it
// receives, byte for byte, parses the framing itself, and answers 200 with
// its name and the request line. It shows exactly what the edge forwarded.
type recordingUpstream struct {
	name, addr string
	open       atomic.Int64 // connections from the edge now open
	mu         sync.Mutex
	heads      []string
	bodies     []string
}

func newRecordingUpstream(t *testing.T, name string) *recordingUpstream {
	u := &recordingUpstream{name: name}
	u.addr = scriptedUpstream(t, func(c net.Conn, r *bufio.Reader) {
		u.open.Add(1)
		defer u.open.Add(-1)
		for {
			head, err := readHead(r)
			if err != nil {
				return
			}
			var body []byte
			te, cls := headerValues(head, "Transfer-Encoding"), headerValues(head, "Content-Length")
			switch {
			case len(te) > 0:
				body, err = io.ReadAll(httputil.NewChunkedReader(r))
				if err == nil {
					_, err = readHead(r) // the trailer section and its blank line
				}
			case len(cls) > 0:
				n, perr := strconv.Atoi(strings.TrimSpace(cls[0]))
				if perr != nil {
					err = perr
					break
				}
				body = make([]byte, n)
				_, err = io.ReadFull(r, body)
			}
			u.mu.Lock()
			u.heads = append(u.heads, head)
			u.bodies = append(u.bodies, string(body))
			u.mu.Unlock()
			if err != nil {
				return
			}
			line, _, _ := strings.Cut(head, "\r\n")
			msg := u.name + " " + line
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(msg), msg)
		}
	})
	return u
}

func (u *recordingUpstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.heads)
}

// countPath counts the GET requests received for path.
func (u *recordingUpstream) countPath(path string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, h := range u.heads {
		if strings.HasPrefix(h, "GET "+path+" ") {
			n++
		}
	}
	return n
}

func (u *recordingUpstream) last() (head, body string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.heads[len(u.heads)-1], u.bodies[len(u.bodies)-1]
}

// readHead reads a request head up to and including its blank line,
// accepting bare LF line ends so that one would be seen rather than hang.
func readHead(r *bufio.Reader) (string, error) {
	var b strings.Builder
	for {
		line, err := r.ReadString('\n')
		b.WriteString(line)
		if err != nil {
			return b.String(), err
		}
		if line == "\r\n" || line == "\n" {
			return b.String(), nil
		}
	}
}

// headerValues returns the values of every field named name in a raw head,
// compared case-insensitively.
func headerValues(head, name string) []string {
	var out []string
	for _, line := range strings.Split(head, "\n")[1:] {
		k, v, ok := strings.Cut(strings.TrimRight(line, "\r"), ":")
		if ok && strings.EqualFold(k, name) {
			out = append(out, strings.TrimSpace(v))
		}
	}
	return out
}

// ambiguity lists what would let two HTTP parsers disagree about a
// forwarded request head: its framing, its Host, its line ends.
func ambiguity(head string) []string {
	var out []string
	te, cls := headerValues(head, "Transfer-Encoding"), headerValues(head, "Content-Length")
	if len(te) > 0 && len(cls) > 0 {
		out = append(out, "Content-Length with Transfer-Encoding")
	}
	if len(cls) > 1 {
		out = append(out, "more than one Content-Length")
	}
	if len(te) > 1 || (len(te) == 1 && te[0] != "chunked") {
		out = append(out, fmt.Sprintf("Transfer-Encoding %q", te))
	}
	if h := headerValues(head, "Host"); len(h) != 1 {
		out = append(out, fmt.Sprintf("%d Host fields", len(h)))
	}
	lines := strings.Split(strings.TrimSuffix(head, "\r\n\r\n"), "\r\n")
	for _, l := range lines {
		switch {
		case strings.ContainsAny(l, "\r\n\x00"):
			out = append(out, fmt.Sprintf("bare CR, LF or NUL in %q", l))
		case l != "" && (l[0] == ' ' || l[0] == '\t'):
			out = append(out, fmt.Sprintf("obs-fold line %q", l))
		}
	}
	if method, _, _ := strings.Cut(lines[0], " "); !slices.Contains([]string{"GET", "POST", "PUT", "HEAD", "OPTIONS", "DELETE", "PATCH"}, method) {
		out = append(out, fmt.Sprintf("method %q", method))
	}
	return out
}

// rawExchange writes req on a new connection to addr (over TLS as sni when
// sni is set) and reads one response; status 0 means the connection closed
// without one.
func rawExchange(t *testing.T, addr, sni, req string) (status int, body string) {
	t.Helper()
	var c net.Conn
	var err error
	if sni != "" {
		c, err = tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", addr, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
	} else {
		c, err = net.Dial("tcp", addr)
	}
	if err != nil {
		t.Fatalf("connect %s: %v", addr, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(c, req)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err.Error()
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b)
}

// TestHostileRequestsGetAClearAnswer sends malformed, oversized and
// smuggling-shaped requests as raw bytes: each gets the right status, and
// whatever reaches an upstream (a raw TCP recorder) is unambiguous — one
// framing, one Host, no folded or bare-CR lines, no smuggled second request.
func TestHostileRequestsGetAClearAnswer(t *testing.T) {
	recA, recB := newRecordingUpstream(t, "A"), newRecordingUpstream(t, "B")
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{
		{Host: "a.example", Application: "a", Upstreams: []node.Upstream{{Node: "n", Address: recA.addr}}},
		{Host: "b.example", Application: "b", Upstreams: []node.Upstream{{Node: "n", Address: recB.addr}}},
	}})
	// The plain listener's cases run against an edge without TLS: with TLS
	// on, the HTTPS redirect answers first (see the test below this one).
	plain := startEdge(t, "--routes-file", routes, "--tls", "off")
	secure := startEdge(t, "--routes-file", routes, "--tls", "internal")
	waitEdgeReady(t, plain)
	waitEdgeReady(t, secure)

	big := strings.Repeat("x", 70<<10)
	cases := []struct {
		name   string
		tls    bool // over the HTTPS listener, SNI a.example
		req    string
		status []int  // any of these
		to     string // "A", "B" or none: who may see it
		check  func(head, body string) error
	}{
		{name: "Content-Length with Transfer-Encoding is read as chunked alone and forwarded with one framing",
			req:    "POST /clte HTTP/1.1\r\nHost: a.example\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nG",
			status: []int{200, 400}, to: "A",
			check: func(head, body string) error {
				if body != "" {
					return fmt.Errorf("upstream body %q, want the empty chunked body", body)
				}
				return nil
			}},
		{name: "Transfer-Encoding with Content-Length (TE.CL) is chunked alone",
			req:    "POST /tecl HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n",
			status: []int{200, 400}, to: "A",
			check: func(head, body string) error {
				if body != "SMUGGLED" {
					return fmt.Errorf("upstream body %q, want SMUGGLED read as one chunk", body)
				}
				return nil
			}},
		{name: "two different Content-Lengths are 400", req: "POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", status: []int{400}},
		{name: "a Content-Length list is 400", req: "POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5, 5\r\n\r\nhello", status: []int{400}},
		{name: "two equal Content-Lengths are forwarded as one",
			req: "POST /dupcl HTTP/1.1\r\nHost: a.example\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello", status: []int{200, 400}, to: "A",
			check: func(head, body string) error {
				if body != "hello" {
					return fmt.Errorf("upstream body %q", body)
				}
				return nil
			}},
		{name: "a negative Content-Length is 400", req: "POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: -1\r\n\r\n", status: []int{400}},
		{name: "a signed Content-Length is 400", req: "POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: +5\r\n\r\nhello", status: []int{400}},
		{name: "an unknown transfer coding is 501", req: "POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", status: []int{501, 400}},
		{name: "a transfer-coding list is 501", req: "POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", status: []int{501, 400}},
		{name: "two Transfer-Encoding fields are 501", req: "POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", status: []int{501, 400}},
		{name: "whitespace before the colon is 400", req: "POST / HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n", status: []int{400}},
		{name: "an obs-folded field is unfolded before it is forwarded",
			req: "GET /fold HTTP/1.1\r\nHost: a.example\r\nX-Folded: one\r\n two\r\n\r\n", status: []int{200, 400}, to: "A",
			check: func(head, body string) error {
				if v := headerValues(head, "X-Folded"); len(v) != 1 || v[0] != "one two" {
					return fmt.Errorf("X-Folded forwarded as %q", v)
				}
				return nil
			}},
		{name: "an obs-folded Transfer-Encoding is unfolded to one framing",
			req: "POST /foldte HTTP/1.1\r\nHost: a.example\r\nTransfer-Encoding:\r\n chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", status: []int{200, 400}, to: "A",
			check: func(head, body string) error {
				if body != "abc" {
					return fmt.Errorf("upstream body %q", body)
				}
				return nil
			}},
		{name: "bare LF line ends are rewritten as CRLF", req: "GET /lf HTTP/1.1\nHost: a.example\n\n", status: []int{200, 400}, to: "A"},
		{name: "a bare CR in a field value is 400", req: "GET / HTTP/1.1\r\nHost: a.example\r\nX: a\rb\r\n\r\n", status: []int{400}},
		{name: "a NUL in the request target is 400", req: "GET /a\x00b HTTP/1.1\r\nHost: a.example\r\n\r\n", status: []int{400}},
		{name: "a header block over the limit is 431", req: "GET / HTTP/1.1\r\nHost: a.example\r\nX-Big: " + big + "\r\n\r\n", status: []int{431}},
		{name: "a flood of 12,000 fields is 431", req: "GET / HTTP/1.1\r\nHost: a.example\r\n" + strings.Repeat("X-A: b\r\n", 12000) + "\r\n", status: []int{431}},
		{name: "3,000 small fields within the limit are forwarded whole",
			req: "GET /many HTTP/1.1\r\nHost: a.example\r\n" + strings.Repeat("X-A: b\r\n", 3000) + "\r\n", status: []int{200}, to: "A",
			check: func(head, body string) error {
				if n := len(headerValues(head, "X-A")); n != 3000 {
					return fmt.Errorf("%d X-A fields forwarded", n)
				}
				return nil
			}},
		{name: "a Host with a space is 400", req: "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", status: []int{400}},
		{name: "a Host with a slash is 400", req: "GET / HTTP/1.1\r\nHost: a.example/b\r\n\r\n", status: []int{400}},
		{name: "a Host with userinfo is 400", req: "GET / HTTP/1.1\r\nHost: b.example@a.example\r\n\r\n", status: []int{400}},
		{name: "a Host with a bad port is 400", req: "GET / HTTP/1.1\r\nHost: a.example:80x\r\n\r\n", status: []int{400}},
		{name: "a Host longer than a DNS name is 400", req: "GET / HTTP/1.1\r\nHost: " + strings.Repeat("a.", 150) + "example\r\n\r\n", status: []int{400}},
		{name: "two Host fields are 400", req: "GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n", status: []int{400}},
		{name: "no Host in HTTP/1.1 is 400", req: "GET / HTTP/1.1\r\n\r\n", status: []int{400}},
		{name: "an empty Host is 400", req: "GET / HTTP/1.1\r\nHost: \r\n\r\n", status: []int{400}},
		{name: "no Host in HTTP/1.0 is 400", req: "GET / HTTP/1.0\r\n\r\n", status: []int{400}},
		{name: "an absolute-form target naming another host goes to that host's route, as origin form with its Host",
			req: "GET http://b.example/abs?q=1 HTTP/1.1\r\nHost: a.example\r\n\r\n", status: []int{200}, to: "B",
			check: func(head, body string) error {
				line, _, _ := strings.Cut(head, "\r\n")
				if line != "GET /abs?q=1 HTTP/1.1" || !slices.Equal(headerValues(head, "Host"), []string{"b.example"}) {
					return fmt.Errorf("B received %q", head)
				}
				return nil
			}},
		{name: "an absolute-form target naming a host no route names is 404", req: "GET http://evil.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n", status: []int{404}},
		{name: "an absolute-form target with userinfo names its real host", req: "GET http://a.example@evil.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n", status: []int{404}},
		{name: "CONNECT is 405", req: "CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n", status: []int{405}},
		{name: "CONNECT with a path is 405", req: "CONNECT /x HTTP/1.1\r\nHost: a.example\r\n\r\n", status: []int{405}},
		{name: "an HTTP/2 preface on the HTTP/1 listener is not proxied", req: "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", status: []int{400, 505}},
		{name: "an HTTP/2.0 request line is 505", req: "GET / HTTP/2.0\r\nHost: a.example\r\n\r\n", status: []int{505}},
		{name: "over TLS, an absolute-form target naming another host than the SNI is 421", tls: true,
			req: "GET http://b.example/ HTTP/1.1\r\nHost: a.example\r\n\r\n", status: []int{421}},
		{name: "over TLS, a Host other than the SNI is 421", tls: true, req: "GET / HTTP/1.1\r\nHost: b.example\r\n\r\n", status: []int{421}},
		{name: "over TLS, CONNECT is 405", tls: true, req: "CONNECT a.example:443 HTTP/1.1\r\nHost: a.example\r\n\r\n", status: []int{405}},
	}
	var sent, forwarded int
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			beforeA, beforeB := recA.count(), recB.count()
			addr, sni := plain.HTTPAddr, ""
			if c.tls {
				addr, sni = secure.HTTPSAddr, "a.example"
			}
			sent++
			status, body := rawExchange(t, addr, sni, c.req)
			if !slices.Contains(c.status, status) {
				t.Errorf("status %d %q, want one of %v", status, body, c.status)
			}
			gotA, gotB := recA.count()-beforeA, recB.count()-beforeB
			forwarded += gotA + gotB
			wantA, wantB := 0, 0
			if status == 200 {
				switch c.to {
				case "A":
					wantA = 1
				case "B":
					wantB = 1
				default:
					t.Errorf("answered 200 but no upstream may see this request")
				}
			}
			if gotA != wantA || gotB != wantB {
				t.Fatalf("upstream A saw %d requests, B %d; want %d and %d", gotA, gotB, wantA, wantB)
			}
			if gotA+gotB == 0 {
				return
			}
			rec := recA
			if gotB > 0 {
				rec = recB
			}
			head, fbody := rec.last()
			if amb := ambiguity(head); len(amb) > 0 {
				t.Errorf("forwarded an ambiguous request (%s):\n%s", strings.Join(amb, "; "), head)
			}
			if c.check != nil {
				if err := c.check(head, fbody); err != nil {
					t.Error(err)
				}
			}
		})
	}
	t.Logf("figures: hostile requests: %d shapes sent, %d forwarded to an upstream, all unambiguous", sent, forwarded)
}

// TestPlainListenerUnderTLSAnswersCONNECTAndMalformedHostsItself: with TLS
// on (acme, the default, or internal) the plain listener's HTTPS redirect
// runs before the edge's handler, and once answered 308 to a CONNECT and to
// a Host with a malformed port ("a.example:80x"). They get the edge's own
// 405 and 400, as with --tls off.
func TestPlainListenerUnderTLSAnswersCONNECTAndMalformedHostsItself(t *testing.T) {
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{
		{Host: "a.example", Application: "a", Upstreams: []node.Upstream{{Node: "n", Address: "127.0.0.1:1"}}},
	}})
	e := startEdge(t, "--routes-file", routes, "--tls", "internal")
	waitEdgeReady(t, e)
	for _, c := range []struct {
		req  string
		want int
	}{
		{"CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n", 405},
		{"CONNECT /x HTTP/1.1\r\nHost: a.example\r\n\r\n", 405},
		{"GET / HTTP/1.1\r\nHost: a.example:80x\r\n\r\n", 400},
		{"GET / HTTP/1.1\r\nHost: a.example:\r\n\r\n", 400},
	} {
		if status, body := rawExchange(t, e.HTTPAddr, "", c.req); status != c.want {
			t.Errorf("%q: %d %q, want %d", c.req, status, body, c.want)
		}
	}
}

// TestContentLengthWithTransferEncodingClosesTheConnection: RFC 9112 §6.1
// lets a server read such a request by its Transfer-Encoding alone, but it
// "MUST close the connection after responding": otherwise bytes a front
// proxy counted into the body (by Content-Length) start the next request
// on this connection. Go's server keeps the connection open (and drops the
// Content-Length before the handler sees it), so without the edge closing
// it the "G" left over became the method of the next request, forwarded as
// "GGET".
func TestContentLengthWithTransferEncodingClosesTheConnection(t *testing.T) {
	recA := newRecordingUpstream(t, "A")
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{
		{Host: "a.example", Application: "a", Upstreams: []node.Upstream{{Node: "n", Address: recA.addr}}},
	}})
	e := startEdge(t, "--routes-file", routes, "--tls", "off")
	waitEdgeReady(t, e)
	c, err := net.Dial("tcp", e.HTTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: a.example\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nG"+
		"GET /second HTTP/1.1\r\nHost: a.example\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("first response: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp2, err := http.ReadResponse(br, nil); err == nil {
		b, _ := io.ReadAll(resp2.Body)
		t.Errorf("the connection stayed open and answered a second request: %d %q", resp2.StatusCode, b)
	}
	if n := recA.count(); n != 1 {
		t.Errorf("upstream received %d requests, want 1", n)
	}
}

// TestTLSHandshakeFloodWithRandomNames sends a few hundred TLS handshakes
// for names the document does not name (random ones, subdomains of a named
// host, names a wildcard route covers): none completes, Pebble receives no
// ACME order, nothing is written to the state file, and each costs little
// CPU. A handshake for the named host then gets a certificate from the same
// Pebble (one order), so the zero is not vacuous.
func TestTLSHandshakeFloodWithRandomNames(t *testing.T) {
	httpPort, httpsPort := testsupport.FreePort(t), testsupport.FreePort(t)
	p := certstest.StartPebble(t, certstest.PebbleConfig{HTTPPort: httpPort, TLSPort: httpsPort})
	dir := t.TempDir()
	caRoot := filepath.Join(dir, "pebble-root.pem")
	mustNil(t, os.WriteFile(caRoot, p.RootPEM, 0o600))
	a := app(t, "A")
	routes := writeRoutesFile(t, dir, &node.Document{V: 1, Routes: []node.Route{
		{Host: "named.example", Application: "a", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(a)}}},
		{Host: "*.wild.example", Application: "a", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(a)}}},
	}})
	state := t.TempDir()
	// Prefetch off: its own turn for named.example (a lock, a reachability
	// token) writes the state file whenever it comes, and this test holds
	// the flood to writing nothing.
	e := startEdge(t, "--routes-file", routes, "--tls", "acme", "--acme-ca", p.DirectoryURL, "--acme-ca-root", caRoot, "--state-dir", state,
		"--http-addr", fmt.Sprintf("127.0.0.1:%d", httpPort), "--https-addr", fmt.Sprintf("127.0.0.1:%d", httpsPort), "--cert-prefetch=false")
	waitEdgeReady(t, e)
	dbPath := filepath.Join(state, node.StateFile)
	waitDocumentPersisted(t, dbPath) // the edge's own write after start, not the flood's
	storeBefore := stateSnapshot(t, dbPath)
	refusalsBefore := e.metric(t, "scafo_edge_tls_on_demand_refusals_total", testsupport.Labels{"reason": "not_named"})
	cpuBefore := e.metric(t, "process_cpu_seconds_total", nil)

	randomName := func(i int) string {
		b := make([]byte, 6)
		rand.Read(b)
		r := hex.EncodeToString(b)
		switch i % 4 {
		case 0:
			return r + ".example"
		case 1:
			return r + ".named.example"
		case 2:
			return r + ".wild.example" // routed by the wildcard, never certified (rule 8)
		default:
			return "a" + r + "." + r[:4] + ".test"
		}
	}
	const handshakes, workers = 400, 8
	var tried, completed atomic.Int64
	var wg sync.WaitGroup
	next := make(chan int)
	go func() {
		for i := range handshakes {
			next <- i
		}
		close(next)
	}()
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 30 * time.Second}, Config: &tls.Config{ServerName: randomName(i), InsecureSkipVerify: true}}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				c, err := d.DialContext(ctx, "tcp", e.HTTPSAddr)
				cancel()
				tried.Add(1)
				if err == nil {
					completed.Add(1)
					c.Close()
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := e.metric(t, "process_cpu_seconds_total", nil) - cpuBefore
	refusals := e.metric(t, "scafo_edge_tls_on_demand_refusals_total", testsupport.Labels{"reason": "not_named"}) - refusalsBefore
	storeDiff := diffSnapshots(storeBefore, stateSnapshot(t, dbPath))
	storeChanged := len(storeDiff) > 0
	orders := p.OrderCount()
	perHandshake := time.Duration(cpu / float64(handshakes) * float64(time.Second))

	// The control: the name the document does name gets a certificate.
	d := &tls.Dialer{Config: &tls.Config{ServerName: "named.example", RootCAs: p.IssuerRoots(t)}}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", e.HTTPSAddr)
	if err != nil {
		t.Fatalf("control handshake for named.example: %v", err)
	}
	c.Close()
	p.WaitOrderCount(t, 1)

	t.Logf("figures: TLS handshake flood: %d handshakes tried with random SNI names in %v, %d completed, %.0f on-demand refusals, %d ACME orders placed, state file changed: %v; CPU %.3fs in all, %v per handshake (race-enabled build); control handshake for the named host: 1 order, certificate served",
		tried.Load(), elapsed.Round(time.Millisecond), completed.Load(), refusals, orders, storeChanged, cpu, perHandshake)
	if completed.Load() != 0 {
		t.Errorf("%d handshakes for names nobody serves completed", completed.Load())
	}
	if orders != 0 {
		t.Errorf("the flood placed %d ACME orders", orders)
	}
	if storeChanged {
		t.Errorf("the flood wrote to the state file: %v", storeDiff)
	}
	if refusals < handshakes {
		t.Errorf("%.0f on-demand refusals counted for %d handshakes", refusals, handshakes)
	}
	// A refused handshake costs a ClientHello parse and a map lookup; even
	// race-enabled on a loaded machine that is well under this bound.
	if perHandshake > 20*time.Millisecond {
		t.Errorf("%v of CPU per refused handshake", perHandshake)
	}
}

// h2Exchange opens an HTTP/2 connection to addr (TLS, SNI sni, ALPN h2),
// sends one request built from raw header fields (pseudo-headers first, as
// the caller lists them; no validation on this side) and an optional DATA
// frame, and reports how the edge answered: "status N", "reset CODE" or
// "goaway CODE".
func h2Exchange(t *testing.T, addr, sni string, fields [][2]string, data string) string {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", addr,
		&tls.Config{ServerName: sni, InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	defer c.Close()
	if p := c.ConnectionState().NegotiatedProtocol; p != "h2" {
		t.Fatalf("negotiated %q, want h2", p)
	}
	c.SetDeadline(time.Now().Add(30 * time.Second))
	io.WriteString(c, http2.ClientPreface)
	fr := http2.NewFramer(c, c)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.WriteSettings()
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range fields {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block.Bytes(), EndHeaders: true, EndStream: data == ""})
	if data != "" {
		fr.WriteData(1, true, []byte(data))
	}
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return "closed: " + err.Error()
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.MetaHeadersFrame:
			if f.StreamID == 1 {
				return "status " + f.PseudoValue("status")
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == 1 {
				return "reset " + f.ErrCode.String()
			}
		case *http2.GoAwayFrame:
			return "goaway " + f.ErrCode.String()
		}
	}
}

// TestHTTP2DowngradeSmuggling sends HTTP/2 requests that would smuggle a
// second request if the edge passed them on to its HTTP/1.1 upstream as
// they are: a body longer than its content-length, a transfer-encoding, a
// CRLF in a field value or the :path, connection-specific fields. Each is
// refused (stream reset or 4xx), nothing smuggled reaches the upstream, and
// whatever does reach it is unambiguous. A well-formed request is the
// control.
func TestHTTP2DowngradeSmuggling(t *testing.T) {
	recA, recB := newRecordingUpstream(t, "A"), newRecordingUpstream(t, "B")
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{
		{Host: "a.example", Application: "a", Upstreams: []node.Upstream{{Node: "n", Address: recA.addr}}},
		{Host: "b.example", Application: "b", Upstreams: []node.Upstream{{Node: "n", Address: recB.addr}}},
	}})
	e := startEdge(t, "--routes-file", routes, "--tls", "internal")
	waitEdgeReady(t, e)
	const smuggled = "GET /smuggled HTTP/1.1\r\nHost: a.example\r\n\r\n"
	req := func(method, path string, extra ...[2]string) [][2]string {
		return append([][2]string{{":method", method}, {":scheme", "https"}, {":authority", "a.example"}, {":path", path}}, extra...)
	}
	cases := []struct {
		name   string
		fields [][2]string
		data   string
		ok     bool // the control: answered 200 by A
	}{
		{"a well-formed POST is forwarded (the control)", req("POST", "/ok", [2]string{"content-length", "5"}), "hello", true},
		{"a body longer than its content-length", req("POST", "/cl", [2]string{"content-length", "5"}), "hello" + smuggled, false},
		{"a body with content-length 0", req("POST", "/cl0", [2]string{"content-length", "0"}), smuggled, false},
		{"a transfer-encoding field", req("POST", "/te", [2]string{"transfer-encoding", "chunked"}), "0\r\n\r\n" + smuggled, false},
		{"a CRLF in a field value", req("GET", "/crlf", [2]string{"x-a", "b\r\nTransfer-Encoding: chunked"}), "", false},
		{"a CRLF in the :path", req("GET", "/a HTTP/1.1\r\nHost: a.example\r\n\r\nGET /smuggled"), "", false},
		{"a connection field", req("GET", "/conn", [2]string{"connection", "keep-alive"}), "", false},
		{"an upper-case field name", req("GET", "/upper", [2]string{"X-Upper", "1"}), "", false},
		{"an :authority other than the SNI is 421", [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", "b.example"}, {":path", "/other"}}, "", false},
		// RFC 9113 §8.3.1 says SHOULD treat as malformed; Go's server
		// routes by the :authority and the upstream sees that one Host.
		{"a host field contradicting the :authority is routed by the :authority, with one Host", req("GET", "/host", [2]string{"host", "b.example"}), "", true},
	}
	var sent int
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			beforeA, beforeB := recA.count(), recB.count()
			sent++
			got := h2Exchange(t, e.HTTPSAddr, "a.example", c.fields, c.data)
			if c.ok && got == "status 200" {
				if head, _ := recA.last(); !slices.Equal(headerValues(head, "Host"), []string{"a.example"}) {
					t.Errorf("A received Host %q, want a.example alone", headerValues(head, "Host"))
				}
			}
			if c.ok != (got == "status 200") {
				t.Errorf("answered %s, want %s", got, map[bool]string{true: "status 200", false: "a refusal"}[c.ok])
			}
			if !c.ok && strings.HasPrefix(got, "status 2") {
				t.Errorf("answered %s: a malformed HTTP/2 request was served", got)
			}
			if n := recB.count() - beforeB; n != 0 {
				t.Errorf("B, which the SNI does not cover, saw %d requests", n)
			}
			recA.mu.Lock()
			heads, bodies := slices.Clone(recA.heads[beforeA:]), slices.Clone(recA.bodies[beforeA:])
			recA.mu.Unlock()
			for i, h := range heads {
				if amb := ambiguity(h); len(amb) > 0 {
					t.Errorf("forwarded an ambiguous request (%s):\n%s", strings.Join(amb, "; "), h)
				}
				if strings.Contains(h, "/smuggled") || strings.Contains(bodies[i], "/smuggled") && !c.ok {
					t.Errorf("the smuggled request reached the upstream:\n%s%s", h, bodies[i])
				}
			}
		})
	}
	t.Logf("figures: HTTP/2 downgrade smuggling: %d shapes sent, %d requests reached the upstream, none ambiguous or smuggled", sent, recA.count()+recB.count())
}

// TestHTTP2RequestTargetsWithSpacesAreRefused: an HTTP/2 :path is not an
// HTTP/1.1 request-target, and Go's HTTP/2 server only checks that it starts
// with "/". The edge forwards the request-target's original bytes (docs/design.md
// rule 4), so ":path: /a b" would reach the upstream as the request line
// "GET /a b HTTP/1.1", which HTTP/1.1 parsers split in different places: a
// request-line injection. A request-target with a space (or a tab or
// control byte, which Go's HTTP/2 server already refuses) is refused before
// it is forwarded.
func TestHTTP2RequestTargetsWithSpacesAreRefused(t *testing.T) {
	recA := newRecordingUpstream(t, "A")
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{
		{Host: "a.example", Application: "a", Upstreams: []node.Upstream{{Node: "n", Address: recA.addr}}},
	}})
	e := startEdge(t, "--routes-file", routes, "--tls", "internal")
	waitEdgeReady(t, e)
	for _, path := range []string{"/a b", "/a HTTP/1.0 x", "/a\tb", "/a\x7fb", "/a\x01b"} {
		before := recA.count()
		got := h2Exchange(t, e.HTTPSAddr, "a.example", [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", "a.example"}, {":path", path}}, "")
		if got == "status 200" || recA.count() != before {
			head := ""
			if recA.count() != before {
				head, _ = recA.last()
			}
			t.Errorf(":path %q: answered %s, upstream received %q; want a refusal and nothing forwarded", path, got, head)
		}
	}
}

// h2Dial opens an HTTP/2 connection to addr for a.example (TLS without
// verification, ALPN h2), sends the client preface and its SETTINGS, and
// returns a framer over it. The connection's deadline is a minute away.
func h2Dial(t *testing.T, addr string) (*tls.Conn, *http2.Framer) {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 30 * time.Second}, "tcp", addr,
		&tls.Config{ServerName: "a.example", InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(60 * time.Second))
	io.WriteString(c, http2.ClientPreface)
	fr := http2.NewFramer(c, c)
	fr.WriteSettings()
	return c, fr
}

// h2GetBlock is the header block of GET https://a.example<path>.
func h2GetBlock(path string) []byte {
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	for _, f := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":authority", "a.example"}, {":path", path}} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	return b.Bytes()
}

// h2Drain reads frames until the connection ends, acknowledging settings,
// and reports what ended it: the last GOAWAY's code, if any, and the read
// error.
func h2Drain(fr *http2.Framer) (goaway string, err error) {
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			return goaway, err
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if !f.IsAck() {
				fr.WriteSettingsAck()
			}
		case *http2.GoAwayFrame:
			goaway = f.ErrCode.String()
		}
	}
}

// h2Probe is a normal client: HTTP/2 on a connection of its own, trusting
// the edge's internal root, requesting https://a.example/ok in a loop and
// timing each request until finish.
type h2Probe struct {
	latencyProbe
	tr      *http.Transport
	started chan struct{} // closed once the first request is done
	stop    chan struct{}
	done    chan struct{}
}

func startH2Probe(t *testing.T, e *runningEdge, state string) *h2Probe {
	t.Helper()
	pem, err := os.ReadFile(filepath.Join(state, internalRootFile))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	p := &h2Probe{
		tr: &http.Transport{
			TLSClientConfig:   &tls.Config{RootCAs: roots},
			ForceAttemptHTTP2: true,
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, "tcp", e.HTTPSAddr)
			},
		},
		started: make(chan struct{}),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	t.Cleanup(p.tr.CloseIdleConnections)
	client := &http.Client{Transport: p.tr, Timeout: 30 * time.Second}
	go func() {
		defer close(p.done)
		for i := 0; ; i++ {
			select {
			case <-p.stop:
				return
			default:
			}
			p.do(func() error {
				resp, err := client.Get("https://a.example/ok")
				if err != nil {
					return err
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || !strings.HasPrefix(string(b), "A GET /ok") || resp.ProtoMajor != 2 {
					return fmt.Errorf("answered %s %q %v", resp.Proto, b, err)
				}
				return nil
			})
			if i == 0 {
				close(p.started)
			}
		}
	}()
	return p
}

// finish stops the probe, waits for its last request and closes its
// connection; p.latencyProbe is then the probe's record.
func (p *h2Probe) finish() {
	close(p.stop)
	<-p.done
	p.tr.CloseIdleConnections()
}

// startHTTP2Edge starts an edge with --tls internal whose one route,
// a.example, goes to a recording upstream, and warms it with one HTTPS
// request; it returns the upstream, the edge and its state directory.
func startHTTP2Edge(t *testing.T) (*recordingUpstream, *runningEdge, string) {
	t.Helper()
	recA := newRecordingUpstream(t, "A")
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{
		{Host: "a.example", Application: "a", Upstreams: []node.Upstream{{Node: "n", Address: recA.addr}}},
	}})
	state := t.TempDir()
	e := startEdge(t, "--routes-file", routes, "--tls", "internal", "--state-dir", state)
	waitEdgeReady(t, e)
	httpsGetInternal(t, e, state, "a.example", "/warm")
	return recA, e, state
}

// TestHTTP2Floods: an HTTP/2 client that opens and at once resets streams
// by the thousand (rapid reset, CVE-2023-44487), and one that sends a
// header block as an endless run of CONTINUATION frames (CVE-2023-45288),
// while a normal HTTPS client keeps requesting: the normal client keeps its
// latency, the reset streams reach the upstream only a bounded number of
// times (TestHTTP2RapidResetCostsTheOriginAFixedAmount states the bound),
// and the CONTINUATION flood is cut off once the header limit is passed
// rather than buffered.
func TestHTTP2Floods(t *testing.T) {
	recA, e, state := startHTTP2Edge(t)
	baseG, baseFD, baseConns := e.metric(t, "go_goroutines", nil), e.metric(t, "process_open_fds", nil), recA.open.Load()

	probe := startH2Probe(t, e, state)

	const resets = 2000
	before := recA.count()
	c, fr := h2Dial(t, e.HTTPSAddr)
	block := h2GetBlock("/reset")
	sentResets := 0
	for id := uint32(1); sentResets < resets; id += 2 {
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true, EndStream: true}); err != nil {
			break
		}
		if err := fr.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
			break
		}
		sentResets++
	}
	c.CloseWrite()
	resetGoaway, _ := h2Drain(fr)
	c.Close()
	reachedUpstream := recA.count() - before

	// CONTINUATION flood: 1 MiB of header block in 16 KiB frames, never
	// ending it.
	c, fr = h2Dial(t, e.HTTPSAddr)
	fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: h2GetBlock("/cont"), EndHeaders: false})
	junk := bytes.Repeat([]byte{0x40, 0x01, 'x', 0x7f, 0x00}, 16<<10/5) // literal fields, never indexed
	sentCont := 0
	for range 64 {
		if err := fr.WriteContinuation(1, false, junk); err != nil {
			break
		}
		sentCont += len(junk)
	}
	contGoaway, contErr := h2Drain(fr)
	c.Close()

	probe.finish()
	p50, worst := probe.check(t)
	t.Logf("figures: HTTP/2 floods: %d streams opened and reset, %d reached the upstream (GOAWAY %q); CONTINUATION flood cut after %d bytes sent (GOAWAY %q, %v); normal HTTPS client sent %d, failed %d, latency p50 %v max %v",
		sentResets, reachedUpstream, resetGoaway, sentCont, contGoaway, contErr, len(probe.latencies), len(probe.failures), p50.Round(time.Microsecond), worst.Round(time.Millisecond))
	if reachedUpstream >= sentResets {
		t.Errorf("every one of the %d reset streams reached the upstream", sentResets)
	}
	var ne net.Error
	if errors.As(contErr, &ne) && ne.Timeout() {
		t.Errorf("the edge kept reading an endless CONTINUATION header block (%d bytes sent) instead of ending the connection", sentCont)
	}
	// Upstream connections the edge keeps pooled (idle keep-alives, up to
	// its per-upstream limit) are allowed for: a few goroutines and one
	// descriptor each. Anything beyond is the flood's residue.
	testsupport.WaitForNil(t, 30*time.Second, "goroutines and file descriptors back to the baseline", func() error {
		pooled := float64(recA.open.Load() - baseConns)
		g, fds := e.metric(t, "go_goroutines", nil), e.metric(t, "process_open_fds", nil)
		if g > baseG+5+3*pooled || fds > baseFD+5+pooled {
			return fmt.Errorf("goroutines %v (baseline %v), open fds %v (baseline %v), %v more upstream connections pooled", g, baseG, fds, baseFD, pooled)
		}
		return nil
	})
}

// The binary's HTTP/2 limits, from package serving: the stream limit it
// advertises and its per-connection budget of requests cancelled before an
// answer (a burst, and a refill a second). The rapid-reset test holds the
// binary to the bound they give.
const (
	http2MaxStreams = serving.HTTP2MaxStreams
	resetBurst      = serving.ResetBurst
	resetRefill     = serving.ResetRefill
)

// TestHTTP2RapidResetCostsTheOriginAFixedAmount: a client that opens and at
// once resets 5,000 streams on one connection (rapid reset,
// CVE-2023-44487) costs the origin at most resetBurst + http2MaxStreams
// requests, plus what the budget refills while the loop runs: the edge
// does not forward a stream already reset, counts each request cancelled
// before its answer against the connection's budget, and closes the
// connection once the budget is spent. Before this bound one reset stream
// in five to eight reached the origin, however many were sent. A normal
// HTTP/2 client on a connection of its own is served throughout.
func TestHTTP2RapidResetCostsTheOriginAFixedAmount(t *testing.T) {
	recA, e, state := startHTTP2Edge(t)
	probe := startH2Probe(t, e, state)
	select {
	case <-probe.started:
	case <-time.After(20 * time.Second):
		t.Fatal("the normal client's first request did not finish")
	}

	const streams = 5000
	c, fr := h2Dial(t, e.HTTPSAddr)
	block := h2GetBlock("/reset")
	start := time.Now()
	sent := 0
	for id := uint32(1); sent < streams; id += 2 {
		if fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true, EndStream: true}) != nil ||
			fr.WriteRSTStream(id, http2.ErrCodeCancel) != nil {
			break // the edge closed the connection
		}
		sent++
	}
	// The client leaves the connection open: only the edge can end it
	// before this deadline.
	c.SetReadDeadline(time.Now().Add(8 * time.Second))
	goaway, readErr := h2Drain(fr)
	closedAfter := time.Since(start)
	var ne net.Error
	closedByEdge := !(errors.As(readErr, &ne) && ne.Timeout())
	if !closedByEdge {
		t.Errorf("the edge kept the attacking connection open for %v after %d streams opened and reset", closedAfter.Round(time.Millisecond), sent)
	} else {
		testsupport.WaitForNil(t, 5*time.Second, "the edge logs the connection it closed", func() error {
			if e.countLogs("(rapid reset)") != 1 {
				return errors.New("no log line")
			}
			return nil
		})
	}

	probe.finish()
	// Served by the same edge after the attack, on a new connection.
	if _, body := httpsGetInternal(t, e, state, "a.example", "/after"); !strings.HasPrefix(body, "A GET /after") {
		t.Errorf("a request after the attack was answered %q", body)
	}
	testsupport.WaitForNil(t, 10*time.Second, "the attack's requests finished", func() error {
		if n := e.metric(t, "scafo_edge_requests_in_flight", nil); n != 0 {
			return fmt.Errorf("%v in flight", n)
		}
		return nil
	})
	reached := recA.countPath("/reset")
	refilled := int(resetRefill * closedAfter.Seconds())
	bound := resetBurst + http2MaxStreams + refilled + 1
	p50, worst := probe.check(t)
	t.Logf("figures: HTTP/2 rapid reset: %d of %d streams opened and reset on one connection before the edge closed it, %d requests reached the origin (bound %d: burst %d + %d streams in flight + %d refilled), connection closed by the edge: %v after %v (GOAWAY %q, %v); normal HTTP/2 client on its own connection sent %d, failed %d, latency p50 %v max %v",
		sent, streams, reached, bound, resetBurst, http2MaxStreams, refilled+1, closedByEdge, closedAfter.Round(time.Millisecond), goaway, readErr,
		len(probe.latencies), len(probe.failures), p50.Round(time.Microsecond), worst.Round(time.Millisecond))
	if reached > bound {
		t.Errorf("%d of the %d reset streams reached the origin, over the bound of %d", reached, sent, bound)
	}
}

// TestHTTP2ClientCancellingAFullWindowKeepsItsConnection: what a browser
// does when it leaves a page whose subresources all still wait on the
// upstream (it cancels every stream it has in flight, http2MaxStreams of
// them) stays within the reset budget that closes a rapid-reset client's
// connection: the connection is kept and its next request is served.
func TestHTTP2ClientCancellingAFullWindowKeepsItsConnection(t *testing.T) {
	recA := newRecordingUpstream(t, "A")
	var held atomic.Int64
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		held.Add(1)
		defer held.Add(-1)
		<-r.Context().Done()
	}))
	t.Cleanup(slow.Close)
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{
		{Host: "a.example", Application: "a", Upstreams: []node.Upstream{{Node: "n", Address: recA.addr}}, Paths: map[string]string{"slow": "slow.example"}},
		{Host: "slow.example", Application: "slow", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(slow)}}},
	}})
	e := startEdge(t, "--routes-file", routes, "--tls", "internal")
	waitEdgeReady(t, e)

	c, fr := h2Dial(t, e.HTTPSAddr)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	f, err := fr.ReadFrame()
	if err != nil {
		t.Fatalf("read the edge's SETTINGS: %v", err)
	}
	if sf, ok := f.(*http2.SettingsFrame); !ok {
		t.Fatalf("first frame %v, want the edge's SETTINGS", f)
	} else if v, ok := sf.Value(http2.SettingMaxConcurrentStreams); !ok || v != http2MaxStreams {
		t.Errorf("SETTINGS_MAX_CONCURRENT_STREAMS %d (sent: %v), want %d", v, ok, http2MaxStreams)
	}
	fr.WriteSettingsAck()
	block := h2GetBlock("/slow/asset")
	for i := range http2MaxStreams {
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: block, EndHeaders: true, EndStream: true}); err != nil {
			t.Fatalf("stream %d: %v", 2*i+1, err)
		}
	}
	testsupport.WaitForNil(t, 20*time.Second, "a full window of requests waiting on the upstream", func() error {
		if n := held.Load(); n != http2MaxStreams {
			return fmt.Errorf("%d held", n)
		}
		return nil
	})
	for i := range http2MaxStreams {
		if err := fr.WriteRSTStream(uint32(2*i+1), http2.ErrCodeCancel); err != nil {
			t.Fatalf("reset stream %d: %v", 2*i+1, err)
		}
	}
	// Each cancelled request is counted when its handler returns, before
	// the in-flight gauge drops.
	testsupport.WaitForNil(t, 20*time.Second, "the cancelled requests finished", func() error {
		if n := e.metric(t, "scafo_edge_requests_in_flight", nil); n != 0 {
			return fmt.Errorf("%v in flight, %d held by the upstream", n, held.Load())
		}
		return nil
	})
	next := uint32(2*http2MaxStreams + 1)
	if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: next, BlockFragment: h2GetBlock("/next"), EndHeaders: true, EndStream: true}); err != nil {
		t.Fatalf("the request after the cancels: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(20 * time.Second))
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("the connection ended after %d streams were cancelled: %v", http2MaxStreams, err)
		}
		if h, ok := f.(*http2.MetaHeadersFrame); ok && h.StreamID == next {
			if s := h.PseudoValue("status"); s != "200" || recA.countPath("/next") != 1 {
				t.Errorf("the request after the cancels: status %s, upstream saw it %d times", s, recA.countPath("/next"))
			}
			break
		}
	}
	if n := e.countLogs("(rapid reset)"); n != 0 {
		t.Errorf("the edge logged %d rapid-reset closes", n)
	}
}

// waitDocumentPersisted waits until the edge has saved its routing document
// in the state file at dbPath, which it does just after serving it. The
// file is read through a copy: the edge holds its lock.
// stateSnapshot reads every bucket's keys and value digests from a copy of
// the live bbolt file (the edge holds its lock), so a check compares what is
// stored rather than page layout.
func stateSnapshot(t *testing.T, dbPath string) map[string][32]byte {
	t.Helper()
	b, err := os.ReadFile(dbPath)
	if err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(t.TempDir(), "snapshot.db")
	if err := os.WriteFile(cp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(cp, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	out := map[string][32]byte{}
	var walk func(prefix string, b *bolt.Bucket) error
	walk = func(prefix string, b *bolt.Bucket) error {
		return b.ForEach(func(k, v []byte) error {
			if v == nil {
				return walk(prefix+string(k)+"/", b.Bucket(k))
			}
			out[prefix+string(k)] = sha256.Sum256(v)
			return nil
		})
	}
	err = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, b *bolt.Bucket) error { return walk(string(name)+"/", b) })
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// diffSnapshots names the keys added, removed or changed between two
// snapshots.
func diffSnapshots(before, after map[string][32]byte) []string {
	var diff []string
	for k, v := range after {
		if old, ok := before[k]; !ok {
			diff = append(diff, "+"+k)
		} else if old != v {
			diff = append(diff, "~"+k)
		}
	}
	for k := range before {
		if _, ok := after[k]; !ok {
			diff = append(diff, "-"+k)
		}
	}
	slices.Sort(diff)
	return diff
}

func waitDocumentPersisted(t *testing.T, dbPath string) {
	t.Helper()
	testsupport.WaitForNil(t, 20*time.Second, "routing document persisted", func() error {
		b, err := os.ReadFile(dbPath)
		if err != nil {
			return err
		}
		cp := filepath.Join(t.TempDir(), "copy.db")
		if err := os.WriteFile(cp, b, 0o600); err != nil {
			return err
		}
		db, err := bolt.Open(cp, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
		if err != nil {
			return err
		}
		defer db.Close()
		u, err := node.LoadDocument(db)
		if err == nil && u == nil {
			err = errors.New("no document saved yet")
		}
		return err
	})
}
