// Package backhaul owns the leg from the edge to an upstream: connection
// pools, failover down an upstream priority list, passive ejection of
// upstreams that cannot be connected, forwarded headers, streaming in both
// directions, protocol upgrades (WebSocket) and the response-header timeout.
//
// It knows nothing about routing: Forward is handed a request and an ordered
// list of upstreams, and answers with the first one that can be connected.
// When no upstream produced a response it writes nothing and returns
// ErrNoUpstream or ErrUpstreamTimeout, so the caller answers 502 or 504 in its
// own words.
//
// The proxy is written here on top of http.Transport rather than with
// httputil.ReverseProxy because ReverseProxy cannot meet the contract:
//   - it re-encodes the request target from the parsed URL, so the upstream
//     would not receive the original request-URI bytes (docs/design.md rule 4:
//     "//a/../b" and "/%2e%2e/x" must arrive byte-identical);
//   - it has a single Transport round trip per request, with no way to tell a
//     connect failure (safe to retry for every method) from a failure after
//     connecting other than in a custom Transport, and it closes the request
//     body on the failed attempt;
//   - it writes a 502 itself (or via ErrorHandler) and panics with
//     http.ErrAbortHandler, where the edge wants to answer with its own text
//     and keep its access log;
//   - it clones the whole request (headers included) on every call, which
//     costs allocations on the hot path.
//
// Every request but upgrades, CONNECT, requests with trailers and those
// that expect 100-continue does not take http.Transport but a small
// HTTP/1.1 client of the package's own (h1.go, internal/h1) that works on
// the handler's goroutine over pooled keep-alive connections, without the
// transport's per-request goroutine handoffs; a request body is
// read whole first up to 64 KiB and streamed beyond, written beside the
// read of the response so that an early answer is relayed. The transport
// takes the rest, on a new connection each time: it reuses a connection
// before its read loop has looked for bytes left after the previous
// response (golang/go#31259).
//
// What either path guarantees about the upstream leg (each rule is a case
// of TestHostileOrigins, on both paths):
//   - A pooled connection is reused only when the previous response ended
//     exactly at its framing and nothing unasked arrived after it: it is
//     checked at reuse whatever the idle time, and bytes that arrive after
//     a response close the connection; they are never read as the next
//     response. A response that declared a body it does not carry (HEAD,
//     204, 304 with a length or chunked) is not followed by another on its
//     connection. What no HTTP/1.1 client can tell apart remains: bytes an
//     upstream sends after the check, once the next request is written,
//     are that request's answer as far as the wire says (an upstream that
//     answers without reading a request's body, then takes the body for a
//     request, can be made to answer out of turn this way; net/http's
//     client and nginx read the wire the same).
//   - A request is sent again on another connection only when provably
//     none of its bytes were written, or, for idempotent requests only,
//     when the connection failed before any response byte and no timeout
//     fired; with a body, only if the body can be sent again whole. A
//     response-header timeout is final (504); it counts from the request's
//     last byte.
//   - An upstream's early answer to an upload is relayed to the client and
//     the upload is not sent again.
//   - A write to an upstream that makes no progress for SendTimeout fails
//     the attempt. A client that leaves ends it at once over HTTP/2 and
//     HTTP/3, and over HTTP/1 once the server notices (it reads a client's
//     connection only after its request body), within SendTimeout when an
//     upstream has stopped reading an upload.
//   - Framing is at least as strict as net/http's (FuzzResponseFraming):
//     Content-Length is digits only and repeated identical values pass on
//     as one; Transfer-Encoding on an HTTP/1.0 response, or beside a
//     Content-Length, closes the connection after the response; trailers
//     never carry framing, routing or hop-by-hop fields.
//   - Request header names that alias a forwarding, framing or hop-by-hop
//     header once '_' or '.' is read as '-' (X_Forwarded_For, X-Real_Ip,
//     X.Forwarded.For) are dropped, from headers and from trailers.
package backhaul

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/backhaul/internal/h1"
	"github.com/scafo/scafo-edge/internal/clock"
)

// Options configures a Proxy. The zero value is usable.
type Options struct {
	// DialTimeout bounds connecting to one upstream; a dial that takes longer
	// is a connect failure and the next upstream is tried. Zero means 3s.
	DialTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for an upstream's response
	// headers once the request (body included) has been written. When it
	// fires Forward returns ErrUpstreamTimeout (the edge answers 504). Zero
	// means no limit, so long polls and streams work.
	ResponseHeaderTimeout time.Duration
	// SendTimeout bounds how long one write to an upstream may make no
	// progress: an upstream that stops reading a request (an upload) for
	// this long fails the attempt, with ErrUpstreamTimeout when nothing
	// was written to the client yet. A client that leaves ends the
	// attempt at once. Zero means 60s; negative means no bound.
	SendTimeout time.Duration
	// MaxIdleConnsPerHost is the number of idle keep-alive connections kept
	// per upstream address. Zero means 256, sized for a proxy rather than
	// Go's default of 2, which would close and redial under any load.
	MaxIdleConnsPerHost int
	// IdleConnTimeout closes a pooled connection idle this long. Zero means
	// 90s.
	IdleConnTimeout time.Duration
	// TrustedProxies lists the client networks whose inbound X-Forwarded-*
	// headers are kept (X-Forwarded-For is appended to). Every other
	// client's X-Forwarded-*, Forwarded and X-Real-Ip headers are replaced.
	// Nil trusts no one.
	TrustedProxies []netip.Prefix
	// EjectBase is how long an upstream is skipped after its first connect
	// failure; each further consecutive failure doubles it, up to EjectMax.
	// Zero means 1s and 30s respectively.
	EjectBase, EjectMax time.Duration
	// Clock is the clock for ejection. Nil means the wall clock.
	Clock clock.Clock
	// Log receives ejections and recoveries, each once per episode. The zero
	// value logs nothing.
	Log zerolog.Logger
	// CountDial, if non-nil, makes every connection to an upstream with
	// the dial it is given, or refuses to (an error wrapping EMFILE: the
	// edge's budget is spent, and the upstream is not blamed), and sees
	// it closed: the edge counts them against its connection budget. The
	// connection it returns must close the one dial made.
	CountDial func(dial func() (net.Conn, error)) (net.Conn, error)
	// Registerer receives the package's metrics. Nil means no metrics. One
	// Proxy per registry: New fails for a second.
	Registerer prometheus.Registerer
}

// Proxy forwards requests to upstreams. It is safe for concurrent use; its
// zero value is not usable, call New.
type Proxy struct {
	transport *http.Transport
	pool      *h1.Pool // the pooled HTTP/1.1 client's connections (h1.go)
	trusted   []netip.Prefix
	clock     clock.Clock
	log       zerolog.Logger
	health    health
	metrics   *metrics
	// responseHeaderTimeout is Options.ResponseHeaderTimeout, for the
	// pooled client; zero means none.
	responseHeaderTimeout time.Duration
	// h1Off sends every request through the transport, so that tests can
	// hold both paths to the same behaviour.
	h1Off bool
}

// Defaults for the zero values of Options.
const (
	defaultDialTimeout     = 3 * time.Second
	defaultIdlePerHost     = 256
	defaultIdleConnTimeout = 90 * time.Second
	defaultSendTimeout     = 60 * time.Second
	defaultEjectBase       = time.Second
	defaultEjectMax        = 30 * time.Second
)

// New returns a Proxy configured by opts, or the error registering its
// metrics on opts.Registerer.
func New(opts Options) (*Proxy, error) {
	if opts.DialTimeout <= 0 {
		opts.DialTimeout = defaultDialTimeout
	}
	if opts.MaxIdleConnsPerHost <= 0 {
		opts.MaxIdleConnsPerHost = defaultIdlePerHost
	}
	if opts.IdleConnTimeout <= 0 {
		opts.IdleConnTimeout = defaultIdleConnTimeout
	}
	if opts.SendTimeout == 0 {
		opts.SendTimeout = defaultSendTimeout
	}
	if opts.EjectBase <= 0 {
		opts.EjectBase = defaultEjectBase
	}
	if opts.EjectMax <= 0 {
		opts.EjectMax = defaultEjectMax
	}
	if opts.EjectMax < opts.EjectBase {
		opts.EjectMax = opts.EjectBase
	}
	p := &Proxy{
		transport:             newTransport(opts),
		pool:                  h1.NewPool(opts.DialTimeout, opts.IdleConnTimeout, opts.SendTimeout, opts.MaxIdleConnsPerHost, opts.CountDial),
		trusted:               opts.TrustedProxies,
		clock:                 clock.OrReal(opts.Clock),
		log:                   opts.Log,
		responseHeaderTimeout: opts.ResponseHeaderTimeout,
	}
	p.health.init(opts.EjectBase, opts.EjectMax)
	var err error
	if p.metrics, err = newMetrics(opts.Registerer, p); err != nil {
		return nil, err
	}
	return p, nil
}

// Close closes the idle pooled connections. In-flight requests and upgraded
// connections are left to finish; the Proxy stays usable.
func (p *Proxy) Close() {
	p.transport.CloseIdleConnections()
	p.pool.CloseIdle(0)
}

// CloseIdle closes the pooled connections idle for at least idleFor (0:
// every one), to give their descriptors back under pressure.
func (p *Proxy) CloseIdle(idleFor time.Duration) {
	p.pool.CloseIdle(idleFor)
}

// newTransport builds the one http.Transport every upstream shares; it keeps
// a separate pool per address.
func newTransport(opts Options) *http.Transport {
	d := &net.Dialer{Timeout: opts.DialTimeout, KeepAlive: 30 * time.Second}
	return &http.Transport{
		// Upstreams are named by address in the routing document; a proxy
		// from the environment would silently reroute the fleet's traffic.
		Proxy:       nil,
		DialContext: dialProgress(d, opts.SendTimeout, opts.CountDial),
		// One connection per request: the transport hands an idle
		// connection to the next request before its read loop has seen
		// bytes an upstream sent after the previous response (golang/go
		// #31259), so a misbehaving upstream could give one client
		// another's answer. Keep-alive reuse is the pooled
		// client's, which checks every connection before reuse. With
		// Connection: close sent, the upstream closes first and keeps
		// the TIME_WAIT, not the edge.
		DisableKeepAlives:     true,
		ResponseHeaderTimeout: opts.ResponseHeaderTimeout,
		// The client's Accept-Encoding is forwarded as sent; the transport
		// must neither add gzip nor decode the body it passes through.
		DisableCompression: true,
		// Upstreams are plain HTTP/1.1; an empty map keeps the transport
		// from ever negotiating HTTP/2.
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{},
		// An upstream's headers are held in memory whole; Go's default
		// allows 10 MiB per response.
		MaxResponseHeaderBytes: h1.MaxHeaderBytes,
		// Large enough for typical response headers and small bodies in
		// one read, without the 64 KiB per connection the copy buffers use.
		WriteBufferSize: 16 << 10,
		ReadBufferSize:  16 << 10,
	}
}

// connectError reports that a connection to an upstream could not be
// established. Nothing was sent, so trying the next upstream is safe for
// every method. It is told apart from failures after connecting with
// errors.As, never by the message.
type connectError struct {
	addr string
	err  error
}

func (e *connectError) Error() string { return fmt.Sprintf("connect %s: %v", e.addr, e.err) }
func (e *connectError) Unwrap() error { return e.err }

// isConnectError reports whether err is a failure to connect.
func isConnectError(err error) bool {
	var ce *connectError
	return errors.As(err, &ce)
}
