package backhaul

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/scafo/scafo-edge/node"
)

// discardWriter is a ResponseWriter that keeps nothing, so the benchmark
// measures Forward and the transport, not a recorder.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(int)             {}
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }

var benchBody = strings.Repeat("x", 1024)

func benchUpstream(b *testing.B) node.Upstream {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", "1024")
		io.WriteString(w, benchBody)
	}))
	b.Cleanup(srv.Close)
	return node.Upstream{Node: "a", Address: srv.Listener.Addr().String()}
}

func benchRequest() *http.Request {
	r := httptest.NewRequest("GET", "/app/page?id=42", nil)
	r.Host = "app.example"
	r.Header.Set("User-Agent", "bench/1.0")
	r.Header.Set("Accept", "*/*")
	r.Header.Set("Accept-Encoding", "gzip")
	return r
}

// BenchmarkForward is one proxied GET of a 1 KiB body on loopback, the
// upstream's allocations included (it runs in this process). Compare with
// BenchmarkRoundTripDirect for the cost Forward adds to the transport.
func BenchmarkForward(b *testing.B) {
	benchForward(b, newProxy(b, Options{}))
}

// BenchmarkForwardTransport is BenchmarkForward over the transport, the
// path upgrades, trailers and 100-continue take.
func BenchmarkForwardTransport(b *testing.B) {
	p := newProxy(b, Options{})
	p.h1Off = true
	benchForward(b, p)
}

// benchForward measures p forwarding a GET of 1 KiB.
func benchForward(b *testing.B, p *Proxy) {
	ups := []node.Upstream{benchUpstream(b)}
	r := benchRequest()
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		clear(w.h)
		if _, err := p.Forward(w, r, ups); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkForwardParallel is BenchmarkForward from GOMAXPROCS goroutines,
// where the shared health map and the pool are contended.
func BenchmarkForwardParallel(b *testing.B) {
	ups := []node.Upstream{benchUpstream(b)}
	p := newProxy(b, Options{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		r := benchRequest()
		w := &discardWriter{h: http.Header{}}
		for pb.Next() {
			clear(w.h)
			if _, err := p.Forward(w, r, ups); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkRoundTripDirect is the floor: the same transport sending the
// same request and reading the body, without Forward.
func BenchmarkRoundTripDirect(b *testing.B) {
	up := benchUpstream(b)
	tr := newTransport(Options{DialTimeout: defaultDialTimeout, MaxIdleConnsPerHost: defaultIdlePerHost, IdleConnTimeout: defaultIdleConnTimeout})
	b.Cleanup(tr.CloseIdleConnections)
	req, _ := http.NewRequest("GET", "http://"+up.Address+"/app/page?id=42", nil)
	req.Host = "app.example"
	req.Header = benchRequest().Header
	buf := make([]byte, copyBufSize)
	b.ReportAllocs()
	for b.Loop() {
		resp, err := tr.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		io.CopyBuffer(io.Discard, readerOnly{resp.Body}, buf)
		resp.Body.Close()
	}
}
