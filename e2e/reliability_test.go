package e2e

// Reliability through faults: each test drives the real binary on loopback,
// counts the requests it sent and the ones that failed, and logs those
// figures in a line starting "figures:", so a run's log states how the edge
// held up and not only that it passed. Load phases are bounded to a few
// seconds.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	bolt "go.etcd.io/bbolt"

	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
	"github.com/scafo/scafo-edge/node/nodetest"
)

// faultLoad counts what a load generator sent and how it went.
type faultLoad struct {
	sent, failed, misrouted atomic.Int64
	mu                      sync.Mutex
	samples                 []string // the first few failures, for the log
}

func (s *faultLoad) fail(misrouted bool, what string) {
	s.failed.Add(1)
	if misrouted {
		s.misrouted.Add(1)
	}
	s.mu.Lock()
	if len(s.samples) < 5 {
		s.samples = append(s.samples, what)
	}
	s.mu.Unlock()
}

func (s *faultLoad) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return fmt.Sprintf("sent %d, failed %d (misrouted %d); first failures: %q", s.sent.Load(), s.failed.Load(), s.misrouted.Load(), s.samples)
}

// errMisrouted marks a request answered by the wrong upstream.
var errMisrouted = errors.New("misrouted")

// runFaultLoad runs workers goroutines calling one until ctx ends, counting each
// call; stop waits for them. one returns nil for a correct answer.
func runFaultLoad(ctx context.Context, workers int, st *faultLoad, one func(worker, i int) error) (stop func()) {
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				err := one(w, i)
				if ctx.Err() != nil && err != nil {
					return // the load ended mid-request: not the edge's doing
				}
				st.sent.Add(1)
				if err != nil {
					st.fail(errors.Is(err, errMisrouted), err.Error())
				}
			}
		}()
	}
	return wg.Wait
}

// faultClient is an HTTP client for load: keep-alive connections, one per
// worker, and a timeout generous enough for a loaded machine.
func faultClient(t *testing.T, workers int) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: workers, DisableCompression: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 20 * time.Second}
}

// expectAnswer GETs host+path from the edge and checks the answer starts with
// want: another upstream's answer is errMisrouted, anything else a failure.
func expectAnswer(c *http.Client, addr, host, path, want string) error {
	req, _ := http.NewRequest("GET", "http://"+addr+path, nil)
	req.Host = host
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	switch {
	case err != nil:
		return fmt.Errorf("%s%s: body: %w", host, path, err)
	case resp.StatusCode != 200:
		return fmt.Errorf("%s%s: %d %q", host, path, resp.StatusCode, b)
	case !strings.HasPrefix(string(b), want):
		return fmt.Errorf("%w: %s%s answered %q, want %q", errMisrouted, host, path, b, want)
	}
	return nil
}

// writeRoutesFile writes doc as a routes file for --routes-file.
func writeRoutesFile(t *testing.T, dir string, doc *node.Document) string {
	t.Helper()
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "routes.json")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func waitEdgeReady(t *testing.T, e *runningEdge) {
	t.Helper()
	testsupport.WaitForNil(t, 20*time.Second, "edge ready", func() error {
		if code, body := e.admin(t, "/readyz"); code != 200 {
			return fmt.Errorf("/readyz %d %q", code, body)
		}
		return nil
	})
}

// TestDocumentSwapsUnderLoad swaps the routing document every 100ms while
// four clients keep requesting: no request fails or is misrouted, and a
// WebSocket opened before the first swap still echoes after the last
// (docs/design.md rule 2: swap, never mutate; a swap never touches established
// connections).
func TestDocumentSwapsUnderLoad(t *testing.T) {
	a, b := app(t, "A"), app(t, "B")
	ws := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		for {
			typ, msg, err := c.Read(r.Context())
			if err != nil {
				return
			}
			if err := c.Write(r.Context(), typ, append([]byte("echo "), msg...)); err != nil {
				return
			}
		}
	}))
	t.Cleanup(ws.Close)
	// Every version routes the hosts under load the same way; what changes
	// is a route the load never asks for, and so the fingerprint.
	docVersion := func(v int) *node.Document {
		return &node.Document{V: 1, Routes: []node.Route{
			{Host: "a.example", Application: "a", Upstreams: []node.Upstream{{Node: "n1", Address: hostOf(a)}}},
			{Host: "b.example", Application: "b", Upstreams: []node.Upstream{{Node: "n1", Address: hostOf(b)}}},
			{Host: fmt.Sprintf("churn-%d.example", v), Application: "churn", Upstreams: []node.Upstream{{Node: "n1", Address: hostOf(a)}}},
			{Host: "flip.example", Application: "flip", Upstreams: []node.Upstream{{Node: "n1", Address: hostOf(b)}}, Paths: map[string]string{"acct": "a.example"}},
			{Host: "ws.example", Application: "ws", Upstreams: []node.Upstream{{Node: "n1", Address: hostOf(ws)}}},
		}}
	}
	n := nodetest.New(t, nodetest.Options{})
	n.SetDocument(docVersion(0))
	e := startEdge(t, "--node", n.URL(), "--tls", "off")
	waitEdgeReady(t, e)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, _, err := websocket.Dial(ctx, "ws://"+e.HTTPAddr+"/ws", &websocket.DialOptions{Host: "ws.example"})
	if err != nil {
		t.Fatalf("open WebSocket through the edge: %v", err)
	}
	defer conn.CloseNow()
	echo := func(msg string) {
		t.Helper()
		if err := conn.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
			t.Fatalf("WebSocket write %q: %v", msg, err)
		}
		_, got, err := conn.Read(ctx)
		if err != nil || string(got) != "echo "+msg {
			t.Fatalf("WebSocket echo of %q: %q %v", msg, got, err)
		}
	}
	echo("before the first swap")
	changesBefore := e.metric(t, "scafo_edge_document_changes_total", nil)

	const workers = 4
	client := faultClient(t, workers)
	targets := []struct{ host, path, want string }{
		{"a.example", "/x", "A /x"},
		{"b.example", "/y", "B /y"},
		{"flip.example", "/acct/z", "A /acct/z"},
		{"flip.example", "/other", "B /other"},
	}
	var st faultLoad
	loadCtx, stopLoad := context.WithCancel(ctx)
	wait := runFaultLoad(loadCtx, workers, &st, func(w, i int) error {
		tg := targets[(w+i)%len(targets)]
		return expectAnswer(client, e.HTTPAddr, tg.host, tg.path, tg.want)
	})

	const versions = 25
	tick := time.NewTicker(100 * time.Millisecond)
	for v := 1; v <= versions; v++ {
		<-tick.C
		n.SetDocument(docVersion(v))
	}
	tick.Stop()
	testsupport.WaitForNil(t, 20*time.Second, "the last version served", func() error {
		if code, _ := e.get(t, fmt.Sprintf("churn-%d.example", versions), "/"); code != 200 {
			return fmt.Errorf("churn-%d.example: %d", versions, code)
		}
		return nil
	})
	stopLoad()
	wait()
	swaps := e.metric(t, "scafo_edge_document_changes_total", nil) - changesBefore
	echo("after the last swap")

	t.Logf("figures: document swaps under load: %d versions published every 100ms, %.0f swaps applied by the edge; requests %s; WebSocket opened before the first swap still echoing",
		versions, swaps, &st)
	if st.failed.Load() != 0 {
		t.Errorf("requests failed during swaps: %s", &st)
	}
	if st.sent.Load() < 100 {
		t.Errorf("only %d requests were sent; the load proves little", st.sent.Load())
	}
	if swaps < 5 {
		t.Errorf("the edge applied only %.0f swaps during the load, want several", swaps)
	}
}

// killableUpstream is an upstream whose listener and connections can be killed at
// once, as a crashed process's would be.
type killableUpstream struct {
	srv      *http.Server
	addr     string
	inFlight atomic.Int64
	served   atomic.Int64
}

func newKillableUpstream(t *testing.T, name string) *killableUpstream {
	k := &killableUpstream{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	k.addr = ln.Addr().String()
	k.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k.inFlight.Add(1)
		defer k.inFlight.Add(-1)
		io.Copy(io.Discard, r.Body)
		k.served.Add(1)
		fmt.Fprintf(w, "%s %s", name, r.RequestURI)
	})}
	go k.srv.Serve(ln)
	t.Cleanup(func() { k.srv.Close() })
	return k
}

// TestFirstUpstreamKilledUnderLoad kills a route's first upstream, listener
// and connections, while four clients keep sending GETs and POSTs: the route
// fails over to the second, and at most the requests in flight on the killed
// connections fail (docs/design.md rule 7).
func TestFirstUpstreamKilledUnderLoad(t *testing.T) {
	first, second := newKillableUpstream(t, "first"), newKillableUpstream(t, "second")
	dir := t.TempDir()
	routes := writeRoutesFile(t, dir, &node.Document{V: 1, Routes: []node.Route{
		{Host: "k.example", Application: "k", Upstreams: []node.Upstream{{Node: "n1", Address: first.addr}, {Node: "n2", Address: second.addr}}},
	}})
	e := startEdge(t, "--routes-file", routes, "--tls", "off")
	waitEdgeReady(t, e)

	const workers = 4
	client := faultClient(t, workers)
	var st faultLoad
	var afterKill atomic.Bool
	var failedAfterSettle atomic.Int64
	var settled atomic.Bool
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	wait := runFaultLoad(ctx, workers, &st, func(w, i int) error {
		var req *http.Request
		if i%2 == 0 {
			req, _ = http.NewRequest("GET", "http://"+e.HTTPAddr+"/get", nil)
		} else {
			req, _ = http.NewRequest("POST", "http://"+e.HTTPAddr+"/post", strings.NewReader("a small body"))
		}
		req.Host = "k.example"
		resp, err := client.Do(req)
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode != 200 {
				err = fmt.Errorf("status %d", resp.StatusCode)
			}
		}
		if err != nil && settled.Load() {
			failedAfterSettle.Add(1)
		}
		if err != nil && !afterKill.Load() {
			err = fmt.Errorf("before the kill: %w", err)
		}
		return err
	})
	testsupport.WaitForNil(t, 20*time.Second, "load on the first upstream", func() error {
		if n := first.served.Load(); n < 200 {
			return fmt.Errorf("%d served", n)
		}
		return nil
	})
	afterKill.Store(true)
	inFlightAtKill := first.inFlight.Load()
	first.srv.Close() // listener and every connection, at once
	sentAtKill := st.sent.Load()
	testsupport.WaitForNil(t, 20*time.Second, "load on the second upstream", func() error {
		if n := second.served.Load(); n < 100 {
			return fmt.Errorf("%d served", n)
		}
		return nil
	})
	settled.Store(true)
	settledAt := second.served.Load()
	testsupport.WaitForNil(t, 20*time.Second, "load after failing over", func() error {
		if n := second.served.Load() - settledAt; n < 200 {
			return fmt.Errorf("%d served", n)
		}
		return nil
	})
	cancel()
	wait()

	t.Logf("figures: first upstream killed under load: requests %s; %d sent before the kill, %d in the upstream's handler at the kill; served by first %d, by second %d",
		&st, sentAtKill, inFlightAtKill, first.served.Load(), second.served.Load())
	// In flight on killed connections: at most one per client connection.
	if f := st.failed.Load(); f > workers {
		t.Errorf("%d requests failed; at most the %d in flight on the killed connections may: %s", f, workers, &st)
	}
	if f := failedAfterSettle.Load(); f != 0 {
		t.Errorf("%d requests failed after the failover settled", f)
	}
	for _, s := range st.samples {
		if strings.Contains(s, "before the kill") {
			t.Errorf("a request failed before the kill: %s", s)
		}
	}
}

// TestNodeUnreachableThenBack stops the node under load: traffic is
// unaffected, the staleness metric and /readyz show it, and the failure and
// the recovery are each logged once. The "minutes" are seconds
// here: the edge's behaviour does not depend on how long, only on how many
// polls fail (about 30 at --poll-interval 100ms).
func TestNodeUnreachableThenBack(t *testing.T) {
	a := app(t, "A")
	n := nodetest.New(t, nodetest.Options{})
	n.SetDocument(&node.Document{V: 1, Routes: []node.Route{{Host: "a.example", Application: "a", Upstreams: []node.Upstream{{Node: "n1", Address: hostOf(a)}}}}})
	e := startEdge(t, "--node", n.URL(), "--tls", "off")
	waitEdgeReady(t, e)

	const workers = 2
	client := faultClient(t, workers)
	var st faultLoad
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	wait := runFaultLoad(ctx, workers, &st, func(w, i int) error {
		return expectAnswer(client, e.HTTPAddr, "a.example", "/during", "A /during")
	})

	n.Stop()
	var stale float64
	testsupport.WaitForNil(t, 30*time.Second, "the edge to notice the node is gone", func() error {
		stale = e.metric(t, "scafo_edge_routing_seconds_since_last_good", nil)
		fails := e.metric(t, "scafo_edge_routing_consecutive_failures", nil)
		if !(stale >= 3 && fails >= 10) {
			return fmt.Errorf("seconds since last good %v, consecutive failures %v", stale, fails)
		}
		return nil
	})
	code, readyz := e.admin(t, "/readyz")
	if code != 200 || !strings.Contains(readyz, "last error:") || !strings.Contains(readyz, "consecutive failures") {
		t.Errorf("/readyz while the node is down = %d %q, want 200 with the last error and the failure count", code, readyz)
	}
	failuresSeen := e.metric(t, "scafo_edge_routing_consecutive_failures", nil)
	if err := n.Restart(); err != nil {
		t.Fatal(err)
	}
	testsupport.WaitForNil(t, 30*time.Second, "recovery", func() error {
		if _, body := e.admin(t, "/readyz"); strings.Contains(body, "last error") {
			return fmt.Errorf("/readyz %q", body)
		}
		if v := e.metric(t, "scafo_edge_routing_seconds_since_last_good", nil); !(v < 2) {
			return fmt.Errorf("seconds since last good %v", v)
		}
		return nil
	})
	cancel()
	wait()

	t.Logf("figures: node unreachable then back: requests %s; %.0f polls failed in a row, staleness reached %.1fs", &st, failuresSeen, stale)
	if st.failed.Load() != 0 || st.sent.Load() == 0 {
		t.Errorf("traffic while the node was down: %s, want none failed", &st)
	}
	if got := e.countLogs("routing document poll failed"); got != 1 {
		t.Errorf("the outage was logged %d times, want once", got)
	}
	if got := e.countLogs("routing document poll recovered"); got != 1 {
		t.Errorf("the recovery was logged %d times, want once", got)
	}
}

// TestRestartWithTheNodeDownServesStoredCertificates restarts an edge on
// its state dir while the node is down: it serves the persisted document
// and the very certificate it obtained before (same serial, no new
// issuance), from the internal CA it kept.
func TestRestartWithTheNodeDownServesStoredCertificates(t *testing.T) {
	a := app(t, "A")
	n := nodetest.New(t, nodetest.Options{})
	n.SetDocument(&node.Document{V: 1, Routes: []node.Route{{Host: "a.example", Application: "a", Upstreams: []node.Upstream{{Node: "n1", Address: hostOf(a)}}}}})
	state := t.TempDir()
	e := startEdge(t, "--node", n.URL(), "--tls", "internal", "--state-dir", state)
	waitEdgeReady(t, e)
	serial, body := httpsGetInternal(t, e, state, "a.example", "/first")
	if !strings.HasPrefix(body, "A /first") {
		t.Fatalf("HTTPS before the restart: %q", body)
	}
	root1, _ := os.ReadFile(filepath.Join(state, internalRootFile))
	if err := e.stop(t); err != nil {
		t.Fatalf("edge exit: %v", err)
	}
	n.Stop()

	e2 := startEdge(t, "--node", n.URL(), "--tls", "internal", "--state-dir", state)
	serial2, body2 := httpsGetInternal(t, e2, state, "a.example", "/second")
	if !strings.HasPrefix(body2, "A /second") {
		t.Errorf("HTTPS after the restart with the node down: %q, want the persisted document served", body2)
	}
	if serial2.Cmp(serial) != 0 {
		t.Errorf("certificate serial after the restart %x, before %x: want the stored certificate, not a new one", serial2, serial)
	}
	if root2, _ := os.ReadFile(filepath.Join(state, internalRootFile)); !bytes.Equal(root1, root2) {
		t.Error("the internal CA root changed across the restart; clients trusting it would break")
	}
	if code, body := e2.admin(t, "/readyz"); code != 200 || !strings.Contains(body, "stale") {
		t.Errorf("/readyz = %d %q, want 200 stale", code, body)
	}
}

// httpsGetInternal requests host+path over the edge's HTTPS listener, trusting the
// internal CA root in state, and returns the leaf's serial and the body.
func httpsGetInternal(t *testing.T, e *runningEdge, state, host, path string) (*big.Int, string) {
	t.Helper()
	pem, err := os.ReadFile(filepath.Join(state, internalRootFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		t.Fatal("internal root is not PEM")
	}
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: host},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", e.HTTPSAddr)
		},
	}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	resp, err := c.Get("https://" + host + path)
	if err != nil {
		t.Fatalf("HTTPS GET %s%s: %v", host, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.TLS.PeerCertificates[0].SerialNumber, string(b)
}

// TestSIGTERMUnderLoad sends SIGTERM while eight requests are held in an
// upstream and two clients keep opening new connections: every held request
// completes, every new request is either served or refused at connect (never
// accepted and then dropped), and the edge exits 0 within the bound.
func TestSIGTERMUnderLoad(t *testing.T) {
	const held = 8
	var entered atomic.Int64
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "finished")
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	fast := app(t, "F")
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{
		{Host: "slow.example", Application: "slow", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(slow)}}},
		{Host: "fast.example", Application: "fast", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(fast)}}},
	}})
	const bound = 20 * time.Second
	e := startEdge(t, "--routes-file", routes, "--tls", "off", "--shutdown-timeout", bound.String())
	waitEdgeReady(t, e)

	noKeepAlive := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	results := make(chan string, held)
	for range held {
		go func() {
			req, _ := http.NewRequest("GET", "http://"+e.HTTPAddr+"/", nil)
			req.Host = "slow.example"
			resp, err := noKeepAlive.Do(req)
			if err != nil {
				results <- err.Error()
				return
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			results <- fmt.Sprintf("%d %s %v", resp.StatusCode, b, err)
		}()
	}
	testsupport.WaitForNil(t, 20*time.Second, "held requests in the upstream", func() error {
		if n := entered.Load(); n < held {
			return fmt.Errorf("%d entered", n)
		}
		return nil
	})

	// The new-connection load: served (200) or refused before any byte of
	// a response; anything else is a request accepted and then dropped.
	var sent, served, refused, dropped atomic.Int64
	var dropSamples sync.Map
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Once the listener is gone every dial is refused at once: a
			// few dozen refusals prove it without spinning a CPU.
			for refusedHere := 0; ctx.Err() == nil && refusedHere < 50; {
				sent.Add(1)
				req, _ := http.NewRequest("GET", "http://"+e.HTTPAddr+"/new", nil)
				req.Host = "fast.example"
				resp, err := noKeepAlive.Do(req)
				switch {
				case err != nil && neverAccepted(err):
					refused.Add(1)
					refusedHere++
					continue
				case err != nil:
					dropped.Add(1)
					dropSamples.Store(err.Error(), true)
				default:
					b, rerr := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode == 200 && rerr == nil && strings.HasPrefix(string(b), "F /new") {
						served.Add(1)
					} else {
						dropped.Add(1)
						dropSamples.Store(fmt.Sprintf("%d %q %v", resp.StatusCode, b, rerr), true)
					}
				}
			}
		}()
	}
	testsupport.WaitForNil(t, 20*time.Second, "new-connection load running", func() error {
		if n := served.Load(); n < 20 {
			return fmt.Errorf("%d served", n)
		}
		return nil
	})

	termAt := time.Now()
	e.cmd.Process.Signal(syscall.SIGTERM)
	testsupport.WaitForNil(t, 20*time.Second, "listener closed after SIGTERM", func() error {
		c, err := net.Dial("tcp", e.HTTPAddr)
		if err == nil {
			c.Close()
			return errors.New("still accepting")
		}
		return nil
	})
	// The load ends by itself once each worker has been refused 50 times.
	loadDone := make(chan struct{})
	go func() { wg.Wait(); close(loadDone) }()
	select {
	case <-loadDone:
	case <-time.After(30 * time.Second):
		t.Fatalf("new connections still not refused 30s after the listener closed: %d refused", refused.Load())
	}
	close(release)
	for range held {
		select {
		case got := <-results:
			if got != "200 finished <nil>" {
				t.Errorf("a request in flight at SIGTERM got %q, want it to finish", got)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a request in flight at SIGTERM never finished")
		}
	}
	select {
	case <-e.done:
	case <-time.After(bound + 10*time.Second):
		t.Fatalf("edge did not exit within %v of SIGTERM", bound)
	}
	exitAfter := time.Since(termAt)
	if e.err != nil {
		t.Errorf("exit after SIGTERM: %v, want 0", e.err)
	}
	var samples []string
	dropSamples.Range(func(k, _ any) bool { samples = append(samples, k.(string)); return len(samples) < 5 })
	t.Logf("figures: SIGTERM under load: %d held requests all completed; new-connection load sent %d, served %d, refused at connect %d, failed otherwise %d; exit 0 after %v (bound %v)",
		held, sent.Load(), served.Load(), refused.Load(), dropped.Load(), exitAfter.Round(time.Millisecond), bound)
	if dropped.Load() != 0 {
		t.Errorf("%d requests were accepted and then dropped during shutdown: %q", dropped.Load(), samples)
	}
}

// neverAccepted reports whether a client error means the server never took
// the request: the connect was refused, or the kernel reset a connection
// still waiting in the closed listener's backlog before any response.
func neverAccepted(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, io.EOF)
}

// TestStateFileFaultsStopTheStart: a state file locked by another process,
// one the edge may not write, and a corrupt one each stop the start with a
// non-zero exit and a message naming the file; nothing falls back to an
// empty store that would lose the certificates, and a corrupt file is moved
// aside, never deleted.
func TestStateFileFaultsStopTheStart(t *testing.T) {
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{{Host: "a.example", Application: "a", Upstreams: []node.Upstream{{Node: "n", Address: "127.0.0.1:1"}}}}})

	t.Run("a state file locked by another process", func(t *testing.T) {
		state := t.TempDir()
		dbPath := filepath.Join(state, node.StateFile)
		db, err := bolt.Open(dbPath, 0o600, &bolt.Options{Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		code, out := runEdgeToExit(t, edgeBinary, nil, "--routes-file", routes, "--tls", "off", "--state-dir", state)
		if code == 0 || !strings.Contains(out, dbPath) || !strings.Contains(out, "locked by another process") {
			t.Errorf("exit %d, output:\n%s\nwant non-zero, naming %s as locked", code, out, dbPath)
		}
	})

	t.Run("a state file the edge may not write", func(t *testing.T) {
		bin, cred, state := permissionRun(t)
		dbPath := filepath.Join(state, node.StateFile)
		seedStateFile(t, dbPath)
		before := sha256File(t, dbPath)
		mustNil(t, os.Chmod(dbPath, 0o400))
		if cred == nil {
			mustNil(t, os.Chmod(state, 0o500))
			t.Cleanup(func() { os.Chmod(state, 0o700) })
		}
		code, out := runEdgeToExit(t, bin, cred, "--routes-file", routes, "--tls", "off", "--state-dir", state)
		if code == 0 || !strings.Contains(out, dbPath) || !strings.Contains(out, "permission denied") {
			t.Errorf("exit %d, output:\n%s\nwant non-zero, naming %s and permission denied", code, out, dbPath)
		}
		if after := sha256File(t, dbPath); after != before {
			t.Error("the unwritable state file changed")
		}
	})

	t.Run("a state directory the edge may not create its file in", func(t *testing.T) {
		bin, cred, state := permissionRun(t)
		mustNil(t, os.Chmod(state, 0o555))
		t.Cleanup(func() { os.Chmod(state, 0o755) })
		dbPath := filepath.Join(state, node.StateFile)
		code, out := runEdgeToExit(t, bin, cred, "--routes-file", routes, "--tls", "off", "--state-dir", state)
		if code == 0 || !strings.Contains(out, dbPath) || !strings.Contains(out, "permission denied") {
			t.Errorf("exit %d, output:\n%s\nwant non-zero, naming %s and permission denied", code, out, dbPath)
		}
	})

	t.Run("a corrupt state file is moved aside, never deleted, and the start refused", func(t *testing.T) {
		state := t.TempDir()
		dbPath := filepath.Join(state, node.StateFile)
		garbage := bytes.Repeat([]byte("not a bbolt page; certificates were here\n"), 400)
		mustNil(t, os.WriteFile(dbPath, garbage, 0o600))
		code, out := runEdgeToExit(t, edgeBinary, nil, "--routes-file", routes, "--tls", "internal", "--state-dir", state)
		if code == 0 || !strings.Contains(out, dbPath) || !strings.Contains(out, "corrupt") {
			t.Errorf("exit %d, output:\n%s\nwant non-zero, naming %s as corrupt", code, out, dbPath)
		}
		if _, err := os.Stat(dbPath); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the corrupt file is still at %s (%v); want it moved aside", dbPath, err)
		}
		aside, _ := filepath.Glob(dbPath + ".corrupt-*")
		if len(aside) != 1 {
			t.Fatalf("files moved aside: %v, want one", aside)
		}
		if got, _ := os.ReadFile(aside[0]); !bytes.Equal(got, garbage) {
			t.Errorf("%s does not hold the corrupt file's bytes", aside[0])
		}
		if !strings.Contains(out, aside[0]) {
			t.Errorf("the refusal does not say where the file went (%s):\n%s", aside[0], out)
		}
		// The next start, with the bad file out of the way, begins empty and
		// serves; the moved file is left alone.
		e := startEdge(t, "--routes-file", routes, "--tls", "internal", "--state-dir", state)
		waitEdgeReady(t, e)
		if got, _ := os.ReadFile(aside[0]); !bytes.Equal(got, garbage) {
			t.Errorf("%s changed after the next start", aside[0])
		}
	})
}

// TestStateAndTokenFileModes: the edge creates its state dir 0700 and its
// bbolt file 0600 (they hold certificate keys), and warns at start-up about
// an ingress token file others can read.
func TestStateAndTokenFileModes(t *testing.T) {
	dir := t.TempDir()
	routes := writeRoutesFile(t, dir, &node.Document{V: 1, Routes: []node.Route{{Host: "a.example", Application: "a", Upstreams: []node.Upstream{{Node: "n", Address: "127.0.0.1:1"}}}}})
	loose := filepath.Join(dir, "loose-token")
	mustNil(t, os.WriteFile(loose, []byte("tok\n"), 0o644))
	mustNil(t, os.Chmod(loose, 0o644))
	state := filepath.Join(dir, "not", "yet", "state")
	e := startEdge(t, "--routes-file", routes, "--tls", "internal", "--state-dir", state, "--ingress-token-file", loose)
	waitEdgeReady(t, e)
	for _, c := range []struct {
		path string
		want os.FileMode
	}{
		{state, 0o700},
		{filepath.Join(state, node.StateFile), 0o600},
	} {
		fi, err := os.Stat(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != c.want {
			t.Errorf("%s mode %04o, want %04o", c.path, got, c.want)
		}
	}
	if !e.logged("INGRESS TOKEN FILE " + loose + " IS READABLE BY GROUP OR OTHERS") {
		t.Errorf("no start-up warning about the world-readable token file %s:\n%s", loose, e.logText())
	}

	t.Run("a private token file draws no warning", func(t *testing.T) {
		private := filepath.Join(dir, "private-token")
		mustNil(t, os.WriteFile(private, []byte("tok\n"), 0o600))
		e := startEdge(t, "--routes-file", routes, "--tls", "off", "--ingress-token-file", private)
		waitEdgeReady(t, e)
		if e.logged("READABLE BY GROUP OR OTHERS") {
			t.Errorf("warned about a 0600 token file:\n%s", e.logText())
		}
	})
}

// TestUpstreamFaultsThroughTheBinary: an upstream that accepts and never
// answers (504 after --response-header-timeout; released at once when the
// client gives up first), one that resets mid-body (the client sees the
// body cut short) and one that sends a malformed response (502). Afterwards
// the edge's goroutines and file descriptors are back where they were: the
// binary-level leak check, as goleak cannot look into another process.
func TestUpstreamFaultsThroughTheBinary(t *testing.T) {
	hung := scriptedUpstream(t, func(c net.Conn, r *bufio.Reader) {
		io.Copy(io.Discard, r) // read whatever comes, answer nothing
	})
	reset := scriptedUpstream(t, func(c net.Conn, r *bufio.Reader) {
		if _, err := http.ReadRequest(r); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
		c.Write(bytes.Repeat([]byte("x"), 4096))
		c.(*net.TCPConn).SetLinger(0) // RST, not FIN
	})
	malformed := scriptedUpstream(t, func(c net.Conn, r *bufio.Reader) {
		if _, err := http.ReadRequest(r); err != nil {
			return
		}
		io.WriteString(c, "HTTP/1.1 two hundred\r\nContent-Length: 2\r\n\r\nok")
	})
	a := app(t, "A")
	routes := writeRoutesFile(t, t.TempDir(), &node.Document{V: 1, Routes: []node.Route{
		{Host: "a.example", Application: "a", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(a)}}},
		{Host: "hung.example", Application: "hung", Upstreams: []node.Upstream{{Node: "n", Address: hung}}},
		{Host: "reset.example", Application: "reset", Upstreams: []node.Upstream{{Node: "n", Address: reset}}},
		{Host: "malformed.example", Application: "malformed", Upstreams: []node.Upstream{{Node: "n", Address: malformed}}},
	}})
	e := startEdge(t, "--routes-file", routes, "--tls", "off", "--response-header-timeout", "1s")
	waitEdgeReady(t, e)
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for range 3 {
		if err := expectAnswer(client, e.HTTPAddr, "a.example", "/warm", "A /warm"); err != nil {
			t.Fatal(err)
		}
	}
	baseG := e.metric(t, "go_goroutines", nil)
	baseFD := e.metric(t, "process_open_fds", nil)

	const perFault = 30
	cases := []struct {
		name, host string
		timeout    time.Duration
		check      func(resp *http.Response, body []byte, err error) error
	}{
		{"an upstream that never answers is 504 after the response-header timeout", "hung.example", 0,
			func(resp *http.Response, body []byte, err error) error {
				if err != nil || resp.StatusCode != 504 {
					return fmt.Errorf("%v %v", resp, err)
				}
				return nil
			}},
		{"a client giving up on a hung upstream frees the request", "hung.example", 200 * time.Millisecond,
			func(resp *http.Response, body []byte, err error) error {
				if err == nil {
					return fmt.Errorf("answered %d before the client gave up", resp.StatusCode)
				}
				return nil
			}},
		{"an upstream resetting mid-body is a body cut short", "reset.example", 0,
			func(resp *http.Response, body []byte, err error) error {
				if resp == nil || resp.StatusCode != 200 || err == nil || len(body) >= 100000 {
					return fmt.Errorf("got %v, %d bytes, %v; want 200 and a truncated body", resp, len(body), err)
				}
				return nil
			}},
		{"a malformed response is 502", "malformed.example", 0,
			func(resp *http.Response, body []byte, err error) error {
				if err != nil || resp.StatusCode != 502 {
					return fmt.Errorf("%v %v", resp, err)
				}
				return nil
			}},
	}
	var total, failedWrong int
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var wg sync.WaitGroup
			errs := make(chan error, perFault)
			sem := make(chan struct{}, 10)
			for i := range perFault {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer wg.Done()
					defer func() { <-sem }()
					ctx := context.Background()
					if c.timeout > 0 {
						var cancel context.CancelFunc
						ctx, cancel = context.WithTimeout(ctx, c.timeout)
						defer cancel()
					}
					req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+e.HTTPAddr+"/f"+strconv.Itoa(i), nil)
					req.Host = c.host
					resp, err := client.Do(req)
					var body []byte
					if err == nil {
						body, err = io.ReadAll(resp.Body)
						resp.Body.Close()
					}
					if cerr := c.check(resp, body, err); cerr != nil {
						errs <- cerr
					}
				}()
			}
			wg.Wait()
			close(errs)
			total += perFault
			for err := range errs {
				failedWrong++
				t.Errorf("%s: %v", c.host, err)
			}
		})
	}

	var g, fds float64
	testsupport.WaitForNil(t, 30*time.Second, "goroutines and file descriptors back to the baseline", func() error {
		g, fds = e.metric(t, "go_goroutines", nil), e.metric(t, "process_open_fds", nil)
		if g > baseG+5 || fds > baseFD+5 {
			return fmt.Errorf("goroutines %v (baseline %v), open fds %v (baseline %v)", g, baseG, fds, baseFD)
		}
		return nil
	})
	t.Logf("figures: upstream faults through the binary: %d requests sent, %d answered wrongly; goroutines %v -> %v, open fds %v -> %v",
		total, failedWrong, baseG, g, baseFD, fds)
	if code, _ := e.get(t, "a.example", "/after"); code != 200 {
		t.Errorf("a healthy route after the faults: %d", code)
	}
}

// scriptedUpstream is a loopback TCP upstream that hands each connection to
// serve, then closes it. It is stopped when the test ends.
func scriptedUpstream(t *testing.T, serve func(c net.Conn, r *bufio.Reader)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				serve(c, bufio.NewReader(c))
				c.Close()
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// runEdgeToExit runs "bin serve" with loopback listeners and args until it
// exits (within 60s), as cred when set, and returns the exit code and its
// combined output.
func runEdgeToExit(t *testing.T, bin string, cred *syscall.Credential, args ...string) (int, string) {
	t.Helper()
	full := append([]string{"serve", "--http-addr", "127.0.0.1:0", "--https-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"}, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, full...)
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("scafo-edge did not exit within 60s:\n%s", out.String())
	}
	code := 0
	if err != nil {
		var ee interface{ ExitCode() int }
		if !errors.As(err, &ee) {
			t.Fatalf("run scafo-edge: %v", err)
		}
		code = ee.ExitCode()
	}
	return code, out.String()
}

// permissionRun returns a binary, a credential and a fresh state dir for a
// run where file permissions apply: as root (which ignores them) the binary
// is copied where uid 65532 can run it and run as that user; otherwise the
// edge runs as the test's own user, with a nil credential.
func permissionRun(t *testing.T) (bin string, cred *syscall.Credential, state string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "scafo-edge-perm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(dir, 0o755); os.RemoveAll(dir) })
	mustNil(t, os.Chmod(dir, 0o755))
	state = filepath.Join(dir, "state")
	mustNil(t, os.Mkdir(state, 0o755))
	if os.Geteuid() != 0 {
		return edgeBinary, nil, state
	}
	bin = filepath.Join(dir, "scafo-edge")
	src, err := os.ReadFile(edgeBinary)
	if err != nil {
		t.Fatal(err)
	}
	mustNil(t, os.WriteFile(bin, src, 0o755))
	return bin, &syscall.Credential{Uid: 65532, Gid: 65532, NoSetGroups: true}, state
}

// seedStateFile creates a sound bbolt file at path holding one record, as an
// earlier run would have left it.
func seedStateFile(t *testing.T, path string) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte("certmagic"))
		if err != nil {
			return err
		}
		return b.Put([]byte("certificates/a.example/a.example.crt"), []byte("a certificate worth keeping"))
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
}

func sha256File(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func mustNil(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
