package backhaul

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

func TestForwardFailover(t *testing.T) {
	tests := []struct {
		name          string
		ups           func(t *testing.T) []node.Upstream
		method        string
		body          string
		wantStatus    int
		wantBody      string
		wantNode      string
		wantFailovers int
		wantErr       error
	}{
		{
			name:       "the first upstream answers when it is up",
			ups:        func(t *testing.T) []node.Upstream { return []node.Upstream{named(t, "a"), named(t, "b")} },
			wantStatus: 200, wantBody: "a", wantNode: "a",
		},
		{
			name:       "a refused first upstream fails over to the second unseen",
			ups:        func(t *testing.T) []node.Upstream { return []node.Upstream{refused(t, "a"), named(t, "b")} },
			wantStatus: 200, wantBody: "b", wantNode: "b", wantFailovers: 1,
		},
		{
			name: "two refused upstreams fail over to the third",
			ups: func(t *testing.T) []node.Upstream {
				return []node.Upstream{refused(t, "a"), refused(t, "b"), named(t, "c")}
			},
			wantStatus: 200, wantBody: "c", wantNode: "c", wantFailovers: 2,
		},
		{
			name:   "a POST body survives a failed connect and reaches the next upstream",
			method: "POST", body: strings.Repeat("payload ", 1000),
			ups: func(t *testing.T) []node.Upstream {
				echo := upstream(t, "b", func(w http.ResponseWriter, r *http.Request) {
					// Read it all first: Go's HTTP/1 server ends the body once
					// the response starts.
					b, _ := io.ReadAll(r.Body)
					w.Write(b)
				})
				return []node.Upstream{refused(t, "a"), echo}
			},
			wantStatus: 200, wantBody: strings.Repeat("payload ", 1000), wantNode: "b", wantFailovers: 1,
		},
		{
			name:       "every upstream refused is a 502 the edge answers (rule 7)",
			ups:        func(t *testing.T) []node.Upstream { return []node.Upstream{refused(t, "a"), refused(t, "b")} },
			wantStatus: 502, wantBody: "edge: no upstream\n", wantNode: "b", wantFailovers: 1, wantErr: ErrNoUpstream,
		},
		{
			name:       "an empty upstream list is a 502",
			ups:        func(t *testing.T) []node.Upstream { return nil },
			wantStatus: 502, wantBody: "edge: no upstream\n", wantErr: ErrNoUpstream,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newProxy(t, Options{})
			e := startEdge(t, p, tt.ups(t)...)
			method := tt.method
			if method == "" {
				method = "GET"
			}
			req, err := http.NewRequest(method, e.srv.URL+"/x", strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client(t).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			c := e.next(t)
			if resp.StatusCode != tt.wantStatus || string(b) != tt.wantBody {
				t.Errorf("response = %d %.40q (%d bytes), want %d %.40q (%d bytes)", resp.StatusCode, b, len(b), tt.wantStatus, tt.wantBody, len(tt.wantBody))
			}
			if c.res.Node != tt.wantNode || c.res.Failovers != tt.wantFailovers {
				t.Errorf("Result = node %q failovers %d, want %q %d", c.res.Node, c.res.Failovers, tt.wantNode, tt.wantFailovers)
			}
			if tt.wantErr == nil && c.err != nil || tt.wantErr != nil && !errors.Is(c.err, tt.wantErr) {
				t.Errorf("Forward error = %v, want %v", c.err, tt.wantErr)
			}
			if tt.wantErr != nil && c.res.Status != 0 {
				t.Errorf("Result.Status = %d after a failure, want 0 (nothing written)", c.res.Status)
			}
			if tt.wantErr == nil && c.res.Status != tt.wantStatus {
				t.Errorf("Result.Status = %d, want %d", c.res.Status, tt.wantStatus)
			}
			if tt.body != "" && tt.wantErr == nil && c.res.BytesIn != int64(len(tt.body)) {
				t.Errorf("Result.BytesIn = %d, want %d", c.res.BytesIn, len(tt.body))
			}
		})
	}
}

// blackhole returns an address whose listener's accept queue is full, so a
// new connection's SYN is dropped and connecting can only time out.
func blackhole(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	// A backlog of 0 admits one connection to the accept queue; nothing
	// accepts, so once it holds one every later SYN is dropped.
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := (&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: sa.(*syscall.SockaddrInet4).Port}).String()
	for i := 0; ; i++ {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err != nil {
			return addr // the queue is full
		}
		t.Cleanup(func() { c.Close() })
		if i > 8 {
			t.Skip("kernel keeps accepting on a zero-backlog listener; cannot build a blackhole")
		}
	}
}

func TestDialTimeoutFailsOver(t *testing.T) {
	hole := node.Upstream{Node: "a", Address: blackhole(t)}
	p := newProxy(t, Options{DialTimeout: 150 * time.Millisecond})
	e := startEdge(t, p, hole, named(t, "b"))
	status, body := get(t, client(t), e.srv.URL+"/")
	c := e.next(t)
	if status != 200 || body != "b" || c.res.Failovers != 1 {
		t.Errorf("got %d %q failovers %d, want 200 \"b\" after 1 failover", status, body, c.res.Failovers)
	}
	if h := healthOf(p, hole.Address); h.Failures != 1 {
		t.Errorf("blackholed upstream failures = %d, want 1 (a dial timeout is a connect failure)", h.Failures)
	}
}

func TestPassiveEjection(t *testing.T) {
	clk := newFakeClock()
	reg := prometheus.NewRegistry()
	p := newProxy(t, Options{EjectBase: time.Second, EjectMax: 4 * time.Second, Clock: clk, Registerer: reg})
	down := refused(t, "a")
	e := startEdge(t, p, down, named(t, "b"))
	c := client(t)

	request := func(t *testing.T, wantFailovers int) {
		t.Helper()
		if status, body := get(t, c, e.srv.URL+"/"); status != 200 || body != "b" {
			t.Fatalf("got %d %q, want 200 \"b\"", status, body)
		}
		if got := e.next(t).res.Failovers; got != wantFailovers {
			t.Fatalf("Failovers = %d, want %d", got, wantFailovers)
		}
	}

	t.Run("a connect failure ejects the upstream for the base period", func(t *testing.T) {
		request(t, 1)
		h := healthOf(p, down.Address)
		if h.Node != "a" || h.Failures != 1 || !h.EjectedUntil.Equal(clk.Now().Add(time.Second)) {
			t.Errorf("health = %+v, want a, 1 failure, ejected until now+1s", h)
		}
		if got := gauge(t, reg, "scafo_edge_upstreams_ejected"); got != 1 {
			t.Errorf("ejected gauge = %v, want 1", got)
		}
	})
	t.Run("an ejected upstream is skipped without a failover", func(t *testing.T) {
		request(t, 0)
		request(t, 0)
		if h := healthOf(p, down.Address); h.Failures != 1 {
			t.Errorf("failures = %d, want 1 (skipped, not tried)", h.Failures)
		}
	})
	t.Run("after the period it is tried again and the period doubles", func(t *testing.T) {
		clk.Advance(time.Second)
		request(t, 1)
		h := healthOf(p, down.Address)
		if h.Failures != 2 || !h.EjectedUntil.Equal(clk.Now().Add(2*time.Second)) {
			t.Errorf("health = %+v, want 2 failures, ejected until now+2s", h)
		}
	})
	t.Run("the period is capped at EjectMax", func(t *testing.T) {
		for range 3 {
			clk.Advance(10 * time.Second)
			request(t, 1)
		}
		h := healthOf(p, down.Address)
		if h.Failures != 5 || !h.EjectedUntil.Equal(clk.Now().Add(4*time.Second)) {
			t.Errorf("health = %+v, want 5 failures, ejected until now+4s", h)
		}
	})
	t.Run("connect failures and failovers are counted by node", func(t *testing.T) {
		if got := counter(t, reg, "scafo_edge_upstream_connect_failures_total", "a"); got != 5 {
			t.Errorf("connect failures{node=a} = %v, want 5", got)
		}
		if got := counter(t, reg, "scafo_edge_upstream_failovers_total", "a"); got != 5 {
			t.Errorf("failovers{node=a} = %v, want 5", got)
		}
		if got := counter(t, reg, "scafo_edge_upstream_connect_failures_total", "b"); got != 0 {
			t.Errorf("connect failures{node=b} = %v, want 0", got)
		}
	})
	t.Run("the ejection ends on the clock", func(t *testing.T) {
		clk.Advance(4 * time.Second)
		if got := gauge(t, reg, "scafo_edge_upstreams_ejected"); got != 0 {
			t.Errorf("ejected gauge = %v, want 0", got)
		}
	})
}

func TestEveryUpstreamEjectedIsStillTriedInOrder(t *testing.T) {
	clk := newFakeClock()
	p := newProxy(t, Options{EjectBase: time.Minute, Clock: clk})
	a, b := refused(t, "a"), refused(t, "b")
	e := startEdge(t, p, a, b)
	c := client(t)
	if status, _ := get(t, c, e.srv.URL+"/"); status != 502 {
		t.Fatalf("status = %d with both down, want 502", status)
	}
	e.next(t)
	if ha, hb := healthOf(p, a.Address), healthOf(p, b.Address); ha.Failures != 1 || hb.Failures != 1 {
		t.Fatalf("failures = %d, %d, want both 1", ha.Failures, hb.Failures)
	}

	// b comes back on its address while both are still ejected.
	ln, err := net.Listen("tcp", b.Address)
	if err != nil {
		t.Skipf("cannot listen on %s again: %v", b.Address, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "b") })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	status, body := get(t, c, e.srv.URL+"/")
	res := e.next(t).res
	if status != 200 || body != "b" || res.Failovers != 1 {
		t.Errorf("got %d %q failovers %d, want 200 \"b\" after trying a first", status, body, res.Failovers)
	}
	if ha := healthOf(p, a.Address); ha.Failures != 2 {
		t.Errorf("a failures = %d, want 2 (tried first although ejected)", ha.Failures)
	}
	if hb := healthOf(p, b.Address); hb.Failures != 0 || !hb.EjectedUntil.IsZero() {
		t.Errorf("b health = %+v, want reset by its success", hb)
	}
}

func TestSkippedUpstreamsAreTriedLastWhenTheOthersFail(t *testing.T) {
	clk := newFakeClock()
	p := newProxy(t, Options{EjectBase: time.Minute, Clock: clk})
	a := refused(t, "a")
	b := refused(t, "b")
	e := startEdge(t, p, a, b)
	c := client(t)
	// Eject a only: a request to a list of a alone.
	only := startEdge(t, p, a)
	get(t, c, only.srv.URL+"/")
	only.next(t)

	// a comes back but is still ejected; b is down.
	ln, err := net.Listen("tcp", a.Address)
	if err != nil {
		t.Skipf("cannot listen on %s again: %v", a.Address, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "a") })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	status, body := get(t, c, e.srv.URL+"/")
	res := e.next(t).res
	if status != 200 || body != "a" || res.Failovers != 1 || res.Node != "a" {
		t.Errorf("got %d %q node %q failovers %d, want 200 from a after b failed", status, body, res.Node, res.Failovers)
	}
}

// counter reads a counter with the given node label from reg (0 when the
// series does not exist yet).
func counter(t *testing.T, reg *prometheus.Registry, name, nodeName string) float64 {
	t.Helper()
	v, _ := testsupport.MetricValue(t, reg, name, testsupport.Labels{"node": nodeName})
	return v
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	v, ok := testsupport.MetricValue(t, reg, name, nil)
	if !ok {
		t.Fatalf("metric %s not found", name)
	}
	return v
}

func TestAFailureEpisodeIsLoggedOnceAndItsRecoveryOnce(t *testing.T) {
	clk := newFakeClock()
	var logs testsupport.SyncBuffer
	p := newProxy(t, Options{Clock: clk, Log: zerolog.New(&logs)})
	a := refused(t, "a")
	e := startEdge(t, p, a, named(t, "b"))
	c := client(t)
	for range 4 {
		clk.Advance(time.Hour) // every request tries a again
		get(t, c, e.srv.URL+"/")
		e.next(t)
	}
	if h := healthOf(p, a.Address); h.Failures != 4 {
		t.Fatalf("failures = %d, want 4", h.Failures)
	}
	ln, err := net.Listen("tcp", a.Address)
	if err != nil {
		t.Skipf("cannot listen on %s again: %v", a.Address, err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "a") })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	for range 2 {
		clk.Advance(time.Hour)
		if _, body := get(t, c, e.srv.URL+"/"); body != "a" {
			t.Fatalf("body = %q, want a back in front", body)
		}
		e.next(t)
	}
	out := logs.String()
	if n := strings.Count(out, "ejecting"); n != 1 {
		t.Errorf("logged %d ejections, want 1:\n%s", n, out)
	}
	if n := strings.Count(out, "recovered"); n != 1 {
		t.Errorf("logged %d recoveries, want 1:\n%s", n, out)
	}
}

func TestALongListFailsOverPastSixtyFourEntries(t *testing.T) {
	clk := newFakeClock()
	p := newProxy(t, Options{EjectBase: time.Minute, Clock: clk})
	var ups []node.Upstream
	for i := range 69 {
		ups = append(ups, refused(t, fmt.Sprintf("down%d", i)))
	}
	ups = append(ups, named(t, "last"))
	e := startEdge(t, p, ups...)
	c := client(t)
	for _, want := range []int{69, 0} { // then every dead one is ejected and skipped
		if status, body := get(t, c, e.srv.URL+"/"); status != 200 || body != "last" {
			t.Fatalf("got %d %q, want 200 from the last upstream", status, body)
		}
		if got := e.next(t).res.Failovers; got != want {
			t.Errorf("Failovers = %d, want %d", got, want)
		}
	}
	// The last one goes down too: all 70 are tried, the ejected ones in
	// order after it.
	ups[69] = refused(t, "last")
	e2 := startEdge(t, p, ups...)
	if status, _ := get(t, c, e2.srv.URL+"/"); status != 502 {
		t.Errorf("status = %d, want 502", status)
	}
	if res := e2.next(t).res; res.Failovers != 69 || res.Node != "down68" {
		t.Errorf("Result = %+v, want 69 failovers ending at down68", res)
	}
}

func TestUpstreamsUnusedForAnHourAreForgotten(t *testing.T) {
	clk := newFakeClock()
	p := newProxy(t, Options{Clock: clk})
	old, kept, fresh := named(t, "old"), named(t, "kept"), named(t, "new")
	c := client(t)
	send := func(u node.Upstream) {
		e := startEdge(t, p, u)
		get(t, c, e.srv.URL+"/")
		e.next(t)
	}
	send(old)
	send(kept)
	clk.Advance(50 * time.Minute)
	send(kept) // still in use
	clk.Advance(20 * time.Minute)
	send(fresh) // a new upstream is when old entries are swept
	var got []string
	for _, h := range p.Health() {
		got = append(got, h.Node)
	}
	if strings.Join(got, ",") != strings.Join(sortedByAddress(kept, fresh), ",") {
		t.Errorf("Health nodes = %v, want kept and new only", got)
	}
}

func sortedByAddress(ups ...node.Upstream) []string {
	slices.SortFunc(ups, func(a, b node.Upstream) int { return strings.Compare(a.Address, b.Address) })
	var names []string
	for _, u := range ups {
		names = append(names, u.Node)
	}
	return names
}

func TestADialThatFindsTheEdgeOutOfDescriptorsEjectsNoUpstream(t *testing.T) {
	p, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	u := node.Upstream{Node: "n", Address: "127.0.0.1:1"}
	r := httptest.NewRequest("GET", "http://a.example/", nil)
	for _, tc := range []struct {
		errno syscall.Errno
		eject bool
	}{{syscall.EMFILE, false}, {syscall.ENFILE, false}, {syscall.ECONNREFUSED, true}} {
		s := p.health.state(u, p.clock.Now())
		dial := &connectError{addr: u.Address, err: &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", tc.errno)}}
		connectFailed, _ := p.failed(r, nil, u, s, dial)
		if !connectFailed {
			t.Errorf("%v: not a connect failure: the next upstream would not be tried", tc.errno)
		}
		if got := s.ejected(p.clock.Now()); got != tc.eject {
			t.Errorf("%v: ejected = %v, want %v", tc.errno, got, tc.eject)
		}
	}
}

// Every connection to an upstream is made through CountDial, which the
// edge uses to count it against its budget; one it refuses (EMFILE: the
// budget is spent) is not made, and the upstream is not blamed.
func TestCountDialMakesEveryUpstreamConnectionAndMayRefuseOne(t *testing.T) {
	var dials, refuse atomic.Int32
	count := func(dial func() (net.Conn, error)) (net.Conn, error) {
		if refuse.Load() > 0 {
			return nil, fmt.Errorf("budget spent: %w", syscall.EMFILE)
		}
		dials.Add(1)
		return dial()
	}
	p := newProxy(t, Options{CountDial: count})
	up := named(t, "a")
	e := startEdge(t, p, up)
	c := client(t)
	if status, body := get(t, c, e.srv.URL+"/"); status != 200 || body != "a" {
		t.Fatalf("got %d %q, want 200 \"a\"", status, body)
	}
	if got := dials.Load(); got != 1 {
		t.Errorf("CountDial made %d connections for one request, want 1", got)
	}
	refuse.Store(1)
	p.CloseIdle(0)
	if status, _ := get(t, c, e.srv.URL+"/"); status != http.StatusBadGateway {
		t.Errorf("a request whose dial was refused got %d, want 502", status)
	}
	if h := healthOf(p, up.Address); h.Failures != 0 {
		t.Errorf("the upstream was blamed for the edge's budget: %+v", h)
	}
}
