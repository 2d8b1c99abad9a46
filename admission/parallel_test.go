package admission

import (
	"fmt"
	"net"
	"net/http"
	"runtime"
	"sync/atomic"
	"testing"
)

// BenchmarkRequestPathParallel is the admission work of one keep-alive
// request, from every core at once: its connection turns active, the
// request is admitted and released, the connection turns idle. It uses the
// package's exported API only, so that it runs unchanged against an older
// tree. Run it with -cpu 1,2,4,8,16: on a machine with as many cores, ns/op
// that does not grow with -cpu says the path shares no lock.
func BenchmarkRequestPathParallel(b *testing.B) {
	cases := []struct {
		name        string
		addrs, apps int
	}{
		{"250 addresses, 4 applications", 250, 4},
		{"one address, one application", 1, 1},
	}
	for _, tt := range cases {
		b.Run(tt.name, func(b *testing.B) {
			c := newController(b, Options{Limits: testLimits(100000)})
			ln := listen(b)
			accepted := acceptLoop(b, c.Listener(ln))
			// One connection for each goroutine RunParallel starts.
			procs := runtime.GOMAXPROCS(0)
			conns := make([]net.Conn, procs)
			for i := range conns {
				dialFrom(b, "127.0.0.1", ln.Addr().String())
				select {
				case conns[i] = <-accepted:
				case <-b.Context().Done():
					b.Fatal("not accepted")
				}
				c.ConnState(conns[i], http.StateNew)
			}
			var next atomic.Int64
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := int(next.Add(1) - 1)
				conn := conns[i%len(conns)]
				r := request(fmt.Sprintf("192.0.2.%d:1", i%tt.addrs+1))
				app := fmt.Sprintf("app%d", i%tt.apps)
				for pb.Next() {
					c.ConnState(conn, http.StateActive)
					k, why := c.Admit(r, app)
					if why != Admitted {
						b.Error(why)
						return
					}
					k.Release()
					c.ConnState(conn, http.StateIdle)
				}
			})
		})
	}
}
