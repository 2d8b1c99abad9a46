package serving

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	proxyproto "github.com/pires/go-proxyproto"
	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/admission"
	"github.com/scafo/scafo-edge/handover"
)

// WithProxyProtocol makes l read a PROXY protocol (v1 or v2) header from
// connections whose source is in from, and take the client address it
// carries; a header from any other source closes the connection, as does a
// malformed one. With from empty, l is returned as is.
//
// From a trusted source the header is optional (USE rather than REQUIRE), as
// Traefik's trustedIPs and Caddy's proxy_protocol allow do: a box-local health
// check from inside a trusted range still gets through without one.
func WithProxyProtocol(l net.Listener, from []netip.Prefix, headerTimeout time.Duration) net.Listener {
	if len(from) == 0 {
		return l
	}
	return &proxyproto.Listener{
		Listener:          l,
		ReadHeaderTimeout: headerTimeout,
		ConnPolicy: func(o proxyproto.ConnPolicyOptions) (proxyproto.Policy, error) {
			ap, err := netip.ParseAddrPort(o.Upstream.String())
			if err != nil {
				return proxyproto.REJECT, nil
			}
			for _, p := range from {
				if p.Contains(ap.Addr().Unmap()) {
					return proxyproto.USE, nil
				}
			}
			return proxyproto.REJECT, nil
		},
	}
}

// HTTP3 serves HTTP/3 on the UDP side of the HTTPS port with the
// same certificates and handler as HTTPS over TCP, on a QUIC transport of
// its own so that its stateless resets use the state directory's key
// (handover.StatelessResetKey).
type HTTP3 struct {
	srv      *http3.Server
	adm      *admission.Controller // counts QUIC connections; nil: none
	conn     net.PacketConn
	tlsConf  *tls.Config
	resetKey *quic.StatelessResetKey // nil: no stateless resets

	mu     sync.Mutex
	closed bool
	tr     *quic.Transport // set by Serve
	ln     *quic.Listener  // set by Serve
}

// NewHTTP3 binds the UDP side of httpsAddr, or takes inherited (the socket
// a previous edge handed over) when it is bound there. Nothing reads the
// socket until Serve.
func NewHTTP3(httpsAddr net.Addr, inherited net.PacketConn, resetKey *[32]byte, tlsConf *tls.Config, h http.Handler, maxHeaderBytes int, idle time.Duration, adm *admission.Controller) (*HTTP3, error) {
	conn := inherited
	if conn == nil || !handover.SameAddr(httpsAddr.String(), conn.LocalAddr()) {
		var err error
		if conn, err = net.ListenPacket("udp", httpsAddr.String()); err != nil {
			return nil, fmt.Errorf("listen udp %s for HTTP/3: %w", httpsAddr, err)
		}
	}
	h3 := &HTTP3{
		adm:     adm,
		conn:    conn,
		tlsConf: http3.ConfigureTLSConfig(tlsConf),
		srv: &http3.Server{
			Handler:        h,
			MaxHeaderBytes: maxHeaderBytes,
			IdleTimeout:    idle,
			// Alt-Svc names the port before serve has a listener.
			Port: conn.LocalAddr().(*net.UDPAddr).Port,
		},
	}
	if resetKey != nil {
		h3.resetKey = (*quic.StatelessResetKey)(resetKey)
	}
	return h3, nil
}

func (h *HTTP3) Serve() error {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.tr = &quic.Transport{Conn: h.conn, StatelessResetKey: h.resetKey}
	// Connections are handed over once their handshake is complete, not
	// early: admission counts a connection against its address's share
	// only when the handshake has proven the address (a spoofed Initial
	// would otherwise hold a share, or the budget, for the idle timeout),
	// and 0-RTT requests, which an attacker can replay, are not taken.
	ln, err := h.tr.Listen(h.tlsConf, &quic.Config{})
	h.ln = ln
	h.mu.Unlock()
	if err != nil {
		return fmt.Errorf("listen for HTTP/3 on %s: %w", h.conn.LocalAddr(), err)
	}
	err = h.srv.ServeListener(h.adm.QUICListener(ln))
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, quic.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// Shutdown stops taking new QUIC connections (their Initial packets go
// unanswered, for a successor to read), sends GOAWAY, waits for requests
// until ctx ends, then closes the connections left and stops reading.
func (h *HTTP3) Shutdown(ctx context.Context, log zerolog.Logger) {
	h.mu.Lock()
	h.closed = true
	ln, tr := h.ln, h.tr
	h.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	if err := h.srv.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		log.Warn().Err(err).Msg("HTTP/3 shutdown deadline passed; closing remaining connections")
	}
	h.srv.Close()
	if tr != nil {
		tr.Close()
	}
	h.conn.Close()
}

// Advertise sets Alt-Svc on every HTTPS response so clients learn they
// may switch to HTTP/3 on the same port.
func (h *HTTP3) Advertise(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor < 3 {
			h.srv.SetQUICHeaders(w.Header())
		}
		next.ServeHTTP(w, r)
	})
}

// WithSpreadDeadlines stretches every read deadline set on a connection of
// l (the TLS handshake's, each request's headers', each keep-alive wait's)
// by a factor drawn once per connection from [1, 1.5), so that connections
// opened together do not end together. A slowloris opens its thousands of
// connections in a burst and reopens each the moment it ends: with one
// fixed header timeout they all ended in the same second, and the edge
// spent the next seconds closing and accepting its whole flood rather than
// serving its visitors (measured in slow:19000@16: fast.test's p99 went from
// 5 ms to 15-110 ms for the three seconds of each such burst). Spread, the
// same closes come at an even rate the edge absorbs.
//
// A deadline in the past (which aborts a read at once) and the zero
// deadline (none) are passed on as they are. Every future read deadline is
// stretched, one a handler sets through http.ResponseController included
// (the edge's set none but "now"); HTTP/2 keeps its own timers, so over it
// only the TLS handshake's is.
func WithSpreadDeadlines(l net.Listener) net.Listener {
	return spreadListener{l}
}

type spreadListener struct{ net.Listener }

func (l spreadListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &spreadConn{Conn: c, stretch: 1 + rand.Float64()/2}, nil
}

// spreadConn is a connection whose read deadlines are stretched by its own
// factor.
type spreadConn struct {
	net.Conn
	stretch float64 // in [1, 1.5)
}

// NetConn returns the connection underneath, as tls.Conn's does, for the
// wrappers that look for theirs below.
func (c *spreadConn) NetConn() net.Conn { return c.Conn }

func (c *spreadConn) SetReadDeadline(t time.Time) error {
	return c.Conn.SetReadDeadline(c.spread(t, time.Now()))
}

func (c *spreadConn) SetDeadline(t time.Time) error {
	now := time.Now()
	if err := c.Conn.SetReadDeadline(c.spread(t, now)); err != nil {
		return err
	}
	return c.Conn.SetWriteDeadline(t)
}

// spread returns deadline t, set at now, stretched by c's factor. One so
// far off that stretching it would overflow is as good as none, and kept.
func (c *spreadConn) spread(t, now time.Time) time.Time {
	d := t.Sub(now)
	if t.IsZero() || d <= 0 || float64(d) >= math.MaxInt64/c.stretch {
		return t
	}
	return now.Add(time.Duration(float64(d) * c.stretch))
}

// WithSendTimeout bounds how long one write to a client may make no
// progress, as nginx's send_timeout does: a client that stops reading a
// response is disconnected after d, while a stream that keeps writing runs as
// long as it likes (a whole-response WriteTimeout would cut it). Zero d
// returns l as is.
func WithSendTimeout(l net.Listener, d time.Duration) net.Listener {
	if d <= 0 {
		return l
	}
	return sendTimeoutListener{Listener: l, d: d}
}

type sendTimeoutListener struct {
	net.Listener
	d time.Duration
}

func (l sendTimeoutListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &sendTimeoutConn{Conn: c, d: l.d}, nil
}

// sendTimeoutConn renews the write deadline before every write; between
// writes an expired deadline is never checked, so idle connections are
// untouched.
type sendTimeoutConn struct {
	net.Conn
	d time.Duration
}

// NetConn returns the connection underneath, as tls.Conn's does, for the
// wrappers that look for theirs below.
func (c *sendTimeoutConn) NetConn() net.Conn { return c.Conn }

func (c *sendTimeoutConn) Write(p []byte) (int, error) {
	c.Conn.SetWriteDeadline(time.Now().Add(c.d))
	return c.Conn.Write(p)
}

// Conn is the UDP socket HTTP/3 is served on, to hand to a successor.
func (h *HTTP3) Conn() net.PacketConn { return h.conn }
