package e2e

// Hostile HTTP/2: requests that would smuggle when downgraded to HTTP/1.1,
// frame floods, rapid reset and a client that cancels a full window, each
// against the real binary on loopback.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
	"github.com/scafo/scafo-edge/serving"
)

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
