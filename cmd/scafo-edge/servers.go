package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/admin"
	"github.com/scafo/scafo-edge/encode"
	"github.com/scafo/scafo-edge/handover"
	"github.com/scafo/scafo-edge/serving"
)

// adminHeaderTimeout is the admin listener's header timeout at most
// (--read-header-timeout if shorter).
const adminHeaderTimeout = 10 * time.Second

// servers are the edge's listeners and the servers on them: plain HTTP,
// HTTPS (and HTTP/3 beside it) unless --tls off, and the admin listener.
type servers struct {
	tls       tlsSetup
	listeners []net.Listener // every one opened, for closing on a failed start
	all       []*http.Server // every one, for shutdown
	httpLn    net.Listener
	httpsLn   net.Listener // nil with --tls off
	adminLn   net.Listener
	httpSrv   *http.Server
	httpsSrv  *http.Server   // nil with --tls off
	h3        *serving.HTTP3 // nil unless --http3 with TLS on
	adminSrv  *http.Server
	// raw are the bound sockets themselves, offered to a successor; gate
	// stops the servers accepting on them for a handover; requests counts
	// what is in flight, tunnels included, for the drain after one.
	raw      handover.Sockets
	gate     handover.Gate
	requests handover.Requests
}

// openServers binds the listeners (or serves on the ones a previous edge
// handed over, where the flags ask for their addresses), starts certificate
// management on the bound ports and builds a server for each listener. On
// error nothing is left open. sv.tls.stop must be called once the servers
// are shut down.
func openServers(ctx context.Context, c *config, s settings, p *parts, in handover.Sockets, inheritedKeys []byte, log zerolog.Logger) (_ *servers, err error) {
	sv := &servers{}
	defer func() {
		if err != nil {
			for _, l := range sv.listeners {
				l.Close()
			}
		}
	}()
	if sv.httpLn, err = sv.listen(c.httpAddr, in.HTTP, &sv.raw.HTTP); err != nil {
		return nil, err
	}
	if c.tlsMode != "off" {
		if sv.httpsLn, err = sv.listen(c.httpsAddr, in.HTTPS, &sv.raw.HTTPS); err != nil {
			return nil, err
		}
	}
	if sv.adminLn, err = sv.listen(c.adminAddr, in.Admin, &sv.raw.Admin); err != nil {
		return nil, err
	}
	// Certificate management learns the bound ports: certmagic must not
	// open listeners of its own, and redirects name the HTTPS port.
	if sv.tls, err = setupTLS(ctx, c, s, p, portOf(sv.httpLn), portOf(sv.httpsLn), inheritedKeys, log); err != nil {
		return nil, err
	}
	p.handler.Covers = sv.tls.covers

	var handler http.Handler = p.handler
	if c.compress {
		handler = encode.Handler(handler, encode.Options{Short: p.admission.MemoryShort})
	}
	edgeHandler := sv.requests.Handler(p.metrics.InFlight(handler))
	sv.httpSrv = sv.newServer(c, p, p.handler.Screen(sv.tls.httpHandler(edgeHandler)), nil, "http", log)
	if sv.httpsLn != nil {
		httpsHandler := edgeHandler
		if c.http3 {
			if sv.h3, err = serving.NewHTTP3(sv.httpsLn.Addr(), in.HTTP3, resetKey(c.stateDir, log), sv.tls.config, edgeHandler, c.maxHeaderBytes, c.idleTimeout, p.admission); err != nil {
				sv.tls.stop()
				return nil, err
			}
			sv.raw.HTTP3 = sv.h3.Conn()
			httpsHandler = sv.h3.Advertise(edgeHandler)
		}
		sv.httpsSrv = sv.newServer(c, p, httpsHandler, sv.tls.config, "https", log)
		guard := serving.NewResetGuard(log.With().Str("component", "http2").Logger())
		guard.Configure(sv.httpsSrv)
		p.handler.Canceled = guard.Canceled
	}
	// The public listeners' layers, in their one order (serving.ClientStack).
	// On plain HTTP, admission also awaits a connection's first request
	// head outside the server until it has ended (admission/heads.go).
	stack := serving.ClientOptions{SendTimeout: c.sendTimeout, ProxyFrom: s.proxyFrom, HeaderTimeout: c.readHeaderTimeout, Gate: &sv.gate}
	stack.Admission = func(l net.Listener) net.Listener {
		return p.admission.PlainListener(l, c.readHeaderTimeout, len(s.proxyFrom) > 0)
	}
	sv.httpLn = serving.ClientStack(stack).Listener(sv.httpLn)
	if sv.httpsLn != nil {
		stack.Admission = p.admission.Listener
		sv.httpsLn = serving.ClientStack(stack).Listener(sv.httpsLn)
	}
	status := &admin.Server{Live: p.live, Source: p.source, Registry: p.reg, Proxy: p.proxy, Token: p.token,
		MetricsFrom: s.adminAllow, TrustedProxies: s.trusted,
		Certificates: sv.tls.certificates, NotRenewed: sv.tls.notRenewed, Prefetch: sv.tls.prefetch, FailedValidations: sv.tls.failedValidations, Admission: p.admission.Snapshot, Version: version, Started: time.Now()}
	// The admin listener's connections are held to a small pool of their
	// own, out of the descriptors reserved for the edge's own work: a peer
	// that may read /metrics without the token holds a few of them; any
	// other, which may only ask /healthz and /readyz without the token,
	// two, and all of those together a quarter of the pool
	// (admission/admin.go).
	sv.adminLn = sv.gate.Listener(p.admission.AdminListener(sv.adminLn, status.MayScrapeFrom))
	sv.adminSrv = sv.newServer(c, p, status.Handler(), nil, "admin", log)
	return sv, nil
}

// listen binds addr, or takes inherited when it is bound where addr asks;
// the socket is also kept in raw, to be offered to a successor.
func (sv *servers) listen(addr string, inherited net.Listener, raw *net.Listener) (net.Listener, error) {
	l := inherited
	if l == nil || !handover.SameAddr(addr, l.Addr()) {
		var err error
		if l, err = net.Listen("tcp", addr); err != nil {
			return nil, fmt.Errorf("listen %s: %w", addr, err)
		}
	}
	sv.listeners = append(sv.listeners, l)
	*raw = l
	return l, nil
}

func (sv *servers) newServer(c *config, p *parts, h http.Handler, tlsConf *tls.Config, name string, log zerolog.Logger) *http.Server {
	srv := &http.Server{
		Handler:     sv.gate.Handler(h),
		ConnContext: sv.gate.ConnContext,
		// Slowloris bounds: headers must arrive in time and within a
		// size; bodies and responses have no deadline, so uploads,
		// long polls and streams run as long as they need.
		ReadHeaderTimeout: c.readHeaderTimeout,
		IdleTimeout:       c.idleTimeout,
		MaxHeaderBytes:    c.maxHeaderBytes,
		TLSConfig:         tlsConf,
		ErrorLog:          newStdLogger(log.With().Str("component", name).Logger(), p.handshakeErrors),
		ConnState:         sv.gate.ConnState,
	}
	if name == "admin" {
		// The admin listener's connections are not in the budget's
		// registry (no shedding: they are refused past their pool's
		// shares instead), and their requests are health checks,
		// scrapes and the status page, whose heads come at once: a
		// short header timeout gives a place in the pool back soon.
		srv.ReadHeaderTimeout = min(c.readHeaderTimeout, adminHeaderTimeout)
	} else {
		srv.ConnState = serving.ConnStates(sv.gate.ConnState, p.admission.ConnState)
		srv.ConnContext = serving.ConnContexts(sv.gate.ConnContext, p.admission.ConnContext)
	}
	sv.all = append(sv.all, srv)
	return srv
}

// logStarted writes the start-up line; its addresses are the bound ones,
// which tests and operators read.
func (sv *servers) logStarted(c *config, s settings, p *parts, log zerolog.Logger) {
	ev := log.Info().Str("version", version).Str("source", p.sourceName).Str("state_dir", c.stateDir).
		Str("tls", c.tlsMode).Str("http_addr", sv.httpLn.Addr().String()).Str("admin_addr", sv.adminLn.Addr().String())
	if sv.httpsLn != nil {
		ev = ev.Str("https_addr", sv.httpsLn.Addr().String())
	}
	if sv.h3 != nil {
		ev = ev.Str("http3_addr", sv.h3.Conn().LocalAddr().String())
	}
	if len(s.proxyFrom) > 0 {
		ev = ev.Str("proxy_protocol_from", c.proxyProtocol)
	}
	ev.Str("admin_allow", c.adminAllow).Bool("token_set", p.token != "").Msg("scafo-edge started")
}

// start serves every listener, HTTP/3 once h3Ready is closed (the edge it
// replaces no longer reads the socket); the channel receives the first
// listener that fails.
func (sv *servers) start(h3Ready <-chan struct{}) <-chan error {
	errc := make(chan error, 4)
	if sv.h3 != nil {
		go func() {
			<-h3Ready
			errc <- sv.h3.Serve()
		}()
	}
	go func() { errc <- serveOn(sv.httpSrv, sv.httpLn, false) }()
	if sv.httpsSrv != nil {
		go func() { errc <- serveOn(sv.httpsSrv, sv.httpsLn, true) }()
	}
	go func() { errc <- serveOn(sv.adminSrv, sv.adminLn, false) }()
	return errc
}

// portOf returns the TCP port a listener is bound to, 0 for none.
func portOf(l net.Listener) int {
	if l == nil {
		return 0
	}
	if a, ok := l.Addr().(*net.TCPAddr); ok {
		return a.Port
	}
	return 0
}
