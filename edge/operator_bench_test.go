package edge

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/scafo/scafo-edge/node"
)

// BenchmarkHandlerWithOperatorRoutes serves a node route through tables
// with no operator file, and with one of 1,000 routes (a tenth behind an
// allow list): a request to a node route costs the same (issue 45).
func BenchmarkHandlerWithOperatorRoutes(b *testing.B) {
	op := &node.OperatorDocument{V: 1}
	for i := range 1000 {
		r := node.OperatorRoute{Host: fmt.Sprintf("tool%04d.ops.example", i),
			Upstreams: []node.Upstream{{Node: "n", Address: "127.0.0.1:9"}}}
		if i%10 == 0 {
			r.Allow = []string{"10.0.0.0/8"}
		}
		op.Routes = append(op.Routes, r)
	}
	for _, c := range []struct {
		name string
		op   *node.OperatorDocument
	}{{"no-operator-file", nil}, {"1000-operator-routes", op}} {
		b.Run(c.name, func(b *testing.B) {
			tbl, _, _ := CompileWith(testDocument(), c.op)
			live := &Live{}
			live.Store(tbl)
			h := &Handler{Table: live, Forwarder: answering{}}
			for _, host := range []string{"shop.apps.example.com", "tool0001.ops.example"} {
				b.Run(host, func(b *testing.B) {
					r := httptest.NewRequest("GET", "http://"+host+"/cart", nil)
					w := &nullWriter{h: http.Header{}}
					b.ReportAllocs()
					for b.Loop() {
						clear(w.h)
						h.ServeHTTP(w, r)
					}
				})
			}
		})
	}
}
