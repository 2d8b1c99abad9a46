package e2e

// Hostile input: malformed and smuggling-shaped requests (this file), slow
// clients (hostile_slow_test.go), HTTP/2 smuggling and floods
// (hostile_h2_test.go) and a flood of TLS handshakes for names nobody
// serves (hostile_tlsflood_test.go), each against the real binary on
// loopback. Like reliability_test.go, each test logs its figures in a
// "figures:" line.

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/node"
)

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
		{name: "an untrusted client's client-address claims are dropped",
			req:    "GET /claims HTTP/1.1\r\nHost: a.example\r\nTrue-Client-IP: 6.6.6.6\r\nCF-Connecting-IP: 6.6.6.6\r\nX-Real-IP: 6.6.6.6\r\nX-Client-IP: 6.6.6.6\r\n\r\n",
			status: []int{200}, to: "A",
			check: func(head, body string) error {
				if strings.Contains(head, "6.6.6.6") {
					return fmt.Errorf("a claimed client address reached the upstream:\n%s", head)
				}
				return nil
			}},
		{name: "a target in scheme:opaque form is 400", req: "GET a:v1/storage HTTP/1.1\r\nHost: a.example\r\n\r\n", status: []int{400}},
		{name: "a target in scheme:opaque form with userinfo is 400", req: "GET a:@evil.example HTTP/1.1\r\nHost: a.example\r\n\r\n", status: []int{400}},
		{name: "an asterisk target is 400 but for OPTIONS", req: "GET * HTTP/1.1\r\nHost: a.example\r\n\r\n", status: []int{400}},
		{name: "an absolute-form target without a path goes to / whatever its query holds",
			req: "GET http://a.example?x=/evil HTTP/1.1\r\nHost: a.example\r\n\r\n", status: []int{200}, to: "A",
			check: func(head, body string) error {
				if line, _, _ := strings.Cut(head, "\r\n"); !strings.HasPrefix(line, "GET /?x=/evil ") {
					return fmt.Errorf("A received %q", line)
				}
				return nil
			}},
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
