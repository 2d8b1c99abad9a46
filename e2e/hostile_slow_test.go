package e2e

// Hostile clients that go slowly: slowloris headers, slow TLS handshakes
// and readers that stop reading, against the real binary on loopback. Each
// test logs its figures in a "figures:" line.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
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
