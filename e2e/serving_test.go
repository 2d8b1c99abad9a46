package e2e

import (
	"bufio"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
	"github.com/scafo/scafo-edge/node/nodetest"
)

// app is a loopback upstream answering with its name and the request-URI.
func app(t *testing.T, name string) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s xff=%s proto=%s fhost=%s", name, r.RequestURI,
			r.Header.Get("X-Forwarded-For"), r.Header.Get("X-Forwarded-Proto"), r.Header.Get("X-Forwarded-Host"))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func hostOf(srv *httptest.Server) string { return srv.Listener.Addr().String() }

func routesDoc(a, b string) *node.Document {
	return &node.Document{V: 1, Routes: []node.Route{
		{Host: "a.example", Application: "app-a", Upstreams: []node.Upstream{{Node: "n1", Address: a}}},
		{Host: "b.example", Application: "app-b", Upstreams: []node.Upstream{{Node: "n1", Address: b}}},
	}}
}

func TestNodeDrainingThenRecovery(t *testing.T) {
	a, b := app(t, "A"), app(t, "B")
	n := nodetest.New(t, nodetest.Options{Token: "secret-token", ID: "n1"})
	e := startEdge(t, "--node", n.URL(), "--ingress-token", "secret-token", "--tls", "off")

	// The node has not finished its first pass: it answers 503 draining,
	// and so does the edge, with Retry-After (docs/design.md rule 1).
	n.WaitRequests(t, 1)
	if code, body := e.get(t, "a.example", "/"); code != 503 || !strings.Contains(body, "no routing document") {
		t.Fatalf("before the first pass: %d %q, want 503", code, body)
	}
	if code, _ := e.admin(t, "/readyz"); code != 503 {
		t.Errorf("/readyz before the first document = %d, want 503", code)
	}

	n.SetDocument(routesDoc(hostOf(a), hostOf(b)))
	testsupport.WaitForNil(t, 15*time.Second, "edge serves the first document", func() error {
		if code, body := e.get(t, "a.example", "/x"); code != 200 || !strings.HasPrefix(body, "A /x") {
			return fmt.Errorf("got %d %q", code, body)
		}
		return nil
	})
	if code, body := e.admin(t, "/readyz"); code != 200 || !strings.Contains(body, "ready: fresh") {
		t.Errorf("/readyz = %d %q, want 200 fresh", code, body)
	}
	req := n.LastRequest()
	if req.Header.Get("Authorization") != "Bearer secret-token" || req.Query.Get("prefer") != "self" {
		t.Errorf("poll sent Authorization %q prefer %q", req.Header.Get("Authorization"), req.Query.Get("prefer"))
	}

	// A document change is live within two poll intervals (100ms each here;
	// the bound below leaves room for a loaded CI machine).
	doc := routesDoc(hostOf(b), hostOf(a))
	n.SetDocument(doc)
	testsupport.WaitForNil(t, 15*time.Second, "the swapped document", func() error {
		if _, body := e.get(t, "a.example", "/"); !strings.HasPrefix(body, "B ") {
			return fmt.Errorf("a.example still answered %q", body)
		}
		return nil
	})
}

func TestKeepLastGoodUnderNodeFailures(t *testing.T) {
	a, b := app(t, "A"), app(t, "B")
	n := nodetest.New(t, nodetest.Options{Token: "tok"})
	n.SetDocument(routesDoc(hostOf(a), hostOf(b)))
	e := startEdge(t, "--node", n.URL(), "--ingress-token", "tok", "--tls", "off")
	testsupport.WaitForNil(t, 15*time.Second, "first document", func() error {
		if code, _ := e.get(t, "a.example", "/"); code != 200 {
			return fmt.Errorf("status %d", code)
		}
		return nil
	})

	failures := []struct {
		name string
		fail func()
		heal func()
	}{
		{"node answers 500", func() { n.SetStatus(500) }, func() { n.SetStatus(0) }},
		{"node answers 503 draining", func() { n.SetDraining(true) }, func() { n.SetDraining(false) }},
		{"node rejects the token", func() { n.SetToken("other") }, func() { n.SetToken("tok") }},
		{"node serves garbage", func() { n.SetGarbage(true) }, func() { n.SetGarbage(false) }},
		{"node serves an invalid document", func() { n.SetBody([]byte(`{"v":2,"routes":[]}`)) }, func() { n.SetDocument(routesDoc(hostOf(a), hostOf(b))) }},
		{"node is unreachable", func() { n.Stop() }, func() {
			if err := n.Restart(); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, f := range failures {
		t.Run(f.name, func(t *testing.T) {
			before := n.Requests()
			f.fail()
			// Let a few polls fail, then check traffic is unaffected.
			testsupport.WaitForNil(t, 15*time.Second, "polls during the failure", func() error {
				if f.name != "node is unreachable" && n.Requests() < before+3 {
					return fmt.Errorf("%d polls so far", n.Requests()-before)
				}
				if f.name == "node is unreachable" && e.countLogs("") == 0 {
					return fmt.Errorf("no logs")
				}
				return nil
			})
			if code, body := e.get(t, "a.example", "/still"); code != 200 || !strings.HasPrefix(body, "A /still") {
				t.Errorf("during %s: %d %q, want the last good document served", f.name, code, body)
			}
			f.heal()
			testsupport.WaitForNil(t, 15*time.Second, "recovery", func() error {
				if code, body := e.admin(t, "/readyz"); code != 200 || strings.Contains(body, "last error") {
					return fmt.Errorf("/readyz %d %q", code, body)
				}
				return nil
			})
		})
	}
	if !e.logged("rejected the ingress token") {
		t.Errorf("a rejected token was never logged plainly:\n%s", e.logText())
	}
}

func TestRestartWithTheNodeDownServesThePersistedDocument(t *testing.T) {
	a, b := app(t, "A"), app(t, "B")
	n := nodetest.New(t, nodetest.Options{})
	n.SetDocument(routesDoc(hostOf(a), hostOf(b)))
	state := t.TempDir()
	e := startEdge(t, "--node", n.URL(), "--tls", "off", "--state-dir", state)
	testsupport.WaitForNil(t, 15*time.Second, "first document", func() error {
		if code, _ := e.get(t, "b.example", "/"); code != 200 {
			return fmt.Errorf("status %d", code)
		}
		return nil
	})
	if err := e.stop(t); err != nil {
		t.Fatalf("edge exit: %v", err)
	}
	n.Stop()

	e2 := startEdge(t, "--node", n.URL(), "--tls", "off", "--state-dir", state)
	if code, body := e2.get(t, "b.example", "/p"); code != 200 || !strings.HasPrefix(body, "B /p") {
		t.Fatalf("restarted with the node down: %d %q, want the persisted document served", code, body)
	}
	if code, body := e2.admin(t, "/readyz"); code != 200 || !strings.Contains(body, "stale") {
		t.Errorf("/readyz = %d %q, want 200 and stale", code, body)
	}
	if err := n.Restart(); err != nil {
		t.Fatal(err)
	}
	testsupport.WaitForNil(t, 15*time.Second, "fresh after the node is back", func() error {
		if _, body := e2.admin(t, "/readyz"); !strings.Contains(body, "ready: fresh") {
			return fmt.Errorf("/readyz %q", body)
		}
		return nil
	})
	// The node confirmed the very document that was persisted, so no new
	// table was built; the status page must still stop calling it stale.
	_, body := e2.admin(t, "/status.json")
	var st struct {
		Document struct{ Stale bool } `json:"document"`
		Poll     struct{ Stale bool } `json:"poll"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil || st.Document.Stale || st.Poll.Stale {
		t.Errorf("/status.json after the node confirmed the document: %+v (%v), want neither stale\n%s", st, err, body)
	}
}

func TestServingThroughTheBinary(t *testing.T) {
	a := app(t, "A")
	deadAddr := testsupport.ClosedAddr(t)
	streamGate := make(chan struct{})
	stream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		<-streamGate
		fmt.Fprint(w, "data: second\n\n")
	}))
	t.Cleanup(stream.Close)
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := sha256.New()
		n, err := io.Copy(h, r.Body)
		fmt.Fprintf(w, "%d %x %v", n, h.Sum(nil), err)
	}))
	t.Cleanup(sink.Close)

	doc := &node.Document{V: 1, Routes: []node.Route{
		{Host: "a.example", Application: "a", Upstreams: []node.Upstream{{Node: "dead", Address: deadAddr}, {Node: "n1", Address: hostOf(a)}}},
		{Host: "flip.example", Application: "flip", Upstreams: []node.Upstream{{Node: "n1", Address: hostOf(sink)}}, Paths: map[string]string{"acct": "a.example"}},
		{Host: "down.example", Application: "down", Upstreams: []node.Upstream{{Node: "dead", Address: deadAddr}}},
		{Host: "stream.example", Application: "stream", Upstreams: []node.Upstream{{Node: "n1", Address: hostOf(stream)}}},
		{Host: "sink.example", Application: "sink", Upstreams: []node.Upstream{{Node: "n1", Address: hostOf(sink)}}},
	}, API: &node.API{Hosts: []string{"apex.example"}, Upstreams: []node.Upstream{{Node: "n1", Address: hostOf(a)}}}}
	n := nodetest.New(t, nodetest.Options{})
	n.SetDocument(doc)
	e := startEdge(t, "--node", n.URL(), "--tls", "off")
	testsupport.WaitForNil(t, 15*time.Second, "first document", func() error {
		if code, _ := e.get(t, "a.example", "/"); code != 200 {
			return fmt.Errorf("status %d", code)
		}
		return nil
	})

	t.Run("failover past a closed first upstream, forwarded headers set", func(t *testing.T) {
		code, body := e.get(t, "a.example", "/f")
		if code != 200 || !strings.Contains(body, "A /f xff=127.0.0.1 proto=http fhost=a.example") {
			t.Errorf("got %d %q", code, body)
		}
	})
	t.Run("all upstreams closed is 502", func(t *testing.T) {
		if code, body := e.get(t, "down.example", "/"); code != 502 || !strings.Contains(body, "no upstream") {
			t.Errorf("got %d %q", code, body)
		}
	})
	t.Run("API apex allowed and denied", func(t *testing.T) {
		if code, _ := e.get(t, "apex.example", "/v1/apps"); code != 200 {
			t.Errorf("allowed API path: %d", code)
		}
		status, _ := rawHTTP(t, e.HTTPAddr, "GET /v1/x/../storage/objects HTTP/1.1\r\nHost: apex.example\r\n\r\n")
		if status != 403 {
			t.Errorf("denied API path: %d, want 403", status)
		}
	})
	t.Run("path routing sends the original request-URI bytes", func(t *testing.T) {
		for _, p := range []string{"/acct/x", "//acct/../y", "/%61cct/%2e%2e/z?q=%20"} {
			status, body := rawHTTP(t, e.HTTPAddr, "GET "+p+" HTTP/1.1\r\nHost: flip.example\r\n\r\n")
			if status != 200 || !strings.HasPrefix(body, "A "+p+" ") {
				t.Errorf("GET %s: %d %q, want app A to see the exact bytes", p, status, body)
			}
		}
	})
	t.Run("a streamed response arrives incrementally", func(t *testing.T) {
		req, _ := http.NewRequest("GET", "http://"+e.HTTPAddr+"/events", nil)
		req.Host = "stream.example"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		r := bufio.NewReader(resp.Body)
		line, err := r.ReadString('\n')
		if err != nil || line != "data: first\n" {
			t.Fatalf("first event before the upstream finished: %q %v", line, err)
		}
		close(streamGate)
		rest, _ := io.ReadAll(r)
		if !strings.Contains(string(rest), "data: second") {
			t.Errorf("rest of stream %q", rest)
		}
	})
	t.Run("a 20 MiB upload arrives intact", func(t *testing.T) {
		const size = 20 << 20
		body := io.LimitReader(&pattern{}, size)
		h := sha256.New()
		io.Copy(h, io.LimitReader(&pattern{}, size))
		want := fmt.Sprintf("%d %x <nil>", size, h.Sum(nil))
		req, _ := http.NewRequest("PUT", "http://"+e.HTTPAddr+"/upload", body)
		req.Host = "sink.example"
		req.ContentLength = -1 // chunked: streamed, never buffered whole
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(got) != want {
			t.Errorf("upload: %q, want %q", got, want)
		}
	})
}

func TestSIGTERMLetsInFlightRequestsFinish(t *testing.T) {
	entered := make(chan struct{})
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		io.WriteString(w, "finished")
	}))
	t.Cleanup(slow.Close)
	n := nodetest.New(t, nodetest.Options{})
	n.SetDocument(&node.Document{V: 1, Routes: []node.Route{{Host: "slow.example", Application: "slow", Upstreams: []node.Upstream{{Node: "n", Address: hostOf(slow)}}}}})
	e := startEdge(t, "--node", n.URL(), "--tls", "off", "--shutdown-timeout", "20s")
	testsupport.WaitForNil(t, 15*time.Second, "first document", func() error {
		if code, _ := e.get(t, "nobody.example", "/"); code != 404 {
			return fmt.Errorf("status %d", code)
		}
		return nil
	})
	result := make(chan string, 1)
	go func() {
		req, _ := http.NewRequest("GET", "http://"+e.HTTPAddr+"/", nil)
		req.Host = "slow.example"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			result <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		result <- string(b)
	}()
	<-entered
	e.cmd.Process.Signal(syscall.SIGTERM)
	// New connections are refused once the listeners close.
	testsupport.WaitForNil(t, 15*time.Second, "listener closed after SIGTERM", func() error {
		c, err := net.Dial("tcp", e.HTTPAddr)
		if err == nil {
			c.Close()
			return fmt.Errorf("still accepting")
		}
		return nil
	})
	close(release)
	if got := <-result; got != "finished" {
		t.Errorf("in-flight request got %q, want it to finish", got)
	}
	select {
	case <-e.done:
		if e.err != nil {
			t.Errorf("exit after SIGTERM: %v, want 0", e.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("edge did not exit after its last request finished")
	}
}

// rawHTTP sends request bytes as they are (Go's client would clean odd
// paths) and returns the status and body.
func rawHTTP(t *testing.T, addr, req string) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, req)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read response: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// pattern is an endless reader of a byte pattern that depends only on the
// offset, so two readers yield the same bytes whatever their read sizes.
type pattern struct{ off int }

func (p *pattern) Read(b []byte) (int, error) {
	for i := range b {
		b[i] = byte((p.off+i)*7 + 3)
	}
	p.off += len(b)
	return len(b), nil
}
