//go:build linux || darwin || freebsd || netbsd || openbsd

// The rules these tests hold the edge to rest on the peek at reuse
// (internal/h1/peek_unix.go), which exists only on these systems; the origins also
// size their receive buffers through the socket.

package backhaul

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

// Hostile origins: raw TCP upstreams that write exact bytes with
// exact timing. Each case runs on both paths and asserts what every client
// received and how many times the origin read each request head, so that a
// response delivered to the wrong client, a request sent twice or a
// connection reused past its framing shows as a count.
//
// Every case logs one "figures:" line per path, so that runs before and
// after a change can be compared by grepping.

// step is one action of an origin's script on one accepted connection. A
// step that returns an error ends the script and the connection is closed.
type step func(o *originConn) error

// errEnd ends a script on purpose.
var errEnd = errors.New("script ended")

// hostileOrigin is a loopback origin running a script per connection: the
// i-th accepted connection runs scripts[i], the last script serving every
// connection beyond.
type hostileOrigin struct {
	addr    string
	scripts [][]step
	stop    chan struct{} // closed at cleanup: waits end

	active   atomic.Int32 // connections whose script has not ended
	accepted atomic.Int32

	mu      sync.Mutex
	signals map[string]chan struct{}
	seen    []seenReq
}

// seenReq is one request head an origin read.
type seenReq struct {
	conn, nth int // the connection (from 0) and the request's rank on it (from 0)
	key       string
	header    http.Header
}

type originConn struct {
	h    *hostileOrigin
	c    net.Conn
	n    int
	nth  int
	br   *bufio.Reader
	last *http.Request
}

// newHostileOrigin starts an origin; rcvBuf, when not zero, is the receive
// buffer of every connection it accepts (set on the listener so that the
// window offered in the handshake is already small).
func newHostileOrigin(t *testing.T, rcvBuf int, scripts ...[]step) *hostileOrigin {
	t.Helper()
	h := &hostileOrigin{scripts: scripts, stop: make(chan struct{}), signals: map[string]chan struct{}{}}
	lc := net.ListenConfig{}
	if rcvBuf > 0 {
		lc.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			if err := rc.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, rcvBuf)
			}); err != nil {
				return err
			}
			return serr
		}
	}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h.addr = ln.Addr().String()
	// Counted as accepted, so that ended never misses a connection whose
	// script has not started yet.
	accepted := func(int) { h.accepted.Add(1); h.active.Add(1) }
	serveEach(t, ln, accepted, func(n int, c net.Conn) {
		defer h.active.Add(-1)
		o := &originConn{h: h, c: c, n: n, br: bufio.NewReader(c)}
		o.run(h.scripts[min(n, len(h.scripts)-1)])
	})
	// Registered after serveEach's, so it runs first: scripts waiting on
	// a signal or a delay end before their connections are closed.
	t.Cleanup(func() { close(h.stop) })
	return h
}

func (o *originConn) run(steps []step) error {
	for _, s := range steps {
		if err := s(o); err != nil {
			return err
		}
	}
	return nil
}

// signal returns the channel named name, made on first use.
func (h *hostileOrigin) signal(name string) chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := h.signals[name]
	if ch == nil {
		ch = make(chan struct{})
		h.signals[name] = ch
	}
	return ch
}

// fire closes the signal name once.
func (h *hostileOrigin) fire(name string) {
	ch := h.signal(name)
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// awaitSignal waits for the origin to fire name, failing the test after a
// deadline.
func (h *hostileOrigin) awaitSignal(t *testing.T, name string) {
	t.Helper()
	select {
	case <-h.signal(name):
	case <-time.After(5 * time.Second):
		t.Fatalf("the origin never signalled %q", name)
	}
}

func (h *hostileOrigin) record(o *originConn, r *http.Request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen = append(h.seen, seenReq{conn: o.n, nth: o.nth, key: r.Method + " " + r.RequestURI, header: r.Header})
	o.nth++
}

func (h *hostileOrigin) requests() []seenReq {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.seen)
}

// count returns how many times the origin read the request head key.
func (h *hostileOrigin) count(key string) int {
	n := 0
	for _, s := range h.requests() {
		if s.key == key {
			n++
		}
	}
	return n
}

// ended waits up to d for every connection's script to end, reporting
// whether they did.
func (h *hostileOrigin) ended(d time.Duration) bool {
	return testsupport.Poll(d, func() bool { return h.active.Load() == 0 })
}

// The steps.

// head reads one request head, and counts it.
func head() step {
	return func(o *originConn) error {
		r, err := http.ReadRequest(o.br)
		if err != nil {
			return err
		}
		o.last = r
		o.h.record(o, r)
		return nil
	}
}

// headWithin is head, giving up (ending the script) after d.
func headWithin(d time.Duration) step {
	return func(o *originConn) error {
		o.c.SetReadDeadline(time.Now().Add(d))
		err := head()(o)
		o.c.SetReadDeadline(time.Time{})
		return err
	}
}

// body reads the last request's body to its end.
func body() step {
	return func(o *originConn) error {
		_, err := io.Copy(io.Discard, o.last.Body)
		return err
	}
}

// request reads a whole request.
func request() step { return seq(head(), body()) }

// write writes raw bytes.
func write(raw string) step {
	return func(o *originConn) error {
		_, err := io.WriteString(o.c, raw)
		return err
	}
}

// echo answers 200 with the last request's method and target as the body,
// so that an answer delivered to another request shows.
func echo() step {
	return func(o *originConn) error {
		b := o.last.Method + " " + o.last.RequestURI
		_, err := fmt.Fprintf(o.c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(b), b)
		return err
	}
}

// after waits d: a delay that is part of the origin's behaviour.
func after(d time.Duration) step {
	return func(o *originConn) error {
		tm := time.NewTimer(d)
		defer tm.Stop()
		select {
		case <-tm.C:
			return nil
		case <-o.h.stop:
			return errEnd
		}
	}
}

// notify fires a signal the test waits on.
func notify(name string) step {
	return func(o *originConn) error {
		o.h.fire(name)
		return nil
	}
}

// await waits for a signal the test fires.
func await(name string) step {
	return func(o *originConn) error {
		select {
		case <-o.h.signal(name):
			return nil
		case <-o.h.stop:
			return errEnd
		}
	}
}

// closeConn closes the connection (a FIN, or a reset when request bytes
// are left unread); the script goes on.
func closeConn() step {
	return func(o *originConn) error {
		o.c.Close()
		return nil
	}
}

// reset closes the connection with a RST.
func reset() step {
	return func(o *originConn) error {
		if tc, ok := o.c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		o.c.Close()
		return nil
	}
}

// end ends the script.
func end() step { return func(*originConn) error { return errEnd } }

// drain reads until the edge closes the connection.
func drain() step {
	return func(o *originConn) error {
		_, err := io.Copy(io.Discard, o.br)
		if err == nil {
			err = io.EOF
		}
		return err
	}
}

// flood writes raw over and over until a write fails.
func flood(raw string) step {
	return func(o *originConn) error {
		for {
			if _, err := io.WriteString(o.c, raw); err != nil {
				return err
			}
		}
	}
}

// seq runs steps in order.
func seq(steps ...step) step {
	return func(o *originConn) error { return o.run(steps) }
}

// repeat runs steps in order again and again until one fails.
func repeat(steps ...step) step {
	return func(o *originConn) error {
		for {
			if err := o.run(steps); err != nil {
				return err
			}
		}
	}
}

// when runs steps if the last request head read starts with prefix
// ("POST", "GET /slow").
func when(prefix string, steps ...step) step {
	return func(o *originConn) error {
		if o.last == nil || !strings.HasPrefix(o.last.Method+" "+o.last.RequestURI, prefix) {
			return nil
		}
		return o.run(steps)
	}
}

// echoes serves any number of requests with echo.
func echoes() []step { return []step{repeat(request(), echo())} }

// The client side.

// hostileReq is one client request, sent on its own connection to the edge
// after the previous one was answered.
type hostileReq struct {
	after  string // send once the origin fired this signal
	method string
	target string
	header string // extra header lines, each ending in CRLF
	body   string
	// rest is more body, sent once the origin fired restAfter.
	rest, restAfter string

	wantStatus []int // any of these; empty means 200
	wantBody   string
	anyBody    bool                // do not check the body
	wantHeader map[string][]string // exact values on the response (nil: absent)
	// wantTrailer is the same for the response's trailers.
	wantTrailer map[string][]string
	wantErr     []error // Forward's error must match each
	// fresh: the origin must read this request first on its connection,
	// that is never on a connection that carried an earlier response.
	fresh bool
	// reused: the origin must first read this request on a connection
	// that carried an earlier one; a precondition of cases about reused
	// connections, so that they cannot pass without testing anything.
	reused bool
}

// rawResp is a response as the client read it off the wire, every header
// line kept (Go's client folds duplicate Content-Length fields into one).
type rawResp struct {
	status  int
	header  map[string][]string
	body    string
	trailer map[string][]string
	err     error
}

// hostileDo sends rq to the edge at addr and reads the response.
func hostileDo(o *hostileOrigin, addr string, rq hostileReq) rawResp {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return rawResp{err: err}
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: a\r\nConnection: close\r\n%s", rq.method, rq.target, rq.header)
	if n := len(rq.body) + len(rq.rest); n > 0 || rq.method == "POST" {
		fmt.Fprintf(&b, "Content-Length: %d\r\n", n)
	}
	b.WriteString("\r\n")
	b.WriteString(rq.body)
	if _, err := io.WriteString(c, b.String()); err != nil {
		return rawResp{err: err}
	}
	if rq.rest != "" {
		select {
		case <-o.signal(rq.restAfter):
		case <-time.After(5 * time.Second):
			return rawResp{err: fmt.Errorf("the origin never signalled %q", rq.restAfter)}
		}
		io.WriteString(c, rq.rest) // the edge may have stopped reading: its answer is what counts
	}
	return readRawResponse(bufio.NewReader(c), rq.method)
}

func readRawResponse(br *bufio.Reader, method string) rawResp {
	var r rawResp
	for {
		line, err := rawLine(br)
		if err != nil {
			r.err = fmt.Errorf("read status line: %w", err)
			return r
		}
		f := strings.SplitN(line, " ", 3)
		if len(f) < 2 {
			r.err = fmt.Errorf("status line %q", line)
			return r
		}
		if r.status, err = strconv.Atoi(f[1]); err != nil {
			r.err = fmt.Errorf("status line %q", line)
			return r
		}
		if r.header, err = rawFields(br); err != nil {
			r.err = fmt.Errorf("read header: %w", err)
			return r
		}
		if r.status >= 200 || r.status == 101 {
			break
		}
	}
	var sb strings.Builder
	switch {
	case method == "HEAD" || r.status == 204 || r.status == 304:
	case slices.ContainsFunc(r.header["Transfer-Encoding"], func(v string) bool { return strings.EqualFold(v, "chunked") }):
		for {
			line, err := rawLine(br)
			if err != nil {
				r.err = fmt.Errorf("read chunk size: %w", err)
				return r
			}
			size, _, _ := strings.Cut(line, ";")
			n, err := strconv.ParseUint(strings.TrimSpace(size), 16, 63)
			if err != nil {
				r.err = fmt.Errorf("chunk size %q", line)
				return r
			}
			if n == 0 {
				break
			}
			if _, err := io.CopyN(&sb, br, int64(n)); err != nil {
				r.err = fmt.Errorf("read chunk: %w", err)
				return r
			}
			if _, err := rawLine(br); err != nil {
				r.err = fmt.Errorf("read chunk end: %w", err)
				return r
			}
		}
		if r.trailer, r.err = rawFields(br); r.err != nil {
			r.err = fmt.Errorf("read trailer: %w", r.err)
		}
	case len(r.header["Content-Length"]) > 0:
		n, err := strconv.ParseInt(r.header["Content-Length"][0], 10, 64)
		if err != nil {
			r.err = fmt.Errorf("Content-Length %q", r.header["Content-Length"][0])
			return r
		}
		if _, err := io.CopyN(&sb, br, n); err != nil {
			r.err = fmt.Errorf("read body: %w", err)
		}
	default:
		if _, err := io.Copy(&sb, br); err != nil {
			r.err = fmt.Errorf("read body: %w", err)
		}
	}
	r.body = sb.String()
	return r
}

func rawLine(br *bufio.Reader) (string, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	return strings.TrimRight(line, "\r\n"), nil
}

// rawFields reads header lines up to the empty one, keeping every line.
func rawFields(br *bufio.Reader) (map[string][]string, error) {
	m := map[string][]string{}
	for {
		line, err := rawLine(br)
		if err != nil {
			return m, err
		}
		if line == "" {
			return m, nil
		}
		k, v, _ := strings.Cut(line, ":")
		k = http.CanonicalHeaderKey(k)
		m[k] = append(m[k], strings.TrimSpace(v))
	}
}

// hostileCase is one hostile origin and the clients that talk to it.
type hostileCase struct {
	name    string
	opts    Options
	rcvBuf  int      // the origin's receive buffer; zero: the system's
	scripts [][]step // per connection, the last one for every later one
	reqs    []hostileReq
	// wantSeen is how many times the origin must read each request head;
	// heads not named are not checked.
	wantSeen map[string]int
	// transportSeen replaces wantSeen on the transport path, which opens
	// a connection per request, where a case about reused connections
	// counts differently there.
	transportSeen map[string]int
	// originHeaders are the values every request must reach the origin
	// with, by name lower-cased with "_" read as "-" (nil: absent), as
	// an origin that aliases the two reads them.
	originHeaders map[string][]string
	// samePaths: both paths must answer every client alike.
	samePaths bool
}

const (
	evil     = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!"
	okResp   = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	created  = "HTTP/1.1 201 Created\r\nConnection: close\r\nContent-Length: 7\r\n\r\ncreated"
	lateWait = 20 * time.Millisecond
)

// lateBytes is a case where the origin answers req with first, then
// writes a complete second response lateWait later on the same
// connection; victims then ask for their own answers.
func lateBytes(name string, req hostileReq, first string) hostileCase {
	firstStep := request()
	if req.method == "HEAD" {
		firstStep = head()
	}
	reqs := []hostileReq{req}
	seen := map[string]int{req.method + " " + req.target: 1}
	for i := 0; i < 3; i++ {
		v := fmt.Sprintf("/echo?victim%d", i)
		reqs = append(reqs, hostileReq{method: "GET", target: v, wantBody: "GET " + v, fresh: i == 0})
		seen["GET "+v] = 1
	}
	reqs[1].after = "late"
	return hostileCase{
		name: name,
		scripts: [][]step{
			{firstStep, write(first), after(lateWait), write(evil), notify("late"), repeat(request(), echo())},
			echoes(),
		},
		reqs:     reqs,
		wantSeen: seen,
	}
}

// bodyOnNextRequest is a case where the origin answers req with first, a
// response that declares a body it does not carry (HEAD, 304), and sends
// that body only once the next request has arrived on the connection,
// where no peek before reuse can see it: the next request must go on a
// new connection.
func bodyOnNextRequest(name string, req hostileReq, first string) hostileCase {
	firstStep := request()
	if req.method == "HEAD" {
		firstStep = head()
	}
	v := "/echo?victim"
	return hostileCase{
		name: name,
		scripts: [][]step{
			{firstStep, write(first), request(), write(evil), echo()},
			echoes(),
		},
		reqs:     []hostileReq{req, {method: "GET", target: v, wantBody: "GET " + v, fresh: true}},
		wantSeen: map[string]int{req.method + " " + req.target: 1, "GET " + v: 1},
	}
}

// malformed is a case where the origin answers with a response whose
// framing is invalid: a 502, the request sent once.
func malformed(name, raw string) hostileCase {
	return hostileCase{
		name:    name,
		scripts: [][]step{{repeat(request(), write(raw))}},
		reqs: []hostileReq{{method: "GET", target: "/f", wantStatus: []int{502},
			anyBody: true, wantErr: []error{ErrNoUpstream, ErrUpstreamFailed}}},
		wantSeen: map[string]int{"GET /f": 1},
	}
}

func hostileCases() []hostileCase {
	const upload = 60 << 10 // buffered by the pooled client (maxBufferedBody)
	// The edge writes a buffered body in two writes (bufio); the origin
	// must answer and reset between them for the second to fail, which
	// the smallest receive buffer makes likely on any one POST, and 30 of
	// them all but certain.
	var earlyAnswers []hostileReq
	earlySeen := map[string]int{}
	for i := 0; i < 30; i++ {
		w, u := fmt.Sprintf("/warm%d", i), fmt.Sprintf("/upload%d", i)
		earlyAnswers = append(earlyAnswers,
			hostileReq{method: "POST", target: w, body: "w", wantBody: "POST " + w},
			hostileReq{method: "POST", target: u, body: strings.Repeat("u", upload), wantStatus: []int{201}, wantBody: "created", reused: true})
		earlySeen["POST "+u] = 1
	}

	return []hostileCase{
		// Bug 1: responses delivered to the wrong clients.
		lateBytes("late bytes after a HEAD response are never read as the next response",
			hostileReq{method: "HEAD", target: "/x", wantHeader: map[string][]string{"Content-Length": {"44"}}},
			"HTTP/1.1 200 OK\r\nContent-Length: 44\r\n\r\n"),
		lateBytes("late bytes after a body of declared length are never read as the next response",
			hostileReq{method: "GET", target: "/x", wantBody: "ok"}, okResp),
		lateBytes("late bytes after a 204 are never read as the next response",
			hostileReq{method: "GET", target: "/x", wantStatus: []int{204}}, "HTTP/1.1 204 No Content\r\n\r\n"),
		lateBytes("late bytes after a 304 are never read as the next response",
			hostileReq{method: "GET", target: "/x", wantStatus: []int{304}}, "HTTP/1.1 304 Not Modified\r\nEtag: \"v1\"\r\n\r\n"),
		bodyOnNextRequest("a body a HEAD response declared, sent once the next request arrived, never reaches it",
			hostileReq{method: "HEAD", target: "/x", wantHeader: map[string][]string{"Content-Length": {"44"}}},
			"HTTP/1.1 200 OK\r\nContent-Length: 44\r\n\r\n"),
		bodyOnNextRequest("a body a 304 declared, sent once the next request arrived, never reaches it",
			hostileReq{method: "GET", target: "/x", wantStatus: []int{304}}, "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n"),

		// Bug 2: a POST delivered twice.
		{
			name:     "an early answer to a buffered POST on a reused connection is relayed and the POST sent once",
			rcvBuf:   1, // raised to the system's minimum
			scripts:  [][]step{{repeat(head(), when("POST /upload", write(created), closeConn(), end()), body(), echo())}},
			reqs:     earlyAnswers,
			wantSeen: earlySeen,
		},
		{
			name: "an early answer to a streamed upload is relayed and the upload sent once",
			// The origin says when it answered: the client sends the rest
			// of its body only then, so the edge is still writing it.
			scripts: [][]step{{repeat(head(), when("POST /stream", write(created), closeConn(), notify("answered"), end()), body(), echo())}},
			reqs: []hostileReq{
				{method: "POST", target: "/warm", body: "w", wantBody: "POST /warm"},
				{method: "POST", target: "/stream", body: strings.Repeat("s", 1<<10),
					rest: strings.Repeat("s", 200<<10), restAfter: "answered",
					wantStatus: []int{201}, wantBody: "created"},
			},
			wantSeen: map[string]int{"POST /stream": 1},
		},

		// Bug 3: a connection the origin closed while idle.
		{
			name: "a POST after the origin closed a GET's idle connection goes on a new one, once",
			scripts: [][]step{
				{request(), write(okResp), closeConn(), notify("idle-closed")},
				echoes(),
			},
			reqs: []hostileReq{
				{method: "GET", target: "/first", wantBody: "ok"},
				{after: "idle-closed", method: "POST", target: "/submit", body: "payload", wantBody: "POST /submit", fresh: true},
			},
			wantSeen: map[string]int{"POST /submit": 1},
		},
		{
			// The same, the closed connection one a POST used: both
			// requests take the same path whichever carries bodies.
			name: "a POST after the origin closed a POST's idle connection goes on a new one, once",
			scripts: [][]step{
				{request(), write(okResp), closeConn(), notify("idle-closed")},
				echoes(),
			},
			reqs: []hostileReq{
				{method: "POST", target: "/first", body: "1", wantBody: "ok"},
				{after: "idle-closed", method: "POST", target: "/submit", body: "payload", wantBody: "POST /submit", fresh: true},
			},
			wantSeen: map[string]int{"POST /first": 1, "POST /submit": 1},
		},

		// Bug 4: a response-header timeout is final.
		{
			name:    "a response-header timeout on a reused connection is a 504 and the GET is not sent again",
			opts:    Options{ResponseHeaderTimeout: 150 * time.Millisecond},
			scripts: [][]step{{repeat(request(), when("GET /slow", after(400*time.Millisecond)), echo())}},
			reqs: []hostileReq{
				{method: "GET", target: "/warm", wantBody: "GET /warm"},
				{method: "GET", target: "/slow", wantStatus: []int{504}, anyBody: true, wantErr: []error{ErrUpstreamTimeout}, reused: true},
			},
			wantSeen: map[string]int{"GET /warm": 1, "GET /slow": 1},
		},

		// The re-send rules the fixes keep.
		{
			name: "a GET the origin drops unanswered on a reused connection is sent once more",
			scripts: [][]step{
				{request(), echo(), request(), reset()},
				echoes(),
			},
			reqs: []hostileReq{
				{method: "GET", target: "/warm", wantBody: "GET /warm"},
				{method: "GET", target: "/probe", wantBody: "GET /probe", reused: true},
			},
			wantSeen:      map[string]int{"GET /probe": 2},
			transportSeen: map[string]int{"GET /probe": 1},
		},
		{
			name:    "a POST the origin read and dropped unanswered on a reused connection is a 502, never sent again",
			scripts: [][]step{{repeat(request(), when("POST /charge", reset(), end()), echo())}},
			reqs: []hostileReq{
				{method: "POST", target: "/warm", body: "w", wantBody: "POST /warm"},
				{method: "POST", target: "/charge", body: "x=1", wantStatus: []int{502}, anyBody: true,
					wantErr: []error{ErrNoUpstream, ErrUpstreamFailed}, reused: true},
			},
			wantSeen: map[string]int{"POST /charge": 1},
		},

		// Bug 5: framing.
		{
			name:    "two identical Content-Length fields reach the client as one",
			scripts: [][]step{{repeat(request(), write("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello"))}},
			reqs: []hostileReq{{method: "GET", target: "/f", wantBody: "hello",
				wantHeader: map[string][]string{"Content-Length": {"5"}}}},
			wantSeen: map[string]int{"GET /f": 1},
		},
		malformed("a Content-Length of -0 is a 502", "HTTP/1.1 200 OK\r\nContent-Length: -0\r\n\r\n"),
		malformed("a Content-Length of +5 is a 502", "HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello"),
		malformed("a Content-Length list of equal values in one field is a 502", "HTTP/1.1 200 OK\r\nContent-Length: 5, 5\r\n\r\nhello"),
		malformed("a Content-Length list of differing values in one field is a 502", "HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello"),
		malformed("two differing Content-Length fields are a 502", "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello"),
		{
			name: "a chunked HTTP/1.0 response leaves its connection out of the pool",
			scripts: [][]step{
				{request(), write("HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: keep-alive\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
					repeat(headWithin(300*time.Millisecond), body(), echo())},
				echoes(),
			},
			reqs: []hostileReq{
				{method: "GET", target: "/first", wantStatus: []int{200, 502}, anyBody: true},
				{method: "GET", target: "/second", wantBody: "GET /second", fresh: true},
			},
			wantSeen: map[string]int{"GET /first": 1, "GET /second": 1},
		},
		{
			name: "framing and connection fields in a trailer are never forwarded, other trailers are",
			scripts: [][]step{{repeat(request(), write("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: Grpc-Status, Grpc-Message\r\n\r\n"+
				"5\r\nhello\r\n0\r\nGrpc-Status: 0\r\nGrpc-Message: ok\r\nContent-Length: 999\r\nTransfer-Encoding: chunked\r\n"+
				"Host: evil.example\r\nConnection: close\r\nTrailer: X-Evil\r\nTe: trailers\r\nKeep-Alive: timeout=1\r\n\r\n"))}},
			reqs: []hostileReq{{method: "GET", target: "/t", wantBody: "hello", wantTrailer: map[string][]string{
				"Grpc-Status": {"0"}, "Grpc-Message": {"ok"},
				"Content-Length": nil, "Transfer-Encoding": nil, "Host": nil, "Connection": nil,
				"Trailer": nil, "Te": nil, "Keep-Alive": nil,
			}}},
			wantSeen: map[string]int{"GET /t": 1},
		},

		// Bug 6: header names that alias forwarding and hop-by-hop ones.
		{
			name:    "header names that alias a forwarding or hop-by-hop header once _ reads as - never reach the origin",
			scripts: [][]step{echoes()},
			reqs: []hostileReq{{method: "GET", target: "/h", wantBody: "GET /h",
				header: "X_Forwarded_For: 6.6.6.6\r\nX-Real_Ip: 6.6.6.6\r\nX_Forwarded_Host: evil.example\r\n" +
					"X-Forwarded_Proto: https\r\nProxy_Connection: keep-alive\r\nTransfer_Encoding: chunked\r\nX_Custom: ok\r\n"}},
			wantSeen: map[string]int{"GET /h": 1},
			originHeaders: map[string][]string{
				"x-forwarded-for": {"127.0.0.1"}, "x-real-ip": nil, "x-forwarded-host": {"a"},
				"x-forwarded-proto": {"http"}, "proxy-connection": nil, "transfer-encoding": nil,
				"x-custom": {"ok"},
			},
		},

		// 1xx floods: bounded, and the same answer on both paths.
		{
			name: "2000 informational responses before the final one end in the final response or a 502, alike on both paths",
			scripts: [][]step{{repeat(request(), write(strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n"+
				"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n", 1000)+okResp))}},
			reqs:      []hostileReq{{method: "GET", target: "/1xx", wantStatus: []int{200, 502}, wantBody: "ok"}},
			wantSeen:  map[string]int{"GET /1xx": 1},
			samePaths: true,
		},
		{
			name:      "an endless stream of informational responses is a 502 on both paths",
			scripts:   [][]step{{request(), flood("HTTP/1.1 100 Continue\r\n\r\n")}},
			reqs:      []hostileReq{{method: "GET", target: "/1xx", wantStatus: []int{502}, anyBody: true, wantErr: []error{ErrNoUpstream}}},
			wantSeen:  map[string]int{"GET /1xx": 1},
			samePaths: true,
		},
	}
}

func TestHostileOrigins(t *testing.T) {
	for _, tc := range hostileCases() {
		t.Run(tc.name, func(t *testing.T) {
			answers := map[string][]string{}
			for _, path := range paths {
				t.Run(path.name, func(t *testing.T) {
					answers[path.name] = runHostile(t, tc, path.name, path.h1Off)
				})
			}
			if a, b := answers[paths[0].name], answers[paths[1].name]; tc.samePaths && !slices.Equal(a, b) {
				t.Errorf("the paths answered differently: %s: %q; %s: %q",
					paths[0].name, a, paths[1].name, b)
			}
		})
	}
}

// runHostile runs tc on one path and returns what the clients received,
// status and body.
func runHostile(t *testing.T, tc hostileCase, pathName string, h1Off bool) []string {
	o := newHostileOrigin(t, tc.rcvBuf, tc.scripts...)
	p := newPathProxy(t, tc.opts, h1Off)
	e := startEdge(t, p, node.Upstream{Node: "origin", Address: o.addr})

	var clients, answers []string
	for i, rq := range tc.reqs {
		if rq.after != "" {
			o.awaitSignal(t, rq.after)
		}
		got := hostileDo(o, e.addr, rq)
		what := rq.method + " " + rq.target
		if got.err != nil {
			t.Errorf("request %d (%s): %v", i, what, got.err)
			clients = append(clients, fmt.Sprintf("%s→error(%v)", what, got.err))
			answers = append(answers, "error")
			continue
		}
		c := e.next(t)
		clients = append(clients, fmt.Sprintf("%s→%d %q%s", what, got.status, short(got.body), errNote(c.err)))
		answers = append(answers, fmt.Sprintf("%d %q", got.status, got.body))

		want := rq.wantStatus
		if len(want) == 0 {
			want = []int{200}
		}
		if !slices.Contains(want, got.status) {
			t.Errorf("%s: status = %d %q, want one of %v", what, got.status, short(got.body), want)
		}
		if got.status < 300 && !rq.anyBody && got.body != rq.wantBody {
			t.Errorf("%s: body = %q, want %q", what, got.body, rq.wantBody)
		}
		if got.status < 400 && c.err != nil {
			t.Errorf("%s: Forward error = %v with a %d relayed, want none", what, c.err, got.status)
		}
		for _, we := range rq.wantErr {
			if !errors.Is(c.err, we) {
				t.Errorf("%s: Forward error = %v, want it to match %v", what, c.err, we)
			}
		}
		checkFields(t, what+": header", got.header, rq.wantHeader)
		checkFields(t, what+": trailer", got.trailer, rq.wantTrailer)
	}

	// Counted only once nothing can still reach the origin: the idle
	// connections are closed and every connection's script has ended.
	p.Close()
	allEnded := o.ended(5 * time.Second)
	if !allEnded {
		t.Errorf("%d origin connections still open after the clients were answered and idle connections closed", o.active.Load())
	}
	seen := o.requests()
	var seenFig []string
	for _, s := range seen {
		seenFig = append(seenFig, fmt.Sprintf("%s@c%d#%d", s.key, s.conn, s.nth))
	}
	t.Logf("figures: case=%q path=%q clients=[%s] seen=[%s] conns=%d ended=%t",
		tc.name, pathName, strings.Join(clients, " | "), strings.Join(seenFig, " "), o.accepted.Load(), allEnded)

	wantSeen := tc.wantSeen
	if h1Off && tc.transportSeen != nil {
		wantSeen = tc.transportSeen
	}
	for key, want := range wantSeen {
		if n := o.count(key); n != want {
			t.Errorf("the origin read %q %d times, want %d", key, n, want)
		}
	}
	for _, rq := range tc.reqs {
		key := rq.method + " " + rq.target
		// The transport opens a connection per request: only the
		// pooled client has reused connections to test.
		if rq.reused && !h1Off {
			if i := slices.IndexFunc(seen, func(s seenReq) bool { return s.key == key }); i >= 0 && seen[i].nth == 0 {
				t.Errorf("%s first reached the origin on a new connection: the case no longer tests a reused one", key)
			}
		}
		if !rq.fresh {
			continue
		}
		for _, s := range seen {
			if s.key == key && s.nth != 0 {
				t.Errorf("%s reached the origin as request %d of connection %d, want it first on a new connection",
					key, s.nth+1, s.conn)
			}
		}
	}
	if tc.originHeaders != nil {
		for _, s := range seen {
			got := map[string][]string{}
			for k, vs := range s.header {
				n := strings.ToLower(strings.ReplaceAll(k, "_", "-"))
				got[n] = append(got[n], vs...)
			}
			for n, want := range tc.originHeaders {
				g := slices.Clone(got[n])
				slices.Sort(g)
				if !slices.Equal(g, want) {
					t.Errorf("%s reached the origin with %s (any spelling) = %q, want %q", s.key, n, g, want)
				}
			}
		}
	}
	return answers
}

// checkFields checks exact values (nil: absent) in a raw header or trailer.
func checkFields(t *testing.T, what string, got map[string][]string, want map[string][]string) {
	t.Helper()
	for k, w := range want {
		if g := got[k]; !slices.Equal(g, w) {
			t.Errorf("%s %s = %q, want %q", what, k, g, w)
		}
	}
}

func short(s string) string {
	if len(s) > 24 {
		return s[:24] + "…"
	}
	return s
}

func errNote(err error) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	if len(s) > 90 {
		s = s[:90] + "…"
	}
	return " err=" + strconv.Quote(s)
}

// Bug 7: uploads to an origin that stops reading.

// genReader produces n bytes without holding them, standing for a client
// that keeps uploading.
type genReader struct {
	left int64
	read atomic.Int64
}

func (g *genReader) Read(p []byte) (int, error) {
	if g.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > g.left {
		p = p[:g.left]
	}
	for i := range p {
		p[i] = 'g'
	}
	g.left -= int64(len(p))
	g.read.Add(int64(len(p)))
	return len(p), nil
}

// sendTimeout returns opts with Options.SendTimeout set to d.
func sendTimeout(opts Options, d time.Duration) Options {
	opts.SendTimeout = d
	return opts
}

func TestHostileUploads(t *testing.T) {
	// Beyond what the socket buffers hold (the edge's buffers for the
	// client's side grow as it reads), so that writes block.
	const size = 64 << 20
	// guard ends a wait for an edge that never gives up: a failure.
	const guard = 2500 * time.Millisecond
	tests := []struct {
		name        string
		sendTimeout time.Duration
		length      int64 // the request's ContentLength: -1 streams it chunked
		// viaEdge sends the upload through the test edge from a raw
		// client; otherwise Forward is called with a context the test
		// cancels.
		viaEdge bool
		leave   bool // the client leaves once the origin read the head
		// within bounds the time from the origin reading the head (or
		// the client leaving) to Forward returning.
		within time.Duration
	}{
		{
			name:        "a client whose context is cancelled mid-upload frees the origin connection at once",
			sendTimeout: -1, // no bound: only the client's leaving can end it
			length:      -1,
			leave:       true,
			within:      2 * time.Second,
		},
		{
			name:        "an origin that stops reading fails the upload after SendTimeout",
			sendTimeout: 300 * time.Millisecond,
			length:      size,
			within:      300*time.Millisecond + 1700*time.Millisecond,
		},
		{
			// The client leaves once its writes stall, that is once the
			// edge stopped reading its body because the write upstream
			// blocks: nothing then reads the client's connection, so Go's
			// server cannot see it close and cancel the context, and
			// SendTimeout is what frees the origin connection.
			name:        "a client that closes its connection while the upload is stalled frees the origin connection within SendTimeout",
			sendTimeout: 300 * time.Millisecond,
			length:      size,
			viaEdge:     true,
			leave:       true,
			within:      300*time.Millisecond + 1700*time.Millisecond,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, path := range paths {
				t.Run(path.name, func(t *testing.T) {
					o := newHostileOrigin(t, 0, []step{head(), notify("head"), await("release"), drain()})
					p := newPathProxy(t, sendTimeout(Options{}, tt.sendTimeout), path.h1Off)
					ups := []node.Upstream{{Node: "origin", Address: o.addr}}
					gen := &genReader{left: size}

					var done <-chan call
					var leave func()
					var ctxErr func() error
					if tt.viaEdge {
						e := startEdge(t, p, ups...)
						conn, err := net.Dial("tcp", e.addr)
						if err != nil {
							t.Fatal(err)
						}
						fmt.Fprintf(conn, "POST /upload HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n", size)
						// The client writes until a write makes no progress
						// for a while: the edge is no longer reading.
						stalled := make(chan struct{})
						go func() {
							defer close(stalled)
							buf := make([]byte, 64<<10)
							for {
								n, _ := gen.Read(buf)
								if n == 0 {
									return
								}
								conn.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
								if _, err := conn.Write(buf[:n]); err != nil {
									return
								}
							}
						}()
						t.Cleanup(func() { conn.Close(); <-stalled })
						done, ctxErr = e.calls, func() error { return nil }
						leave = func() {
							select {
							case <-stalled:
							case <-time.After(5 * time.Second):
								t.Error("the client's upload never stalled")
							}
							conn.Close()
						}
					} else {
						// The context's deadline is the guard here.
						ctx, cancel := context.WithTimeout(context.Background(), guard)
						defer cancel()
						r := httptest.NewRequest("POST", "/upload", io.NopCloser(gen))
						r.ContentLength = tt.length
						r = r.WithContext(ctx)
						ch := make(chan call, 1)
						go func() {
							res, err := p.Forward(httptest.NewRecorder(), r, ups)
							ch <- call{res, err}
						}()
						done, leave, ctxErr = ch, cancel, ctx.Err
					}

					o.awaitSignal(t, "head")
					// Timed from the head's arrival, or from the client's
					// leaving when it leaves.
					start := time.Now()
					if tt.leave {
						leave()
						start = time.Now()
					}
					var c call
					returned := true
					select {
					case c = <-done:
					case <-time.After(guard):
						returned = false
					}
					took := time.Since(start)
					guardFired := !returned || (!tt.leave && ctxErr() != nil)

					// Now the origin reads again: if the edge closed the
					// connection it reaches the end at once; if not, it
					// reads the rest of the upload and waits.
					o.fire("release")
					if !returned {
						select {
						case c = <-done:
						case <-time.After(10 * time.Second):
							t.Fatal("Forward never returned, even once the origin read again")
						}
					}
					closed := o.ended(2 * time.Second)
					t.Logf("figures: case=%q path=%q forward=%s status=%d%s guard_fired=%t body_read=%d origin_closed=%t conns=%d seen=%d",
						tt.name, path.name, took.Round(10*time.Millisecond), c.res.Status, errNote(c.err), guardFired,
						gen.read.Load(), closed, o.accepted.Load(), o.count("POST /upload"))

					if took > tt.within || guardFired {
						t.Errorf("Forward returned after %s (guard fired: %t), want within %s", took.Round(10*time.Millisecond), guardFired, tt.within)
					}
					if c.res.Status != 0 {
						t.Errorf("status written = %d, want nothing: the origin never answered", c.res.Status)
					}
					switch {
					case tt.leave && !tt.viaEdge && !errors.Is(c.err, context.Canceled):
						t.Errorf("Forward error = %v, want it to match context.Canceled", c.err)
					case !tt.leave && !errors.Is(c.err, ErrNoUpstream) && !errors.Is(c.err, ErrUpstreamTimeout):
						t.Errorf("Forward error = %v, want ErrNoUpstream or ErrUpstreamTimeout", c.err)
					case c.err == nil:
						t.Errorf("Forward error = nil, want one")
					}
					if !closed {
						t.Errorf("the origin connection was still open 2s after Forward returned, want it closed")
					}
					if n, conns := o.count("POST /upload"), o.accepted.Load(); n != 1 || conns != 1 {
						t.Errorf("the origin read the upload %d times on %d connections, want once on 1", n, conns)
					}
				})
			}
		})
	}
}
