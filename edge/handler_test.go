package edge

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/backhaul"
	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

// upstream is a loopback upstream that records the request-URI it received.
type upstream struct {
	name string
	srv  *httptest.Server
	mu   sync.Mutex
	uris []string
}

func newUpstream(t *testing.T, name string) *upstream {
	u := &upstream{name: name}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.uris = append(u.uris, r.RequestURI)
		u.mu.Unlock()
		fmt.Fprintf(w, "%s %s", u.name, r.RequestURI)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) addr() string { return u.srv.Listener.Addr().String() }

func (u *upstream) hits() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.uris)
}

type recorder struct {
	mu   sync.Mutex
	recs []Record
}

func (r *recorder) Observe(rec *Record) {
	r.mu.Lock()
	r.recs = append(r.recs, *rec)
	r.mu.Unlock()
}

// awaitLast waits for a record, which the handler makes after the
// response (or the close) the client sees, and returns the last.
func (r *recorder) awaitLast(t *testing.T) Record {
	t.Helper()
	testsupport.WaitFor(t, 10*time.Second, "the request's record", func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.recs) > 0
	})
	return r.last()
}

func (r *recorder) last() Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.recs[len(r.recs)-1]
}

type handlerFixture struct {
	live    *Live
	h       *Handler
	srv     *httptest.Server
	obs     *recorder
	classic *upstream
	goapp   *upstream
	api     *upstream
}

func newHandlerFixture(t *testing.T) *handlerFixture {
	f := &handlerFixture{
		live:    &Live{},
		obs:     &recorder{},
		classic: newUpstream(t, "classic"),
		goapp:   newUpstream(t, "go"),
		api:     newUpstream(t, "api"),
	}
	proxy := testsupport.Must(backhaul.New(backhaul.Options{}))
	t.Cleanup(proxy.Close)
	f.h = &Handler{Table: f.live, Forwarder: proxy, Observer: f.obs}
	f.srv = httptest.NewServer(f.h)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *handlerFixture) load(t *testing.T, extra ...node.Route) {
	t.Helper()
	doc := &node.Document{V: 1, Routes: append([]node.Route{
		{Host: "ti.to", Application: "classic", Upstreams: []node.Upstream{{Node: "a", Address: f.classic.addr()}},
			Paths: map[string]string{"paulca": "go.tito.io"}},
		{Host: "go.tito.io", Application: "tito-go", Upstreams: []node.Upstream{{Node: "b", Address: f.goapp.addr()}}},
	}, extra...),
		API: &node.API{Hosts: []string{"apps.example.com"}, Upstreams: []node.Upstream{{Node: "a", Address: f.api.addr()}}},
	}
	tbl, drops := Compile(doc)
	if len(drops) > 0 {
		t.Fatalf("drops: %v", drops)
	}
	f.live.Store(tbl)
}

// rawRequest sends request bytes over a fresh TCP connection and returns
// the status line and body. Go's client would clean odd paths; this does not.
func rawRequest(t *testing.T, addr, req string) (status, body string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read response to %q: %v", req, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.Status, string(b)
}

func TestHandlerAnswersBeforeTheFirstDocument(t *testing.T) {
	f := newHandlerFixture(t)
	resp, err := http.Get(f.srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "no routing document") {
		t.Errorf("before the first document: %d Retry-After=%q %q, want 503 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if got := f.obs.last().Reason; got != ReasonNoDocument {
		t.Errorf("reason = %q, want %q", got, ReasonNoDocument)
	}
}

func TestHandlerStatuses(t *testing.T) {
	f := newHandlerFixture(t)
	dead := testsupport.ClosedAddr(t)
	f.load(t,
		node.Route{Host: "down.example", Application: "down", Upstreams: []node.Upstream{{Node: "x", Address: dead}, {Node: "y", Address: testsupport.ClosedAddr(t)}}},
		node.Route{Host: "failover.example", Application: "failover", Upstreams: []node.Upstream{{Node: "x", Address: dead}, {Node: "b", Address: f.goapp.addr()}}},
	)
	addr := f.srv.Listener.Addr().String()
	cases := []struct {
		name, req, wantStatus, wantBody string
		wantReason                      Reason
	}{
		{"host routing reaches the route's upstream",
			"GET /x HTTP/1.1\r\nHost: go.tito.io\r\n\r\n", "200 OK", "go /x", ""},
		{"a path flip reaches the target with the original bytes",
			"GET //paulca/../x/%2e HTTP/1.1\r\nHost: ti.to\r\n\r\n", "200 OK", "go //paulca/../x/%2e", ""},
		{"a host nothing names is answered 404 by the edge",
			"GET / HTTP/1.1\r\nHost: nobody.example\r\n\r\n", "404 Not Found", "no route", ReasonNoRoute},
		{"a malformed host is answered 400",
			"GET / HTTP/1.1\r\nHost: bad_host!\r\n\r\n", "400 Bad Request", "", ReasonBadHost},
		{"the API apex is proxied",
			"GET /v1/apps HTTP/1.1\r\nHost: apps.example.com\r\n\r\n", "200 OK", "api /v1/apps", ""},
		{"a denied API prefix is answered 403 and never proxied",
			"GET /v1/%73torage/objects/k HTTP/1.1\r\nHost: apps.example.com\r\n\r\n", "403 Forbidden", "not served publicly", ReasonDenied},
		{"the mandatory routes prefix is denied though the document omits it",
			"GET /v1/ingress/routes HTTP/1.1\r\nHost: apps.example.com\r\n\r\n", "403 Forbidden", "not served publicly", ReasonDenied},
		{"a dead first upstream fails over without the client noticing",
			"POST /f HTTP/1.1\r\nHost: failover.example\r\nContent-Length: 3\r\n\r\nabc", "200 OK", "go /f", ""},
		{"every upstream closed is 502 from the edge",
			"GET / HTTP/1.1\r\nHost: down.example\r\n\r\n", "502 Bad Gateway", "no upstream could be reached", ReasonNoUpstream},
		{"CONNECT is refused: the edge is not a forward proxy",
			"CONNECT go.tito.io:443 HTTP/1.1\r\nHost: go.tito.io:443\r\n\r\n", "405 Method Not Allowed", "CONNECT", ReasonMethod},
		{"an absolute-form target naming an unrouted host is not proxied",
			"GET http://nobody.example/ HTTP/1.1\r\nHost: go.tito.io\r\n\r\n", "404 Not Found", "no route", ReasonNoRoute},
		{"an absolute-form target reaches only its own route, in origin form",
			"GET http://go.tito.io/a?b=1 HTTP/1.1\r\nHost: go.tito.io\r\n\r\n", "200 OK", "go /a?b=1", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := f.classic.hits() + f.api.hits()
			status, body := rawRequest(t, addr, c.req)
			if status != c.wantStatus || !strings.Contains(body, c.wantBody) {
				t.Errorf("got %s %q, want %s containing %q", status, body, c.wantStatus, c.wantBody)
			}
			if c.wantReason != "" {
				if got := f.obs.last().Reason; got != c.wantReason {
					t.Errorf("reason = %q, want %q", got, c.wantReason)
				}
				if after := f.classic.hits() + f.api.hits(); after != before {
					t.Errorf("an upstream was contacted for a request the edge answered itself")
				}
			}
		})
	}
}

func TestHandlerAttributesPathHitsToTheTarget(t *testing.T) {
	f := newHandlerFixture(t)
	f.load(t)
	rawRequest(t, f.srv.Listener.Addr().String(), "GET /paulca/x HTTP/1.1\r\nHost: ti.to\r\n\r\n")
	rec := f.obs.last()
	if rec.Route == nil || rec.Route.Application != "tito-go" || rec.Prefix != "paulca" || rec.Node != "b" || rec.Status != 200 {
		t.Errorf("record = %+v, want application tito-go via prefix paulca on node b (docs/design.md rule 5)", rec)
	}
}

func TestHandlerMisdirectedRequest(t *testing.T) {
	f := newHandlerFixture(t)
	f.load(t)
	cases := []struct {
		name, sni, host string
		covers          func(sni, host string) bool
		want            int
	}{
		{"Host equal to SNI is served", "go.tito.io", "go.tito.io:443", nil, 200},
		{"Host differing only in case and trailing dot is served", "go.tito.io", "GO.tito.io.", nil, 200},
		{"Host another name than SNI is 421", "go.tito.io", "ti.to", nil, 421},
		{"a malformed Host on TLS is 400, not 421", "go.tito.io", "bad host", nil, 400},
		{"a certificate covering both names serves", "ti.to", "go.tito.io", func(sni, host string) bool { return true }, 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f.h.Covers = c.covers
			r := httptest.NewRequest("GET", "https://example.com/", nil)
			r.Host = c.host
			r.TLS = &tls.ConnectionState{ServerName: c.sni}
			w := httptest.NewRecorder()
			f.h.ServeHTTP(w, r)
			if w.Code != c.want {
				t.Errorf("SNI %q Host %q: %d %q, want %d", c.sni, c.host, w.Code, w.Body, c.want)
			}
		})
	}
}

func TestHandlerKeepsTheTableItStartedWith(t *testing.T) {
	// A request holds the table it loaded (docs/design.md rule 2): swapping in a
	// document without its host mid-request does not affect it.
	f := newHandlerFixture(t)
	f.load(t)
	held := make(chan struct{})
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(held)
		<-release
		io.WriteString(w, "slow done")
	}))
	defer slow.Close()
	f.load(t, node.Route{Host: "slow.example", Application: "slow", Upstreams: []node.Upstream{{Node: "s", Address: slow.Listener.Addr().String()}}})
	done := make(chan string, 1)
	go func() {
		_, body := rawRequest(t, f.srv.Listener.Addr().String(), "GET / HTTP/1.1\r\nHost: slow.example\r\n\r\n")
		done <- body
	}()
	<-held
	f.load(t) // slow.example is gone from the new table
	close(release)
	if body := <-done; body != "slow done" {
		t.Errorf("in-flight request across a swap got %q", body)
	}
	if status, _ := rawRequest(t, f.srv.Listener.Addr().String(), "GET / HTTP/1.1\r\nHost: slow.example\r\n\r\n"); status != "404 Not Found" {
		t.Errorf("after the swap: %s, want 404", status)
	}
}

func BenchmarkHandlerNoRoute(b *testing.B) {
	tbl, _ := Compile(testDocument())
	live := &Live{}
	live.Store(tbl)
	h := &Handler{Table: live}
	r := httptest.NewRequest("GET", "http://nobody.example/", nil)
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(w, r)
	}
}

type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(int)             {}

func TestHandlerRefusesTargetsThatCannotBeForwardedVerbatim(t *testing.T) {
	// Go's HTTP/2 and HTTP/3 servers accept a :path with a space; forwarded
	// byte for byte it would split the upstream's HTTP/1.1 request line.
	f := newHandlerFixture(t)
	f.load(t)
	for _, target := range []string{"/a b", "/a HTTP/1.0\r\nX: y", "/a\tb", "/a\x7fb", "/a\x00"} {
		r := httptest.NewRequest("GET", "https://go.tito.io/", nil)
		r.ProtoMajor, r.Proto, r.RequestURI = 2, "HTTP/2.0", target
		w := httptest.NewRecorder()
		f.h.ServeHTTP(w, r)
		if w.Code != 400 || !strings.Contains(w.Body.String(), "request target") || f.goapp.hits() != 0 {
			t.Errorf("target %q: %d %q, upstream hits %d; want 400 and nothing forwarded", target, w.Code, w.Body, f.goapp.hits())
		}
	}
}

// A client that half-closes after its request (as `nc -N` and some
// HTTP/1.0 clients do) is taken by Go's server for one that cancelled it.
// It may still be reading: it must not be told 200 with an empty body, a
// success that never was, but see its connection closed with no answer.
func TestHandlerAnswersNoHalfClosedClientASuccessThatNeverWas(t *testing.T) {
	f := newHandlerFixture(t)
	// An upstream that never answers: whether the edge forwarded the
	// request before it saw the half-close or not, the client's answer can
	// only be the edge's. (Close waits for its handler, which the edge's
	// giving up on the request ends.)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	t.Cleanup(slow.Close)
	f.load(t, node.Route{Host: "slow.example", Upstreams: []node.Upstream{{Node: "a", Address: slow.Listener.Addr().String()}}})

	c, err := net.Dial("tcp", f.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, "GET /report HTTP/1.1\r\nHost: slow.example\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("reading after the half-close: %v (%q so far)", err, got)
	}
	if len(got) != 0 {
		t.Fatalf("the half-closed client was answered %q, want its connection closed with no answer", got)
	}
	if rec := f.obs.awaitLast(t); rec.Status != 499 || rec.Reason != ReasonCanceled {
		t.Errorf("recorded %d %q, want 499 %q", rec.Status, rec.Reason, ReasonCanceled)
	}
}

// A request whose body breaks off while its client is still connected (a
// malformed chunk here) gets the edge's 400, not a silent close and not an
// empty 200.
func TestHandlerAnswersABrokenBody400(t *testing.T) {
	f := newHandlerFixture(t)
	f.load(t)
	status, body := rawRequest(t, f.srv.Listener.Addr().String(),
		"POST /upload HTTP/1.1\r\nHost: ti.to\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nZZ\r\n")
	if status != "400 Bad Request" || body != selfAnswers[ReasonBadBody].body {
		t.Fatalf("a malformed chunk: %q %q, want 400 %q", status, body, selfAnswers[ReasonBadBody].body)
	}
	if rec := f.obs.awaitLast(t); rec.Status != 400 || rec.Reason != ReasonBadBody {
		t.Errorf("recorded %d %q, want 400 %q", rec.Status, rec.Reason, ReasonBadBody)
	}
}
