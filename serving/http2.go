package serving

import (
	"context"
	"crypto/tls"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/time/rate"
)

// HTTP/2 rapid reset (CVE-2023-44487): a client opens a stream and resets
// it in the next frame, in a loop. The reset frees the stream's slot at
// once, so MAX_CONCURRENT_STREAMS never holds it back, while the request
// its handler already started may still reach the upstream. Go's server
// bounds the handlers running for one connection to MAX_CONCURRENT_STREAMS
// and skips a queued handler whose stream was reset, but a handler that did
// start forwards its request: before this guard one reset stream in five
// to eight reached the upstream (638 and 681 of 5,000 on one connection in
// TestHTTP2RapidResetCostsTheOriginAFixedAmount), however many were sent.
//
// The edge advertises fewer streams (HTTP2MaxStreams), does not forward a
// request already cancelled (edge.Handler), gives each HTTP/2 connection a
// budget of requests cancelled before an answer, and closes the connection
// that overspends it, cancelling what runs on it. A rapid-reset loop then
// costs the upstreams at most ResetBurst requests counted against the
// budget plus the HTTP2MaxStreams in flight when the connection is closed,
// per connection, plus what the budget refills while the loop runs.
const (
	// HTTP2MaxStreams is the MAX_CONCURRENT_STREAMS the HTTPS listener
	// advertises, and so the number of handlers one connection may run at
	// once. 100 is the least RFC 9113 §5.1.2 recommends, what Go's client
	// assumes before it hears a server's SETTINGS, and ample for a browser
	// (nginx advertises 128); Go's server default is 250.
	HTTP2MaxStreams = 100
	// ResetBurst and ResetRefill size the budget: ResetBurst requests
	// cancelled before their answer at once, ResetRefill more a second.
	// The most a browser cancels at once is every request it has in flight
	// (leaving a page whose subresources are all still waiting on the
	// upstream), which is at most HTTP2MaxStreams; beyond that it cancels
	// an abandoned fetch, a lazy image scrolled past, a video seek: a few a
	// second. A CDN or another proxy in front of the edge multiplexes many
	// users on one connection and cancels for all of them: a second review
	// saw one cancel 35 a second, so the refill leaves it room. A rapid-
	// reset loop sends thousands a second and spends the burst within
	// about its first hundred streams.
	ResetBurst  = HTTP2MaxStreams
	ResetRefill = 100 // per second

	// e2e/hostile_test.go holds the binary to the bound these three give.
)

// ResetGuard is the per-connection budget of requests cancelled before an
// answer. Its connContext is the HTTPS server's http.Server.ConnContext and
// its canceled the edge.Handler's Canceled hook; both are safe for
// concurrent use.
type ResetGuard struct {
	burst  int
	refill rate.Limit
	log    zerolog.Logger
	// sometimes thins the log lines an attacker can cause (one a
	// connection closed); closed counts them all.
	sometimes rate.Sometimes
	closed    atomic.Int64
}

func NewResetGuard(log zerolog.Logger) *ResetGuard {
	return &ResetGuard{
		burst:     ResetBurst,
		refill:    ResetRefill,
		log:       log,
		sometimes: rate.Sometimes{First: 10, Interval: time.Minute},
	}
}

// Configure bounds srv's HTTP/2 streams per connection and gives each
// connection its budget, after srv's own ConnContext if it has one.
func (g *ResetGuard) Configure(srv *http.Server) {
	srv.HTTP2 = &http.HTTP2Config{MaxConcurrentStreams: HTTP2MaxStreams}
	if first := srv.ConnContext; first != nil {
		srv.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
			return g.connContext(first(ctx, c), c)
		}
		return
	}
	srv.ConnContext = g.connContext
}

type clientConnKey struct{}

// clientConn is what the guard keeps for one accepted connection, in the
// context every request on it derives from. Whether it speaks HTTP/2 is not
// known yet when it is made: the allocations are per connection, never per
// request.
type clientConn struct {
	conn    net.Conn
	cancel  context.CancelFunc // ends every request on the connection
	resets  *rate.Limiter
	dropped atomic.Bool
}

func (g *ResetGuard) connContext(ctx context.Context, c net.Conn) context.Context {
	ctx, cancel := context.WithCancel(ctx)
	return context.WithValue(ctx, clientConnKey{}, &clientConn{conn: c, cancel: cancel, resets: rate.NewLimiter(g.refill, g.burst)})
}

// Canceled spends one of r's connection's budget; once it is spent, every
// request on the connection is cancelled (so one the server reads after
// this is never forwarded) and the connection is closed. Only HTTP/2
// counts: an HTTP/1 client cancels by closing its connection, and HTTP/3
// connections are not the HTTPS server's.
func (g *ResetGuard) Canceled(r *http.Request) {
	if r.ProtoMajor != 2 {
		return
	}
	cc, _ := r.Context().Value(clientConnKey{}).(*clientConn)
	if cc == nil || cc.resets.Allow() || !cc.dropped.CompareAndSwap(false, true) {
		return
	}
	cc.cancel()
	// Closing the TCP connection under TLS: tls.Conn.Close would first
	// write a close_notify, which can wait seconds on a client that does
	// not read. The server's own reads and writes then fail, and it ends
	// the connection without a GOAWAY; the client reconnects, if it is
	// one that does.
	raw := cc.conn
	if tc, ok := raw.(*tls.Conn); ok {
		raw = tc.NetConn()
	}
	raw.Close()
	n := g.closed.Add(1)
	g.sometimes.Do(func() {
		g.log.Warn().Str("client", r.RemoteAddr).Int("burst", g.burst).Float64("refill_per_second", float64(g.refill)).
			Int64("closed_total", n).
			Msg("closed an HTTP/2 connection cancelling requests before their answer faster than its budget (rapid reset)")
	})
}
