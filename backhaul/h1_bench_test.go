package backhaul

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/scafo/scafo-edge/node"
)

// BenchmarkForwardServerContext is BenchmarkForward with a cancelable
// request context, as net/http's server hands every request: what watching
// for the client's leaving costs shows here, not with context.Background.
func BenchmarkForwardServerContext(b *testing.B) {
	ups := []node.Upstream{benchUpstream(b)}
	p := newProxy(b, Options{})
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		ctx, cancel := context.WithCancel(context.Background())
		r := benchRequest().WithContext(ctx)
		clear(w.h)
		if _, err := p.Forward(w, r, ups); err != nil {
			b.Fatal(err)
		}
		cancel()
	}
}

// BenchmarkForwardHTTP2Request is BenchmarkForward for a GET as net/http's
// HTTP/2 server hands it over: a non-nil body that is empty, a zero length.
func BenchmarkForwardHTTP2Request(b *testing.B) {
	ups := []node.Upstream{benchUpstream(b)}
	p := newProxy(b, Options{})
	r := benchRequest()
	r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/2.0", 2, 0
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		r.Body, r.ContentLength = io.NopCloser(strings.NewReader("")), 0
		clear(w.h)
		if _, err := p.Forward(w, r, ups); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkForward1MiB is one proxied GET of a 1 MiB body, the copy's
// buffer size being what it measures (the upstream runs in process).
func BenchmarkForward1MiB(b *testing.B) {
	body := strings.Repeat("x", 1<<20)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		io.WriteString(w, body)
	}))
	b.Cleanup(srv.Close)
	ups := []node.Upstream{{Node: "a", Address: srv.Listener.Addr().String()}}
	p := newProxy(b, Options{})
	r := benchRequest()
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		clear(w.h)
		if res, err := p.Forward(w, r, ups); err != nil || res.BytesOut != int64(len(body)) {
			b.Fatal(res, err)
		}
	}
}

// BenchmarkForwardPOST is one proxied POST of a small JSON body, an API
// call's shape, answered with 1 KiB.
func BenchmarkForwardPOST(b *testing.B) {
	ups := []node.Upstream{benchUpstream(b)}
	p := newProxy(b, Options{})
	payload := `{"name":"` + strings.Repeat("x", 236) + `"}` // 256 bytes
	r := benchRequest()
	r.Method = http.MethodPost
	r.Header.Set("Content-Type", "application/json")
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		r.Body, r.ContentLength = io.NopCloser(strings.NewReader(payload)), int64(len(payload))
		clear(w.h)
		if _, err := p.Forward(w, r, ups); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWriteRequest is the pooled client writing a request's head: the
// forwarding-header policy and the writer, without a connection. It must
// stay at 0 allocs/op, trusted proxy or not.
func BenchmarkWriteRequest(b *testing.B) {
	for _, bc := range []struct {
		name    string
		trusted []netip.Prefix
	}{
		{"untrusted client", nil},
		{"trusted proxy", []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			p := newProxy(b, Options{TrustedProxies: bc.trusted})
			r := benchRequest()
			r.Header.Set("X-Forwarded-For", "203.0.113.9")
			r.Header.Set("X-Forwarded-Proto", "https")
			bw := bufio.NewWriter(io.Discard)
			b.ReportAllocs()
			for b.Loop() {
				if err := p.writeRequest(bw, r, p.forwardingFor(r), "upstream:80", nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
