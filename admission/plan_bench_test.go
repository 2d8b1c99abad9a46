package admission

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkMakePlan walks a registry of n connections, every one a slow
// first request (a slowloris at the budget) or every one idle, as the
// monitor and Accept do at the budget. The connections are allocated
// among other objects, as a server's are, so that the walk pays the cache
// misses it pays in the edge.
func BenchmarkMakePlan(b *testing.B) {
	for _, n := range []int{19_000, 1_000_000} {
		for _, kind := range []string{"slow", "idle"} {
			b.Run(fmt.Sprintf("%s-%d", kind, n), func(b *testing.B) {
				c, err := New(Options{Limits: testLimits(n)})
				if err != nil {
					b.Fatal(err)
				}
				e := &clientEntry{}
				since := time.Now().Add(-time.Minute).UnixNano()
				ballast := make([][]byte, 0, n)
				for i := range n {
					t := &trackedConn{c: c, client: e, shardIdx: uint8(i % connShards)}
					if kind == "idle" {
						t.state.Store(uint32(stateIdle))
					} else {
						t.state.Store(uint32(stateNew))
						t.arriving.Store(true)
					}
					t.since.Store(since + int64(i))
					c.conns.add(t, nil)
					ballast = append(ballast, make([]byte, 256)) // other objects between connections
				}
				now := time.Now()
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					c.shedMu.Lock()
					c.makePlan(now)
					c.shedMu.Unlock()
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/conn")
				_ = ballast
			})
		}
	}
}
