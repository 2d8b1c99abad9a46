package node_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/scafo/scafo-edge/node"
)

// bigBody renders a fleet of n routes with two upstreams each: the size a
// large installation's node serves every poll.
func bigBody(b *testing.B, n int) []byte {
	d := &node.Document{V: 1, Routes: make([]node.Route, 0, n)}
	for i := range n {
		d.Routes = append(d.Routes, node.Route{
			Host:        fmt.Sprintf("app-%d.apps.example.com", i),
			Application: fmt.Sprintf("app-%d", i),
			Upstreams: []node.Upstream{
				{Node: "vps-a", Address: fmt.Sprintf("10.83.0.1:%d", 20000+i%40000)},
				{Node: "vps-b", Address: fmt.Sprintf("10.83.0.2:%d", 20000+i%40000)},
			},
		})
	}
	body, err := json.Marshal(d)
	if err != nil {
		b.Fatal(err)
	}
	return body
}

// BenchmarkParse100k is what a changed document costs the poller.
func BenchmarkParse100k(b *testing.B) {
	body := bigBody(b, 100_000)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := node.Parse(body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFingerprint100k is what an unchanged document costs the poller
// (a 200 without ETag support; a 304 costs nothing).
func BenchmarkFingerprint100k(b *testing.B) {
	body := bigBody(b, 100_000)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		node.Fingerprint(body)
	}
}
