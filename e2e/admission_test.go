package e2e

// Admission control through the binary: the connection budget, the fair
// shares of applications and client addresses, and shedding under pressure,
// each driven on loopback with small explicit limits (the race detector the
// binary is built with dies past 8128 live goroutines). Client addresses are
// told apart by source address: 127.0.0.0/8 is all loopback, so each test
// dials from addresses of its own there.

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

// Messages of the admission log lines the tests count.
const (
	admMsgClientConns   = "refusing new connections from a client address that holds its share"
	admMsgPressureStart = "overload: "
	admMsgPressureEnd   = "overload over"
)

// admUpstream is an upstream that answers "<name> <path>" at once, except
// for paths under /hold: those wait until the test calls release (or the
// edge gives the request up).
type admUpstream struct {
	srv     *httptest.Server
	arrived atomic.Int64 // requests for /hold that reached it
	release func()
}

func newAdmUpstream(t *testing.T, name string) *admUpstream {
	u := &admUpstream{}
	released := make(chan struct{})
	var once sync.Once
	u.release = func() { once.Do(func() { close(released) }) }
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/hold") {
			u.arrived.Add(1)
			select {
			case <-released:
			case <-r.Context().Done():
				return
			}
		}
		fmt.Fprintf(w, "%s %s", name, r.URL.Path)
	}))
	// Close waits for the handlers: release them first (cleanups run last
	// registered first).
	t.Cleanup(u.srv.Close)
	t.Cleanup(u.release)
	return u
}

func (u *admUpstream) addr() string { return u.srv.Listener.Addr().String() }

// admRoutes writes a routes file: pairs of host and upstream address, each
// host its own application named "app-" and the host's first label.
func admRoutes(t *testing.T, hostAddr ...string) string {
	t.Helper()
	doc := &node.Document{V: 1}
	for i := 0; i+1 < len(hostAddr); i += 2 {
		host := hostAddr[i]
		doc.Routes = append(doc.Routes, node.Route{Host: host, Application: "app-" + strings.Split(host, ".")[0],
			Upstreams: []node.Upstream{{Node: "n1", Address: hostAddr[i+1]}}})
	}
	return writeRoutesFile(t, t.TempDir(), doc)
}

// admDialer dials from ip, one of loopback's addresses, so that the edge
// counts the connection as that client address's.
func admDialer(ip string) *net.Dialer {
	return &net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
}

// admClient is an HTTP client whose connections come from ip.
func admClient(t *testing.T, ip string, timeout time.Duration) (*http.Client, *http.Transport) {
	tr := &http.Transport{DialContext: admDialer(ip).DialContext, MaxIdleConnsPerHost: 200, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: timeout}, tr
}

// admH2Client is an HTTPS client whose connections come from ip and go to
// addr whatever the URL's host (which is the SNI and the Host), trusting
// roots; dials counts its connections.
func admH2Client(t *testing.T, ip, addr string, roots *x509.CertPool) (c *http.Client, dials *atomic.Int32) {
	dials = new(atomic.Int32)
	d := admDialer(ip)
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			dials.Add(1)
			return d.DialContext(ctx, network, addr)
		},
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		ForceAttemptHTTP2: true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second}, dials
}

// admRoots waits for the root of --tls internal and returns it as a pool.
func admRoots(t *testing.T, e *runningEdge) *x509.CertPool {
	t.Helper()
	roots := x509.NewCertPool()
	testsupport.WaitForNil(t, 15*time.Second, "the internal CA root", func() error {
		pem, err := os.ReadFile(filepath.Join(e.StateDir, internalRootFile))
		if err != nil {
			return err
		}
		if !roots.AppendCertsFromPEM(pem) {
			return errors.New("no certificate in it")
		}
		return nil
	})
	return roots
}

// admOutcome is how one request went.
type admOutcome struct {
	code       int
	retryAfter string
	body       string
	proto      int
	err        error
	took       time.Duration
}

func (o admOutcome) String() string {
	if o.err != nil {
		return fmt.Sprintf("error after %v: %v", o.took.Round(time.Millisecond), o.err)
	}
	return fmt.Sprintf("%d (HTTP/%d, Retry-After %q) after %v: %q", o.code, o.proto, o.retryAfter, o.took.Round(time.Millisecond), o.body)
}

// admFetch GETs url, with host as the Host when it is not empty.
func admFetch(c *http.Client, url, host string) admOutcome {
	start := time.Now()
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return admOutcome{err: err}
	}
	if host != "" {
		req.Host = host
	}
	resp, err := c.Do(req)
	if err != nil {
		return admOutcome{err: err, took: time.Since(start)}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return admOutcome{code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(b),
		proto: resp.ProtoMajor, err: err, took: time.Since(start)}
}

// admCollect takes n outcomes from ch, failing the test if they do not all
// arrive within the bound.
func admCollect(t *testing.T, ch <-chan admOutcome, n int, within time.Duration, what string) []admOutcome {
	t.Helper()
	var got []admOutcome
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for len(got) < n {
		select {
		case o := <-ch:
			got = append(got, o)
		case <-deadline.C:
			t.Fatalf("%s: only %d of %d answered within %v: %v", what, len(got), n, within, got)
		}
	}
	return got
}

// admClosed reports whether err says the peer closed or reset the
// connection.
func admClosed(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	s := err.Error()
	return strings.Contains(s, "EOF") || strings.Contains(s, "connection reset") || strings.Contains(s, "broken pipe")
}

func admTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// admRaw is a client connection the test drives by hand.
type admRaw struct {
	net.Conn
	br *bufio.Reader
}

// admDialRaw connects from ip to addr; the test's end closes it.
func admDialRaw(t *testing.T, ip, addr string) (*admRaw, error) {
	c, err := admDialer(ip).Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	return &admRaw{Conn: c, br: bufio.NewReader(c)}, nil
}

// send writes a keep-alive GET for host and path.
func (c *admRaw) send(host, path string) error {
	c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", path, host)
	return err
}

// read reads one response within the bound.
func (c *admRaw) read(within time.Duration) (int, string, error) {
	c.SetReadDeadline(time.Now().Add(within))
	defer c.SetReadDeadline(time.Time{})
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return 0, "", err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, string(b), err
}

// admStartEdge is startEdge for these tests: when the test fails, its log
// shows what the edge's admission control logged.
func admStartEdge(t *testing.T, args ...string) *runningEdge {
	t.Helper()
	e := startEdge(t, args...)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, l := range testsupport.LogEntries(e.logText(), "") {
			if l["component"] == "admission" {
				t.Logf("edge admission log: %v", l)
			}
		}
	})
	return e
}

// admShed is scafo_edge_shed_total for reason.
func admShed(t *testing.T, e *runningEdge, reason string) float64 {
	return e.metric(t, "scafo_edge_shed_total", testsupport.Labels{"reason": reason})
}

// admConns is scafo_edge_conns of kind client or upstream.
func admConns(t *testing.T, e *runningEdge, kind string) float64 {
	return e.metric(t, "scafo_edge_conns", testsupport.Labels{"kind": kind})
}

// admWaitMetric waits until the series' value satisfies ok.
func admWaitMetric(t *testing.T, e *runningEdge, name string, labels testsupport.Labels, want string, ok func(float64) bool) {
	t.Helper()
	testsupport.WaitForNil(t, 15*time.Second, fmt.Sprintf("%s%v %s", name, labels, want), func() error {
		if v := e.metric(t, name, labels); !ok(v) {
			return fmt.Errorf("it is %v", v)
		}
		return nil
	})
}

// admLoad is status.json's "load", with the field names scripts read.
type admLoad struct {
	Pressure          bool    `json:"pressure"`
	PressureReason    string  `json:"pressure_reason"`
	AcceptPaused      bool    `json:"accept_paused"`
	ClientConns       int64   `json:"client_conns"`
	UpstreamConns     int64   `json:"upstream_conns"`
	MaxConns          int     `json:"max_conns"`
	ConnsPerClient    int     `json:"conns_per_client"`
	RequestsPerClient int     `json:"requests_per_client"`
	AppShare          float64 `json:"app_share"`
	Apps              []struct {
		Application string `json:"application"`
		InFlight    int    `json:"in_flight"`
		Queued      int    `json:"queued"`
		Limit       int    `json:"limit"`
	} `json:"applications"`
}

func admStatus(t *testing.T, e *runningEdge) admLoad {
	t.Helper()
	code, body := e.admin(t, "/status.json")
	if code != 200 {
		t.Fatalf("status.json: %d %q", code, body)
	}
	var v struct {
		Load *admLoad `json:"load"`
	}
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatalf("status.json: %v", err)
	}
	if v.Load == nil {
		t.Fatalf("status.json has no \"load\": %s", body)
	}
	return *v.Load
}

// TestAdmissionApplicationPastItsShareGets503WhileAnotherIsServed floods an
// application whose upstream holds every request from four client
// addresses: it gets its share in flight (20% of the request budget, half
// of --max-conns 200), a bounded queue that times out after
// --app-queue-timeout, and 503 with Retry-After for the rest, promptly;
// another application's requests from another address all get 200
// meanwhile. Once released the held requests complete and every
// connection the flood made is given back.
func TestAdmissionApplicationPastItsShareGets503WhileAnotherIsServed(t *testing.T) {
	a, b := newAdmUpstream(t, "A"), newAdmUpstream(t, "B")
	routes := admRoutes(t, "a.example", a.addr(), "b.example", b.addr())
	// The per-client limits are set high enough that only the application's
	// share refuses anything here.
	e := admStartEdge(t, "--routes-file", routes, "--tls", "off", "--max-conns", "200",
		"--max-conns-per-client", "60", "--max-requests-per-client", "60", "--app-share", "20", "--app-queue-timeout", "300ms")
	waitEdgeReady(t, e)
	const (
		share = 20 // 20% of 100, with app-b idle
		flood = 60
	)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer a.release()

	url := "http://" + e.HTTPAddr
	var clients []*http.Client
	var transports []*http.Transport
	for _, ip := range []string{"127.0.0.11", "127.0.0.12", "127.0.0.13", "127.0.0.14"} {
		c, tr := admClient(t, ip, 30*time.Second)
		clients, transports = append(clients, c), append(transports, tr)
	}
	results := make(chan admOutcome, 8*flood)
	wave := func(n int) {
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results <- admFetch(clients[i%len(clients)], url+"/hold/"+strconv.Itoa(i), "a.example")
			}()
		}
	}
	refused := 0
	checkExcess := func(got []admOutcome) {
		t.Helper()
		for _, o := range got {
			switch {
			case o.err == nil && o.code == 503 && o.retryAfter != "" && strings.Contains(o.body, "has its share"):
				refused++
			case admClosed(o.err):
			default:
				t.Errorf("a request past the share: %v; want 503 with Retry-After, or a closed connection", o)
			}
			// The queue timeout is 300ms; the bound leaves room for a
			// loaded machine, not for a request left waiting.
			if o.took > 5*time.Second {
				t.Errorf("a request past the share took %v to be refused (queue timeout 300ms)", o.took)
			}
		}
	}

	// The first wave: the share reaches the upstream, the rest is refused.
	wave(flood)
	checkExcess(admCollect(t, results, flood-share, 10*time.Second, "the first wave's requests past the share"))
	testsupport.WaitFor(t, 10*time.Second, "the share's requests at the upstream", func() bool { return a.arrived.Load() >= share })
	admWaitMetric(t, e, "scafo_edge_app_in_flight", testsupport.Labels{"application": "app-a"}, "= the share", func(v float64) bool { return v == share })
	st := admStatus(t, e)
	if st.MaxConns != 200 || st.AppShare != 0.2 {
		t.Errorf("status.json load: max_conns %d app_share %v, want 200 and 0.2", st.MaxConns, st.AppShare)
	}
	found := false
	for _, ap := range st.Apps {
		if ap.Application == "app-a" {
			found = true
			if ap.InFlight != share || ap.Limit != share {
				t.Errorf("status.json app-a: in_flight %d limit %d, want %d and %d", ap.InFlight, ap.Limit, share, share)
			}
		}
	}
	if !found {
		t.Errorf("status.json load lists no app-a: %+v", st.Apps)
	}

	// More waves while app-b is asked from another address: none of app-a's
	// reaches its upstream, every one of app-b's is served. Waves go on
	// until both refusals were seen (a full queue needs 17 requests to
	// arrive within one queue timeout), at most four.
	bClient, bTransport := admClient(t, "127.0.0.15", 10*time.Second)
	transports = append(transports, bTransport)
	bServed, bSent := 0, 0
	for w := 0; w < 4; w++ {
		wave(flood)
		for round := range 2 {
			bResults := make(chan admOutcome, 5)
			for i := range 5 {
				go func() { bResults <- admFetch(bClient, fmt.Sprintf("%s/b/%d/%d/%d", url, w, round, i), "b.example") }()
			}
			for _, o := range admCollect(t, bResults, 5, 15*time.Second, "app-b's requests") {
				bSent++
				if o.err != nil || o.code != 200 || !strings.HasPrefix(o.body, "B /b/") {
					t.Errorf("app-b from another address during app-a's flood: %v, want 200", o)
				} else {
					bServed++
				}
			}
		}
		checkExcess(admCollect(t, results, flood, 10*time.Second, "a later wave's requests"))
		if admShed(t, e, "app_queue_full") > 0 && admShed(t, e, "app_queue_timeout") > 0 {
			break
		}
	}
	full, timedOut := admShed(t, e, "app_queue_full"), admShed(t, e, "app_queue_timeout")
	if full < 1 || timedOut < 1 {
		t.Errorf("shed app_queue_full %v, app_queue_timeout %v; want both counted", full, timedOut)
	}
	if int(full+timedOut) != refused {
		t.Errorf("shed app_queue_full %v + app_queue_timeout %v, want the %d 503s", full, timedOut, refused)
	}
	if got := a.arrived.Load(); got != share {
		t.Errorf("%d of app-a's requests reached its upstream, want its share %d", got, share)
	}
	if v := e.metric(t, "scafo_edge_app_in_flight", testsupport.Labels{"application": "app-a"}); v != share {
		t.Errorf("app-a in flight %v after the waves, want %d", v, share)
	}

	// Released, the held requests complete and every connection is given
	// back: the clients' when they close them, the upstreams' beyond those
	// the pool keeps warm.
	upstreamHeld := admConns(t, e, "upstream")
	a.release()
	for _, o := range admCollect(t, results, share, 15*time.Second, "the held requests") {
		if o.err != nil || o.code != 200 || !strings.HasPrefix(o.body, "A /hold/") {
			t.Errorf("a held request after release: %v, want 200", o)
		}
	}
	for _, tr := range transports {
		tr.CloseIdleConnections()
	}
	admWaitMetric(t, e, "scafo_edge_conns", testsupport.Labels{"kind": "client"}, "back to 0", func(v float64) bool { return v == 0 })
	admWaitMetric(t, e, "scafo_edge_conns", testsupport.Labels{"kind": "upstream"}, fmt.Sprintf("below the %v held", upstreamHeld),
		func(v float64) bool { return v < upstreamHeld })
	admWaitMetric(t, e, "scafo_edge_app_in_flight", testsupport.Labels{"application": "app-a"}, "back to 0", func(v float64) bool { return v == 0 })
	t.Logf("figures: app-a held %d, refused %d with 503 (queue full %v, queue timeout %v); app-b served %d of %d; upstream conns %v while held, %v after",
		share, refused, full, timedOut, bServed, bSent, upstreamHeld, admConns(t, e, "upstream"))
}

// admHold opens n connections from ip, each with a request the upstream
// holds until it is released; it waits for them to arrive (want in all at
// the upstream). With roots, over HTTPS (HTTP/1.1), for an edge with TLS
// on, which redirects plain HTTP.
func admHold(t *testing.T, e *runningEdge, up *admUpstream, ip string, n int, want int64, roots *x509.CertPool) []*admRaw {
	t.Helper()
	var held []*admRaw
	for i := range n {
		var c *admRaw
		var err error
		if roots == nil {
			c, err = admDialRaw(t, ip, e.HTTPAddr)
		} else {
			var tc *tls.Conn
			tc, err = tls.DialWithDialer(admDialer(ip), "tcp", e.HTTPSAddr,
				&tls.Config{RootCAs: roots, ServerName: "a.example", NextProtos: []string{"http/1.1"}})
			if err == nil {
				t.Cleanup(func() { tc.Close() })
				c = &admRaw{Conn: tc, br: bufio.NewReader(tc)}
			}
		}
		if err != nil {
			t.Fatal(err)
		}
		mustNil(t, c.send("a.example", fmt.Sprintf("/hold/%s/%d", ip, i)))
		held = append(held, c)
	}
	testsupport.WaitFor(t, 10*time.Second, fmt.Sprintf("%d held requests at the upstream", want), func() bool { return up.arrived.Load() >= want })
	return held
}

// TestAdmissionClientAddressPastItsConnectionShareIsServedUntilThePressure:
// on an idle edge an address past --max-conns-per-client is served (a NAT);
// once the edge is under pressure its new connections are closed at once,
// counted and logged once, while another address is served; once the
// pressure is over it may pass its share again.
func TestAdmissionClientAddressPastItsConnectionShareIsServedUntilThePressure(t *testing.T) {
	up := newAdmUpstream(t, "A")
	routes := admRoutes(t, "a.example", up.addr())
	// A budget of 40: pressure from 36, a held request holding two (its
	// client's and its upstream's connection).
	e := admStartEdge(t, "--routes-file", routes, "--tls", "off", "--max-conns", "40", "--max-conns-per-client", "5",
		"--max-requests-per-client", "100", "--app-share", "100")
	waitEdgeReady(t, e)
	const greedy, other, perClient, past, extra = "127.0.0.21", "127.0.0.22", 5, 8, 10

	// On an idle edge: 8 connections of one address, past its share of 5,
	// all served (16 in use).
	greedyHeld := admHold(t, e, up, greedy, past, past, nil)
	if v := admShed(t, e, "client_conns"); v != 0 {
		t.Errorf("shed client_conns = %v on an idle edge, want 0", v)
	}
	// Two addresses within their share bring the edge to its high-water
	// mark: 36 in use.
	admHold(t, e, up, "127.0.0.23", 5, past+5, nil)
	admHold(t, e, up, "127.0.0.24", 5, past+10, nil)
	admWaitMetric(t, e, "scafo_edge_pressure", nil, "= 1", func(v float64) bool { return v == 1 })

	var slowest time.Duration
	for i := range extra {
		c, err := admDialRaw(t, greedy, e.HTTPAddr)
		if err != nil {
			t.Fatalf("connect %d past the share: %v; want the kernel to connect it and the edge to close it", i, err)
		}
		start := time.Now()
		werr := c.send("a.example", "/past")
		code, _, rerr := c.read(10 * time.Second)
		took := time.Since(start)
		slowest = max(slowest, took)
		switch {
		case werr == nil && rerr == nil:
			t.Errorf("connection %d past the share under pressure was answered %d, want it closed", i, code)
		case admTimeout(rerr):
			t.Errorf("connection %d past the share was left open (%v), want it closed once its hold is over", i, rerr)
		case !admClosed(werr) && !admClosed(rerr):
			t.Errorf("connection %d past the share: write %v, read %v; want EOF or a reset", i, werr, rerr)
		}
		if took > 5*time.Second {
			t.Errorf("connection %d past the share took %v to fail", i, took)
		}
		c.Close()
	}
	admWaitMetric(t, e, "scafo_edge_shed_total", testsupport.Labels{"reason": "client_conns"}, fmt.Sprint("= ", extra),
		func(v float64) bool { return v >= extra })
	if v := admShed(t, e, "client_conns"); v != extra {
		t.Errorf("shed client_conns = %v, want %d", v, extra)
	}
	oc, _ := admClient(t, other, 10*time.Second)
	if o := admFetch(oc, "http://"+e.HTTPAddr+"/other", "a.example"); o.err != nil || o.code != 200 {
		t.Errorf("another address under pressure: %v, want 200", o)
	}
	testsupport.WaitFor(t, 10*time.Second, "the refusal logged", func() bool { return e.countLogs(admMsgClientConns) >= 1 })

	// The held requests end: the pressure is over, and the address may
	// pass its share again.
	up.release()
	for i, c := range greedyHeld {
		if code, body, err := c.read(10 * time.Second); err != nil || code != 200 {
			t.Errorf("held request %d of the address past its share: %d %q %v", i, code, body, err)
		}
	}
	tries := 0
	testsupport.WaitForNil(t, 15*time.Second, "a connection past the share once the pressure is over", func() error {
		tries++
		c, err := admDialRaw(t, greedy, e.HTTPAddr)
		if err != nil {
			return err
		}
		defer c.Close()
		if err := c.send("a.example", "/room"); err != nil {
			return err
		}
		code, body, err := c.read(5 * time.Second)
		if err != nil || code != 200 {
			return fmt.Errorf("%d %q %v", code, body, err)
		}
		return nil
	})
	if n := e.countLogs(admMsgClientConns); n != 1 {
		t.Errorf("%d log lines for connections closed past the share, want 1 (one a minute):\n%s", n, e.logText())
	}
	if st := admStatus(t, e); st.ConnsPerClient != perClient {
		t.Errorf("status.json conns_per_client %d, want %d", st.ConnsPerClient, perClient)
	}
	t.Logf("figures: %d connections past the share of %d closed under pressure, the slowest after %v; served again after %d tries", extra, perClient, slowest, tries)
}

// TestAdmissionHTTP2StreamsPastTheClientRequestShareGet429: one client
// address opens more streams on one HTTP/2 connection than
// --max-requests-per-client: while nobody else is short they are all
// served; once its application's slots are contended (another address's
// requests wait for one), its further streams get 429 with Retry-After at
// once, while an address within its share waits its turn and is served.
func TestAdmissionHTTP2StreamsPastTheClientRequestShareGet429(t *testing.T) {
	up := newAdmUpstream(t, "A")
	routes := admRoutes(t, "a.example", up.addr())
	// A request budget of 100, of which the application may hold 10.
	e := admStartEdge(t, "--routes-file", routes, "--tls", "internal", "--max-conns", "200", "--max-requests-per-client", "5",
		"--app-share", "10", "--app-queue-timeout", "20s")
	waitEdgeReady(t, e)
	roots := admRoots(t, e)
	const perClient, first, filler, more = 5, 8, 4, 4
	var wg sync.WaitGroup
	defer wg.Wait()
	defer up.release()

	greedy, dials := admH2Client(t, "127.0.0.31", e.HTTPSAddr, roots)
	if o := admFetch(greedy, "https://a.example/first", ""); o.err != nil || o.code != 200 || o.proto != 2 {
		t.Fatalf("first request: %v, want 200 over HTTP/2", o)
	}
	fetch := func(c *http.Client, path string, out chan<- admOutcome) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out <- admFetch(c, "https://a.example"+path, "")
		}()
	}
	// Nobody else short: 8 streams, past the share of 5, all reach the
	// upstream.
	results := make(chan admOutcome, first+more)
	for i := range first {
		fetch(greedy, "/hold/greedy/"+strconv.Itoa(i), results)
	}
	testsupport.WaitFor(t, 10*time.Second, "the first streams at the upstream", func() bool { return up.arrived.Load() >= first })
	if v := admShed(t, e, "client_requests"); v != 0 {
		t.Errorf("shed client_requests = %v with nobody else short, want 0", v)
	}
	// Another address takes the application's last 2 slots and queues 2.
	other, _ := admH2Client(t, "127.0.0.32", e.HTTPSAddr, roots)
	otherResults := make(chan admOutcome, filler+1)
	for i := range filler {
		fetch(other, "/hold/other/"+strconv.Itoa(i), otherResults)
	}
	admWaitMetric(t, e, "scafo_edge_app_queued", testsupport.Labels{"application": "app-a"}, "= 2", func(v float64) bool { return v == 2 })

	// Now the address past its share is refused at once.
	refused := make(chan admOutcome, more)
	for i := range more {
		fetch(greedy, "/hold/more/"+strconv.Itoa(i), refused)
	}
	for _, o := range admCollect(t, refused, more, 10*time.Second, "the streams past the share") {
		if o.err != nil || o.code != 429 || o.retryAfter == "" || o.proto != 2 || !strings.Contains(o.body, "in flight from your address") {
			t.Errorf("a stream past the share, its application contended: %v, want 429 with Retry-After over HTTP/2", o)
		}
		if o.took > 5*time.Second {
			t.Errorf("a stream past the share took %v to be refused", o.took)
		}
	}
	if v := admShed(t, e, "client_requests"); v != more {
		t.Errorf("shed client_requests = %v, want %d", v, more)
	}
	// An address within its share waits in the queue rather than being
	// refused.
	third, _ := admH2Client(t, "127.0.0.33", e.HTTPSAddr, roots)
	fetch(third, "/third", otherResults)
	admWaitMetric(t, e, "scafo_edge_app_queued", testsupport.Labels{"application": "app-a"}, "= 3", func(v float64) bool { return v == 3 })

	up.release()
	for _, o := range admCollect(t, results, first, 15*time.Second, "the streams served past the share") {
		if o.err != nil || o.code != 200 || o.proto != 2 || !strings.HasPrefix(o.body, "A /hold/greedy/") {
			t.Errorf("a stream of the address past its share, after release: %v, want 200 over HTTP/2", o)
		}
	}
	for _, o := range admCollect(t, otherResults, filler+1, 15*time.Second, "the other addresses' requests") {
		if o.err != nil || o.code != 200 || o.proto != 2 {
			t.Errorf("another address's request: %v, want 200 over HTTP/2", o)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Errorf("the client opened %d connections, want every stream on one", n)
	}
	if st := admStatus(t, e); st.RequestsPerClient != perClient {
		t.Errorf("status.json requests_per_client %d, want %d", st.RequestsPerClient, perClient)
	}
}

// TestAdmissionClientRateRefusesABurstPastItsSize: with --client-rate, one
// address's burst past --client-burst gets 429 with Retry-After while
// other addresses are served; without the flag there is no rate.
func TestAdmissionClientRateRefusesABurstPastItsSize(t *testing.T) {
	up := newAdmUpstream(t, "A")
	routes := admRoutes(t, "a.example", up.addr())

	t.Run("past the burst, 429 for that address only", func(t *testing.T) {
		e := admStartEdge(t, "--routes-file", routes, "--tls", "off", "--max-conns", "200", "--client-rate", "1", "--client-burst", "5")
		waitEdgeReady(t, e)
		const burst, sent = 5, 20
		c, _ := admClient(t, "127.0.0.41", 10*time.Second)
		start := time.Now()
		served, limited := 0, 0
		for i := range sent {
			o := admFetch(c, fmt.Sprintf("http://%s/r/%d", e.HTTPAddr, i), "a.example")
			switch {
			case o.err == nil && o.code == 200:
				served++
			case o.err == nil && o.code == 429 && o.retryAfter != "" && strings.Contains(o.body, "too many requests from your address"):
				limited++
			default:
				t.Errorf("request %d: %v, want 200 or 429 with Retry-After", i, o)
			}
			if i < burst && o.code != 200 {
				t.Errorf("request %d, within the burst: %v, want 200", i, o)
			}
		}
		elapsed := time.Since(start)
		// The bucket refills one token a second while the requests run.
		if most := burst + int(elapsed.Seconds()) + 1; served > most {
			t.Errorf("%d of %d served in %v, want at most %d at 1/s with a burst of %d", served, sent, elapsed, most, burst)
		}
		if limited < 1 {
			t.Errorf("no request of %d in %v was refused past a burst of %d", sent, elapsed, burst)
		}
		if v := admShed(t, e, "client_rate"); int(v) != limited {
			t.Errorf("shed client_rate = %v, want the %d 429s", v, limited)
		}
		for _, ip := range []string{"127.0.0.42", "127.0.0.43", "127.0.0.44"} {
			oc, _ := admClient(t, ip, 10*time.Second)
			for i := range burst {
				if o := admFetch(oc, fmt.Sprintf("http://%s/o/%d", e.HTTPAddr, i), "a.example"); o.err != nil || o.code != 200 {
					t.Errorf("%s request %d: %v, want 200", ip, i, o)
				}
			}
		}
		t.Logf("figures: %d of %d requests in %v served, %d refused with 429", served, sent, elapsed, limited)
	})

	t.Run("no rate without the flag", func(t *testing.T) {
		e := admStartEdge(t, "--routes-file", routes, "--tls", "off", "--max-conns", "200")
		waitEdgeReady(t, e)
		c, _ := admClient(t, "127.0.0.45", 10*time.Second)
		for i := range 40 {
			if o := admFetch(c, fmt.Sprintf("http://%s/r/%d", e.HTTPAddr, i), "a.example"); o.err != nil || o.code != 200 {
				t.Fatalf("request %d without --client-rate: %v, want 200", i, o)
			}
		}
		if v := admShed(t, e, "client_rate"); v != 0 {
			t.Errorf("shed client_rate = %v without --client-rate, want 0", v)
		}
	})
}

// TestAdmissionUnderPressureIdleConnectionsAreShedOldestFirst fills
// --max-conns 60 past its high-water mark (90%) with idle keep-alive
// connections opened in a known order from six addresses, beside one
// request held in flight: the edge closes the oldest idle ones, back to the
// low-water mark (80%) and no further; the newest survive, a new visitor
// is served, scafo_edge_pressure goes back to 0, the episode is logged once
// when it starts and once when it ends, and the held request is not cut.
func TestAdmissionUnderPressureIdleConnectionsAreShedOldestFirst(t *testing.T) {
	up := newAdmUpstream(t, "A")
	routes := admRoutes(t, "a.example", up.addr())
	const maxConns, lowWater = 60, 48
	e := admStartEdge(t, "--routes-file", routes, "--tls", "off", "--max-conns", strconv.Itoa(maxConns), "--max-conns-per-client", "15")
	waitEdgeReady(t, e)
	defer up.release()

	held, err := admDialRaw(t, "127.0.0.50", e.HTTPAddr)
	mustNil(t, err)
	mustNil(t, held.send("a.example", "/hold"))
	testsupport.WaitFor(t, 10*time.Second, "the held request at the upstream", func() bool { return up.arrived.Load() == 1 })

	// With the held request's two connections and the upstream one the
	// idle ones' requests share, 54 idle connections make 57 of 60: past
	// the high-water mark of 54, under the limit.
	const n = 54
	type idleConn struct {
		c      *admRaw
		closed chan struct{} // closed once the edge closed the connection
	}
	conns := make([]idleConn, n)
	var readers sync.WaitGroup
	defer func() {
		for _, ic := range conns {
			if ic.c != nil {
				ic.c.Close()
			}
		}
		readers.Wait()
	}()
	for i := range n {
		c, err := admDialRaw(t, fmt.Sprintf("127.0.0.%d", 51+i%6), e.HTTPAddr)
		if err != nil {
			t.Fatalf("idle connection %d: %v", i, err)
		}
		mustNil(t, c.send("a.example", "/idle/"+strconv.Itoa(i)))
		if code, body, err := c.read(10 * time.Second); err != nil || code != 200 {
			t.Fatalf("idle connection %d's request: %d %q %v", i, code, body, err)
		}
		ic := idleConn{c: c, closed: make(chan struct{})}
		conns[i] = ic
		readers.Add(1)
		go func() {
			defer readers.Done()
			defer close(ic.closed)
			io.Copy(io.Discard, ic.c.br) // returns once the connection is closed
		}()
		// The edge lists a connection as idle when its server says so,
		// a moment after the response left: the next one is opened only
		// once this one is listed (or already shed), so that the order
		// they became idle in is the order they were opened in.
		testsupport.WaitForNil(t, 10*time.Second, fmt.Sprintf("idle connection %d listed as idle", i), func() error {
			_, text := e.admin(t, "/metrics")
			listed, _ := testsupport.ScrapeValue(t, text, "scafo_edge_idle_conns", nil)
			shed, _ := testsupport.ScrapeValue(t, text, "scafo_edge_shed_total", testsupport.Labels{"reason": "idle_closed"})
			if listed+shed < float64(i+1) {
				return fmt.Errorf("%v listed, %v shed", listed, shed)
			}
			return nil
		})
	}
	isClosed := func(i int) bool {
		select {
		case <-conns[i].closed:
			return true
		default:
			return false
		}
	}
	// seenShed waits until every connection the edge counts as shed is
	// seen closed (a reader may see its close after a younger one's) and
	// checks that they are the oldest: a prefix of the order they were
	// opened in, leaving the newest ten open. It returns how many.
	seenShed := func(when string) int {
		t.Helper()
		closed := 0
		testsupport.WaitForNil(t, 10*time.Second, when+": the shed connections seen closed, oldest first", func() error {
			shed := int(admShed(t, e, "idle_closed"))
			closed = 0
			for closed < n && isClosed(closed) {
				closed++
			}
			for i := closed; i < n; i++ {
				if isClosed(i) {
					return fmt.Errorf("idle connection %d of %d is closed while %d, older, is open: not oldest first", i, n, closed)
				}
			}
			if closed != shed {
				return fmt.Errorf("%d closed, %d shed", closed, shed)
			}
			return nil
		})
		if closed > n-10 {
			t.Errorf("%s: %d of %d idle connections closed; want the newest ten open", when, closed, n)
		}
		return closed
	}
	inUse := func() float64 { return admConns(t, e, "client") + admConns(t, e, "upstream") }

	admWaitMetric(t, e, "scafo_edge_pressure", nil, "= 1", func(v float64) bool { return v == 1 })
	testsupport.WaitForNil(t, 15*time.Second, "connections back to the low-water mark", func() error {
		if v := inUse(); v > lowWater {
			return fmt.Errorf("%v in use", v)
		}
		return nil
	})
	shedFirst := seenShed("once back at the low-water mark")
	if shedFirst < 1 {
		t.Errorf("no idle connection was closed under pressure")
	}

	vc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: admDialer("127.0.0.57").DialContext, DisableKeepAlives: true}}
	if o := admFetch(vc, "http://"+e.HTTPAddr+"/visitor", "a.example"); o.err != nil || o.code != 200 {
		t.Errorf("a new visitor under pressure: %v, want 200", o)
	}

	admWaitMetric(t, e, "scafo_edge_pressure", nil, "back to 0", func(v float64) bool { return v == 0 })
	testsupport.WaitFor(t, 10*time.Second, "the episode's end logged", func() bool { return e.countLogs(admMsgPressureEnd) >= 1 })
	var lasted time.Duration
	for _, l := range testsupport.LogEntries(e.logText(), admMsgPressureEnd) {
		if ms, ok := l["lasted"].(float64); ok {
			lasted = time.Duration(ms * float64(time.Millisecond)).Round(time.Millisecond)
		}
	}
	final := inUse()
	shedAll := seenShed("once the episode ended")
	// The episode ends once back at the low-water mark: it closes what that
	// takes, not every connection its short idle timeout reaches.
	if final < lowWater-2 {
		t.Errorf("%v connections in use after the episode (%d idle ones closed, %d of them once back at the low-water mark %d); want the shedding to stop at the low-water mark",
			final, shedAll, shedAll-shedFirst, lowWater)
	}
	if got := e.countLogs(admMsgPressureStart); got != 1 {
		t.Errorf("%d episode start lines, want 1", got)
	}
	if got := e.countLogs(admMsgPressureEnd); got != 1 {
		t.Errorf("%d episode end lines, want 1", got)
	}
	if v := e.metric(t, "scafo_edge_pressure_episodes_total", nil); v != 1 {
		t.Errorf("scafo_edge_pressure_episodes_total = %v, want 1", v)
	}

	up.release()
	if code, body, err := held.read(10 * time.Second); err != nil || code != 200 || body != "A /hold" {
		t.Errorf("the held request after the episode: %d %q %v; want 200, not cut", code, body, err)
	}
	t.Logf("figures: %d idle connections of %d closed (%d to reach the low-water mark), %v in use after; the episode lasted %v",
		shedAll, n, shedFirst, final, lasted)
}

// TestAdmissionAtMaxConnsNewConnectionsWaitInTheBacklog: with --max-conns
// spent on requests held in flight (nothing idle to shed), the edge stops
// accepting (scafo_edge_accept_pauses_total counts it); a new connection
// is neither reset nor answered but waits in the kernel's backlog, and is
// served once a slot frees.
func TestAdmissionAtMaxConnsNewConnectionsWaitInTheBacklog(t *testing.T) {
	up := newAdmUpstream(t, "A")
	routes := admRoutes(t, "a.example", up.addr())
	// --app-share 100: the application may hold the whole request budget,
	// half of the 20 connections, so ten held requests spend all of it.
	const maxConns, held = 20, 10
	e := admStartEdge(t, "--routes-file", routes, "--tls", "off", "--max-conns", strconv.Itoa(maxConns), "--app-share", "100")
	waitEdgeReady(t, e)
	defer up.release()

	var holders []*admRaw
	for i := range held {
		c, err := admDialRaw(t, "127.0.0.60", e.HTTPAddr)
		mustNil(t, err)
		mustNil(t, c.send("a.example", "/hold/"+strconv.Itoa(i)))
		holders = append(holders, c)
		testsupport.WaitFor(t, 10*time.Second, fmt.Sprintf("held request %d at the upstream", i), func() bool { return up.arrived.Load() == int64(i+1) })
	}
	admWaitMetric(t, e, "scafo_edge_conns", testsupport.Labels{"kind": "upstream"}, "= the held requests", func(v float64) bool { return v == held })
	// The listener went back to accept while the last held request had not
	// dialed its upstream yet, so it may take one more connection before
	// it sees the budget spent: this one, for no route, which asks nothing
	// of the budget but its descriptor.
	trigger, err := admDialRaw(t, "127.0.0.61", e.HTTPAddr)
	mustNil(t, err)
	mustNil(t, trigger.send("nobody.example", "/"))
	admWaitMetric(t, e, "scafo_edge_accept_pauses_total", nil, ">= 1", func(v float64) bool { return v >= 1 })
	accepted := admConns(t, e, "client")

	waiter, err := admDialRaw(t, "127.0.0.62", e.HTTPAddr)
	if err != nil {
		t.Fatalf("a new connection at the limit: %v; want the kernel to take it into the backlog", err)
	}
	mustNil(t, waiter.send("a.example", "/waited"))
	// Not reset, not answered: a second of silence is the assertion here,
	// not a wait for anything.
	if code, _, err := waiter.read(time.Second); !admTimeout(err) {
		t.Fatalf("a new connection at the limit: %d, %v; want it left waiting (no answer, no reset)", code, err)
	}
	if v := admConns(t, e, "client"); v > accepted {
		t.Errorf("client connections %v while paused, were %v: the new one was accepted", v, accepted)
	}
	st := admStatus(t, e)
	if !st.AcceptPaused || !st.Pressure {
		t.Errorf("status.json while at the limit: accept_paused %v pressure %v (%q), want both", st.AcceptPaused, st.Pressure, st.PressureReason)
	}

	// Three held clients give up: their connections, and the upstream ones
	// of their requests, free slots, and the waiting connection is served.
	// The edge sees an HTTP/1 client leave mid-request within the
	// backhaul's check tick (1s, doubling up to 8s), hence the bound.
	freedAt := time.Now()
	for _, c := range holders[:3] {
		c.Close()
	}
	if code, body, err := waiter.read(15 * time.Second); err != nil || code != 200 || body != "A /waited" {
		t.Fatalf("the waiting connection once slots freed: %d %q %v, want 200", code, body, err)
	}
	servedAfter := time.Since(freedAt)
	up.release()
	for i, c := range holders[3:] {
		if code, body, err := c.read(10 * time.Second); err != nil || code != 200 {
			t.Errorf("held request %d after release: %d %q %v, want 200", i+3, code, body, err)
		}
	}
	testsupport.WaitFor(t, 10*time.Second, "accepting again in status.json", func() bool { return !admStatus(t, e).AcceptPaused })
	t.Logf("figures: paused at %v client connections (%d held requests); the waiting connection was served %v after three slots freed",
		accepted, held, servedAfter.Round(time.Millisecond))
}

// TestAdmissionFlagsAreValidated: bad overload flags stop the start with a
// non-zero exit and a message naming the flag.
func TestAdmissionFlagsAreValidated(t *testing.T) {
	routes := admRoutes(t, "a.example", "127.0.0.1:1")
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"--max-conns", "-1"}, "--max-conns"},
		{[]string{"--max-conns-per-client", "-1"}, "--max-conns-per-client"},
		{[]string{"--max-requests-per-client", "-1"}, "--max-requests-per-client"},
		{[]string{"--app-share", "0"}, "--app-share"},
		{[]string{"--app-share", "101"}, "--app-share"},
		{[]string{"--app-queue-timeout", "0"}, "--app-queue-timeout"},
		{[]string{"--app-queue-timeout", "2m"}, "--app-queue-timeout"},
		{[]string{"--client-rate", "-1"}, "--client-rate"},
		{[]string{"--client-burst", "5"}, "--client-burst"},
		{[]string{"--max-conns", "200", "--max-conns-per-client", "300"}, "--max-conns-per-client"},
		{[]string{"--max-conns", "100000"}, "--max-conns"},
		{[]string{"--max-conns", "10"}, "--max-conns"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			args := append([]string{"--routes-file", routes, "--tls", "off", "--state-dir", t.TempDir()}, c.args...)
			code, out := runEdgeToExit(t, edgeBinary, nil, args...)
			if code == 0 || !strings.Contains(out, c.flag) {
				t.Errorf("exit %d, output:\n%s\nwant non-zero, naming %s", code, out, c.flag)
			}
			if strings.Contains(out, "scafo-edge started") {
				t.Errorf("the edge started with %v", c.args)
			}
		})
	}
}

// TestAdmissionHTTP3ConnectionsPastTheClientShareAreClosed: QUIC
// connections count against --max-conns-per-client like TCP ones; on an
// idle edge an address may pass it, and once the edge is under pressure
// its new QUIC connection is closed at once, while TCP from another
// address is served.
func TestAdmissionHTTP3ConnectionsPastTheClientShareAreClosed(t *testing.T) {
	up := newAdmUpstream(t, "A")
	routes := admRoutes(t, "a.example", up.addr())
	// A budget of 40, pressure from 36; a held request holds two.
	e := admStartEdge(t, "--routes-file", routes, "--tls", "internal", "--max-conns", "40", "--max-conns-per-client", "2",
		"--max-requests-per-client", "100", "--app-share", "100")
	waitEdgeReady(t, e)
	roots := admRoots(t, e)
	const perClient, past = 2, 3

	raddr, err := net.ResolveUDPAddr("udp", e.HTTPSAddr)
	mustNil(t, err)
	pc, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP("127.0.0.70")})
	mustNil(t, err)
	qt := &quic.Transport{Conn: pc}
	t.Cleanup(func() {
		qt.Close()
		pc.Close()
	})
	// Each http3.Transport is one QUIC connection, all from 127.0.0.70.
	h3 := func() *http3.Transport {
		tr := &http3.Transport{
			TLSClientConfig: &tls.Config{RootCAs: roots},
			Dial: func(ctx context.Context, _ string, tlsCfg *tls.Config, cfg *quic.Config) (*quic.Conn, error) {
				return qt.Dial(ctx, raddr, tlsCfg, cfg)
			},
		}
		t.Cleanup(func() { tr.Close() })
		return tr
	}
	get := func(tr *http3.Transport, path string) admOutcome {
		return admFetch(&http.Client{Transport: tr, Timeout: 10 * time.Second}, "https://a.example"+path, "")
	}
	var within []*http3.Transport
	for i := range past {
		tr := h3()
		if o := get(tr, "/h3/"+strconv.Itoa(i)); o.err != nil || o.code != 200 || o.proto != 3 {
			t.Fatalf("QUIC connection %d on an idle edge: %v, want 200 over HTTP/3", i, o)
		}
		within = append(within, tr)
	}
	if v := admShed(t, e, "client_conns"); v != 0 {
		t.Errorf("shed client_conns = %v on an idle edge, want 0", v)
	}
	// Nine addresses within their share hold 18 requests: 36 in use, the
	// high-water mark, and 39 with the QUIC connections.
	for i := range 9 {
		admHold(t, e, up, fmt.Sprintf("127.0.0.%d", 80+i), perClient, int64(perClient*(i+1)), roots)
	}
	admWaitMetric(t, e, "scafo_edge_pressure", nil, "= 1", func(v float64) bool { return v == 1 })
	refused := get(h3(), "/past")
	if refused.err == nil {
		t.Errorf("a QUIC connection past the share under pressure was answered: %v", refused)
	} else if refused.took > 5*time.Second {
		t.Errorf("a QUIC connection past the share failed after %v, want at once", refused.took)
	}
	t.Logf("the QUIC connection past the share: %v", refused)
	admWaitMetric(t, e, "scafo_edge_shed_total", testsupport.Labels{"reason": "client_conns"}, ">= 1", func(v float64) bool { return v >= 1 })

	tcp, _ := admH2Client(t, "127.0.0.71", e.HTTPSAddr, roots)
	if o := admFetch(tcp, "https://a.example/tcp", ""); o.err != nil || o.code != 200 {
		t.Errorf("TCP from another address: %v, want 200", o)
	}
	// Back within its share, it may open one again, under pressure.
	within[0].Close()
	within[1].Close()
	testsupport.WaitForNil(t, 10*time.Second, "a QUIC connection once two closed", func() error {
		tr := h3()
		defer tr.Close()
		if o := get(tr, "/again"); o.err != nil || o.code != 200 {
			return fmt.Errorf("%v", o)
		}
		return nil
	})
}
