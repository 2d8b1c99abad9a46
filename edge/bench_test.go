package edge

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/scafo/scafo-edge/node"
)

func BenchmarkResolve(b *testing.B) {
	tbl := compileTest(b)
	cases := []struct{ name, host, path string }{
		{"exact", "shop.apps.example.com", "/cart"},
		{"wildcard", "other.tito.page", "/"},
		{"path-hit", "ti.to", "/paulca/awesomeconf"},
		{"path-miss", "ti.to", "/carol/x"},
		{"api-allowed", "apps.example.com", "/v1/apps"},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				tbl.Resolve(c.host, c.path, c.path)
			}
		})
	}
}

// bigDocument is the largest fleet the table is sized for: 100,000 routes, one of which
// carries 10,000 prefixes.
func bigDocument() *node.Document {
	doc := &node.Document{V: 1, Routes: make([]node.Route, 0, 100000)}
	paths := make(map[string]string, MaxPathsPerRoute)
	for i := range MaxPathsPerRoute {
		paths[fmt.Sprintf("account%05d", i)] = fmt.Sprintf("app%06d.apps.example.com", i%1000+1)
	}
	for i := range 100000 {
		r := node.Route{
			Host:        fmt.Sprintf("app%06d.apps.example.com", i),
			Application: fmt.Sprintf("app%06d", i),
			Upstreams: []node.Upstream{
				{Node: "vps-a", Address: fmt.Sprintf("10.83.0.1:%d", 20000+i%40000)},
				{Node: "vps-b", Address: fmt.Sprintf("10.83.0.2:%d", 20000+i%40000)},
			},
		}
		if i == 0 {
			r.Paths = paths
		}
		doc.Routes = append(doc.Routes, r)
	}
	return doc
}

func BenchmarkCompile100k(b *testing.B) {
	doc := bigDocument()
	b.ReportAllocs()
	var ms runtime.MemStats
	var tbl *Table
	for b.Loop() {
		runtime.GC()
		runtime.ReadMemStats(&ms)
		before := ms.HeapAlloc
		tbl, _ = Compile(doc)
		runtime.ReadMemStats(&ms)
		b.ReportMetric(float64(ms.HeapAlloc-before)/(1<<20), "heapMiB")
	}
	if tbl.PrefixCount() != MaxPathsPerRoute {
		b.Fatalf("PrefixCount = %d", tbl.PrefixCount())
	}
}
