package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/admin"
	"github.com/scafo/scafo-edge/backhaul"
	"github.com/scafo/scafo-edge/edge"
	"github.com/scafo/scafo-edge/node"
)

func serveCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c config
	fs := serveFlags(&c)
	fs.SetOutput(stderr)
	if err := fs.parse(args, getenv); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	log, err := newLogger(c.logLevel, c.logFormat, stdout)
	if err != nil {
		return err
	}
	return serve(ctx, &c, log)
}

func newLogger(level, format string, w io.Writer) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return zerolog.Logger{}, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	switch format {
	case "json":
	case "console":
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.RFC3339}
	default:
		return zerolog.Logger{}, fmt.Errorf("--log-format %q: want json or console", format)
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}

// serve runs the edge until ctx ends, then shuts down gracefully.
func serve(ctx context.Context, c *config, log zerolog.Logger) error {
	trusted, err := parseCIDRs(c.trustedProxies)
	if err != nil {
		return fmt.Errorf("--trusted-proxies: %w", err)
	}
	proxyFrom, err := parseCIDRs(c.proxyProtocol)
	if err != nil {
		return fmt.Errorf("--proxy-protocol-from: %w", err)
	}
	token, warnings, err := node.LoadToken(c.token, c.tokenFile)
	if err != nil {
		return err
	}
	for _, w := range warnings {
		log.Warn().Str("file", c.tokenFile).Msg(w)
	}
	switch c.tlsMode {
	case "acme", "internal", "off":
	default:
		return fmt.Errorf("--tls %q: want acme, internal or off", c.tlsMode)
	}

	db, err := node.OpenState(c.stateDir, log)
	if err != nil {
		return err
	}
	defer db.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "scafo_edge_build_info", Help: "Always 1; the version label names the build.",
	}, []string{"version"})
	buildInfo.WithLabelValues(version).Set(1)
	reg.MustRegister(buildInfo)

	live := &edge.Live{}
	updater := edge.NewUpdater(live, log.With().Str("component", "routing").Logger(), reg)
	seed, err := node.LoadDocument(db)
	if err != nil {
		log.Warn().Err(err).Msg("persisted routing document unreadable; waiting for the source")
		seed = nil
	}
	if seed != nil {
		updater.Apply(*seed)
		log.Warn().Str("fingerprint", seed.Fingerprint).Time("fetched_at", seed.FetchedAt).
			Msg("serving the persisted routing document, marked stale, until the source answers")
	}

	source, sourceName, err := newSource(c, token, log, reg)
	if err != nil {
		return err
	}

	proxy := backhaul.New(backhaul.Options{
		DialTimeout:           c.dialTimeout,
		ResponseHeaderTimeout: c.responseTimeout,
		SendTimeout:           upstreamSendTimeout(c.sendTimeout),
		TrustedProxies:        trusted,
		Log:                   log.With().Str("component", "backhaul").Logger(),
		Registerer:            reg,
	})
	defer proxy.Close()

	metrics := edge.NewMetrics(reg)
	observers := edge.Observers{metrics}
	if c.accessLog {
		observers = append(observers, edge.NewAccessLog(log.With().Str("component", "access").Logger(), c.accessLogRate, reg))
	}
	handler := &edge.Handler{Table: live, Forwarder: proxy, Observer: observers}

	var servers []*http.Server
	var listeners []net.Listener
	closeAll := func() {
		for _, l := range listeners {
			l.Close()
		}
	}
	listen := func(addr string) (net.Listener, error) {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("listen %s: %w", addr, err)
		}
		listeners = append(listeners, l)
		return l, nil
	}
	handshakeErrors := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "scafo_edge_tls_handshake_errors_total",
		Help: "TLS handshakes that failed before a request: no certificate for the name, protocol errors, clients giving up.",
	})
	reg.MustRegister(handshakeErrors)
	newServer := func(h http.Handler, tlsConf *tls.Config, name string) *http.Server {
		srv := &http.Server{
			Handler: h,
			// Slowloris bounds: headers must arrive in time and within a
			// size; bodies and responses have no deadline, so uploads,
			// long polls and streams run as long as they need.
			ReadHeaderTimeout: c.readHeaderTimout,
			IdleTimeout:       c.idleTimeout,
			MaxHeaderBytes:    c.maxHeaderBytes,
			TLSConfig:         tlsConf,
			ErrorLog:          newStdLogger(log.With().Str("component", name).Logger(), handshakeErrors),
		}
		servers = append(servers, srv)
		return srv
	}

	httpLn, err := listen(c.httpAddr)
	if err != nil {
		return err
	}
	var httpsLn net.Listener
	if c.tlsMode != "off" {
		if httpsLn, err = listen(c.httpsAddr); err != nil {
			return err
		}
	}
	adminLn, err := listen(c.adminAddr)
	if err != nil {
		return err
	}
	// Certificate management learns the bound ports: certmagic must not
	// open listeners of its own, and redirects name the HTTPS port.
	tlsSetup, err := setupTLS(ctx, c, db, live, token, portOf(httpLn), portOf(httpsLn), log, reg)
	if err != nil {
		closeAll()
		return err
	}
	defer tlsSetup.stop()
	handler.Covers = tlsSetup.covers

	edgeHandler := metrics.InFlight(handler)
	httpSrv := newServer(handler.Screen(tlsSetup.httpHandler(edgeHandler)), nil, "http")
	var httpsSrv *http.Server
	var h3 *http3Listener
	if httpsLn != nil {
		httpsHandler := edgeHandler
		if c.http3 {
			if h3, err = newHTTP3(httpsLn.Addr(), tlsSetup.config, edgeHandler, c.maxHeaderBytes, c.idleTimeout); err != nil {
				closeAll()
				return err
			}
			httpsHandler = h3.advertiseHTTP3(edgeHandler)
		}
		httpsSrv = newServer(httpsHandler, tlsSetup.config, "https")
		guard := newResetGuard(log.With().Str("component", "http2").Logger())
		guard.configure(httpsSrv)
		handler.Canceled = guard.canceled
	}
	// The PROXY header is read in Accept's connection wrapper, before TLS
	// and HTTP, so the client address reaches logs and forwarded headers.
	httpLn = withProxyProtocol(withSendTimeout(httpLn, c.sendTimeout), proxyFrom, c.readHeaderTimout)
	if httpsLn != nil {
		httpsLn = withProxyProtocol(withSendTimeout(httpsLn, c.sendTimeout), proxyFrom, c.readHeaderTimout)
	}
	status := &admin.Server{Live: live, Source: source, Registry: reg, Proxy: proxy, Token: token,
		Certificates: tlsSetup.certificates, Version: version, Started: time.Now()}
	adminSrv := newServer(status.Handler(), nil, "admin")

	ev := log.Info().Str("version", version).Str("source", sourceName).Str("state_dir", c.stateDir).
		Str("tls", c.tlsMode).Str("http_addr", httpLn.Addr().String()).Str("admin_addr", adminLn.Addr().String())
	if httpsLn != nil {
		ev = ev.Str("https_addr", httpsLn.Addr().String())
	}
	if h3 != nil {
		ev = ev.Str("http3_addr", h3.conn.LocalAddr().String())
	}
	if len(proxyFrom) > 0 {
		ev = ev.Str("proxy_protocol_from", c.proxyProtocol)
	}
	ev.Bool("token_set", token != "").Msg("scafo-edge started")

	errc := make(chan error, 4)
	if h3 != nil {
		go func() { errc <- h3.serve() }()
	}
	go func() { errc <- serveOn(httpSrv, httpLn, false) }()
	if httpsSrv != nil {
		go func() { errc <- serveOn(httpsSrv, httpsLn, true) }()
	}
	go func() { errc <- serveOn(adminSrv, adminLn, false) }()

	sourceCtx, stopSource := context.WithCancel(context.Background())
	var sourceDone sync.WaitGroup
	sourceDone.Add(1)
	go func() {
		defer sourceDone.Done()
		source.Run(sourceCtx, seed, func(u node.Update) {
			updater.Apply(u)
			if err := node.SaveDocument(db, u); err != nil {
				log.Error().Err(err).Msg("persist routing document failed; the new table is served but a restart would start from the previous one")
			}
		})
	}()

	var runErr error
	select {
	case <-ctx.Done():
		log.Info().Dur("timeout", c.shutdownTimeout).Msg("shutting down: listeners closed, waiting for in-flight requests")
	case runErr = <-errc:
		log.Error().Err(runErr).Msg("listener failed; shutting down")
	}
	shutCtx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, srv := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srv.Shutdown(shutCtx); err != nil {
				log.Warn().Err(err).Msg("shutdown deadline passed; closing remaining connections")
				srv.Close()
			}
		}()
	}
	if h3 != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h3.shutdown(shutCtx, log)
		}()
	}
	wg.Wait()
	stopSource()
	sourceDone.Wait()
	log.Info().Msg("scafo-edge stopped")
	return runErr
}

func serveOn(srv *http.Server, l net.Listener, useTLS bool) error {
	var err error
	if useTLS {
		err = srv.ServeTLS(l, "", "")
	} else {
		err = srv.Serve(l)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func newSource(c *config, token string, log zerolog.Logger, reg prometheus.Registerer) (node.Source, string, error) {
	slog := log.With().Str("component", "source").Logger()
	if c.routesFile != "" {
		src, err := node.NewFileSource(c.routesFile, c.pollInterval, slog, reg)
		return src, "file " + c.routesFile, err
	}
	src, err := node.NewPoller(node.PollerOptions{
		Node:       c.node,
		Token:      token,
		Prefer:     c.prefer,
		Interval:   c.pollInterval,
		Log:        slog,
		Registerer: reg,
	})
	return src, "node " + c.node, err
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

func parseCIDRs(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			if a, aerr := netip.ParseAddr(f); aerr == nil {
				p = netip.PrefixFrom(a, a.BitLen())
			} else {
				return nil, fmt.Errorf("parse %q: %w", f, err)
			}
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// upstreamSendTimeout maps --send-timeout to backhaul's option, where zero
// means its default rather than no bound.
func upstreamSendTimeout(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}
