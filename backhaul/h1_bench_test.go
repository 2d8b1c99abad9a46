package backhaul

import (
	"context"
	"net/http"
	"testing"

	"github.com/scafo/scafo-edge/node"
)

// BenchmarkForwardServerContext is BenchmarkForward with a cancelable
// request context, as net/http's server hands every request: what watching
// for the client's leaving costs shows here, not with context.Background.
func BenchmarkForwardServerContext(b *testing.B) {
	ups := []node.Upstream{benchUpstream(b)}
	p := New(Options{})
	b.Cleanup(p.Close)
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
