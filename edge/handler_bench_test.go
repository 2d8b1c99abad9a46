package edge

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/backhaul"
	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

// answering is a Forwarder that answers every request with a fixed 1 KiB
// body, so the benchmark measures the handler and its observers alone.
type answering struct{}

var (
	kib       = []byte(strings.Repeat("x", 1024))
	textPlain = []string{"text/plain"}
)

func (answering) Forward(w http.ResponseWriter, r *http.Request, ups []node.Upstream) (backhaul.Result, error) {
	w.Header()["Content-Type"] = textPlain
	w.WriteHeader(200)
	n, _ := w.Write(kib)
	return backhaul.Result{Node: ups[0].Node, Address: ups[0].Address, Status: 200, BytesOut: int64(n)}, nil
}

// nullWriter is a ResponseWriter that keeps nothing.
type nullWriter struct{ h http.Header }

func (w *nullWriter) Header() http.Header         { return w.h }
func (w *nullWriter) WriteHeader(int)             {}
func (w *nullWriter) Write(b []byte) (int, error) { return len(b), nil }

// BenchmarkHandler is one proxied request through the handler with the
// request metrics observing it, as the serve command wires them with
// --access-log=false; "access-log" adds the access log, its rate limit
// reached (the flood case) and not (every line written to a discarding
// writer).
func BenchmarkHandler(b *testing.B) {
	cases := []struct {
		name     string
		observer func(reg prometheus.Registerer) Observer
	}{
		{"metrics", func(reg prometheus.Registerer) Observer { return Observers{testsupport.Must(NewMetrics(reg))} }},
		{"metrics+access-log", func(reg prometheus.Registerer) Observer {
			return Observers{testsupport.Must(NewMetrics(reg)), testsupport.Must(NewAccessLog(zerolog.New(io.Discard), 0, reg))}
		}},
		{"metrics+access-log-limited", func(reg prometheus.Registerer) Observer {
			return Observers{testsupport.Must(NewMetrics(reg)), testsupport.Must(NewAccessLog(zerolog.New(io.Discard), 1, reg))}
		}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			live := &Live{}
			live.Store(compileTest(b))
			h := &Handler{Table: live, Forwarder: answering{}, Observer: c.observer(prometheus.NewRegistry())}
			r := httptest.NewRequest("GET", "http://shop.apps.example.com/cart?x=1", nil)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				w := &nullWriter{h: http.Header{}}
				for pb.Next() {
					clear(w.h)
					h.ServeHTTP(w, r)
				}
			})
		})
	}
}
