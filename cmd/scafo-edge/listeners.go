package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"time"

	proxyproto "github.com/pires/go-proxyproto"
	"github.com/quic-go/quic-go/http3"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/handover"
)

// withProxyProtocol makes l read a PROXY protocol (v1 or v2) header from
// connections whose source is in from, and take the client address it
// carries; a header from any other source closes the connection, as does a
// malformed one. With from empty, l is returned as is.
//
// From a trusted source the header is optional (USE rather than REQUIRE), as
// Traefik's trustedIPs and Caddy's proxy_protocol allow do: a box-local health
// check from inside a trusted range still gets through without one.
func withProxyProtocol(l net.Listener, from []netip.Prefix, headerTimeout time.Duration) net.Listener {
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

// http3Listener serves HTTP/3 on the UDP side of the HTTPS port with the
// same certificates and handler as HTTPS over TCP.
type http3Listener struct {
	srv  *http3.Server
	conn net.PacketConn
}

// newHTTP3 binds the UDP side of httpsAddr, or takes inherited (the socket
// a previous edge handed over) when it is bound there.
func newHTTP3(httpsAddr net.Addr, inherited net.PacketConn, tlsConf *tls.Config, h http.Handler, maxHeaderBytes int, idle time.Duration) (*http3Listener, error) {
	conn := inherited
	if conn == nil || !handover.SameAddr(httpsAddr.String(), conn.LocalAddr()) {
		var err error
		if conn, err = net.ListenPacket("udp", httpsAddr.String()); err != nil {
			return nil, fmt.Errorf("listen udp %s for HTTP/3: %w", httpsAddr, err)
		}
	}
	return &http3Listener{
		conn: conn,
		srv: &http3.Server{
			TLSConfig:      http3.ConfigureTLSConfig(tlsConf),
			Handler:        h,
			MaxHeaderBytes: maxHeaderBytes,
			IdleTimeout:    idle,
		},
	}, nil
}

func (h *http3Listener) serve() error {
	err := h.srv.Serve(h.conn)
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

func (h *http3Listener) shutdown(ctx context.Context, log zerolog.Logger) {
	if err := h.srv.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		log.Warn().Err(err).Msg("HTTP/3 shutdown deadline passed; closing remaining connections")
	}
	h.srv.Close()
	h.conn.Close()
}

// advertiseHTTP3 sets Alt-Svc on every HTTPS response so clients learn they
// may switch to HTTP/3 on the same port.
func (h *http3Listener) advertiseHTTP3(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor < 3 {
			h.srv.SetQUICHeaders(w.Header())
		}
		next.ServeHTTP(w, r)
	})
}

// withSendTimeout bounds how long one write to a client may make no
// progress, as nginx's send_timeout does: a client that stops reading a
// response is disconnected after d, while a stream that keeps writing runs as
// long as it likes (a whole-response WriteTimeout would cut it). Zero d
// returns l as is.
func withSendTimeout(l net.Listener, d time.Duration) net.Listener {
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

func (c *sendTimeoutConn) Write(p []byte) (int, error) {
	c.Conn.SetWriteDeadline(time.Now().Add(c.d))
	return c.Conn.Write(p)
}
