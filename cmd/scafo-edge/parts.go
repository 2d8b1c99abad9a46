package main

import (
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/rs/zerolog"
	bolt "go.etcd.io/bbolt"

	"github.com/scafo/scafo-edge/admission"
	"github.com/scafo/scafo-edge/backhaul"
	"github.com/scafo/scafo-edge/edge"
	"github.com/scafo/scafo-edge/internal/promreg"
	"github.com/scafo/scafo-edge/node"
)

// parts are the edge's long-lived pieces, built before any listener opens:
// the state file, the metrics registry, the live table and what feeds it,
// the upstream proxy and the request handler.
type parts struct {
	token      string
	db         *bolt.DB
	reg        *prometheus.Registry
	live       *edge.Live
	updater    *edge.Updater
	seed       *node.Update // the persisted document served at start-up; nil: none
	source     node.Source
	sourceName string
	// operator is the operator routes file (--operator-routes); nil: none.
	operator  *node.OperatorSource
	proxy     *backhaul.Proxy
	metrics   *edge.Metrics
	handler   *edge.Handler
	admission *admission.Controller
	// handshakeErrors counts the TLS handshakes every listener's error log
	// reports.
	handshakeErrors prometheus.Counter
}

// buildParts opens the state file and builds the parts from the validated
// flags. handed is the document the edge this one replaces handed over
// (nil: none); it is served instead of the persisted one. On error nothing
// is left open.
func buildParts(c *config, s settings, handed *node.Update, log zerolog.Logger) (_ *parts, err error) {
	p := &parts{}
	var warnings []string
	if p.token, warnings, err = node.LoadToken(c.token, c.tokenFile); err != nil {
		return nil, err
	}
	for _, w := range warnings {
		log.Warn().Str("file", c.tokenFile).Msg(w)
	}
	if p.db, err = node.OpenState(c.stateDir, log); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			p.close()
		}
	}()

	p.reg = prometheus.NewRegistry()
	buildInfo := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "scafo_edge_build_info", Help: "Always 1; the version label names the build.",
	}, []string{"version"})
	buildInfo.WithLabelValues(version).Set(1)
	if err = promreg.Register(p.reg, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildInfo); err != nil {
		return nil, fmt.Errorf("register process metrics: %w", err)
	}

	p.live = &edge.Live{}
	if p.updater, err = edge.NewUpdater(p.live, log.With().Str("component", "routing").Logger(), p.reg); err != nil {
		return nil, err
	}
	if c.operatorRoutes != "" {
		// Read before any document is served: a broken file stops the
		// edge here, naming the file, line and field.
		if p.operator, err = node.NewOperatorSource(node.OperatorSourceOptions{
			Path:       c.operatorRoutes,
			Log:        log.With().Str("component", "operator-routes").Logger(),
			Registerer: p.reg,
		}); err != nil {
			return nil, fmt.Errorf("--operator-routes: %w", err)
		}
		var first node.OperatorUpdate
		if first, err = p.operator.Load(); err != nil {
			return nil, fmt.Errorf("--operator-routes: %w", err)
		}
		if err = p.updater.SetOperator(first, p.reg); err != nil {
			return nil, err
		}
		log.Info().Str("file", c.operatorRoutes).Str("fingerprint", first.Fingerprint).Int("routes", len(first.Doc.Routes)).
			Msg("operator routes file read; its routes are served beside the node's and win every host both name")
	}
	if handed != nil {
		p.seed = handed
		log.Info().Str("fingerprint", handed.Fingerprint).Time("fetched_at", handed.FetchedAt).Bool("stale", handed.Stale).
			Msg("serving the routing document the previous edge handed over until the source answers")
	} else if p.seed, err = node.LoadDocument(p.db); err != nil {
		log.Warn().Err(err).Msg("persisted routing document unreadable; waiting for the source")
		p.seed, err = nil, nil
	} else if p.seed != nil {
		log.Warn().Str("fingerprint", p.seed.Fingerprint).Time("fetched_at", p.seed.FetchedAt).
			Msg("serving the persisted routing document, marked stale, until the source answers")
	}
	if p.seed != nil {
		p.updater.Apply(*p.seed)
	}

	if p.source, p.sourceName, err = newSource(c, p.token, log, p.reg); err != nil {
		return nil, err
	}
	if p.operator != nil {
		// The status surfaces read the operator file's state beside the
		// source's; runSource runs both.
		p.source = node.WithOperator(p.source, p.operator)
	}

	// The proxy is built with the controller's connection counting, so
	// the controller reaches its idle pool through p.
	closeIdleUpstreams := func(idleFor time.Duration) { p.proxy.CloseIdle(idleFor) }
	if p.admission, err = newAdmission(s, p.reg, closeIdleUpstreams, log); err != nil {
		return nil, err
	}
	if p.proxy, err = backhaul.New(backhaul.Options{
		CountDial:             p.admission.DialUpstream,
		DialTimeout:           c.dialTimeout,
		ResponseHeaderTimeout: c.responseTimeout,
		SendTimeout:           upstreamSendTimeout(c.sendTimeout),
		TrustedProxies:        s.trusted,
		Log:                   log.With().Str("component", "backhaul").Logger(),
		Registerer:            p.reg,
	}); err != nil {
		return nil, err
	}

	if p.metrics, err = edge.NewMetrics(p.reg); err != nil {
		return nil, err
	}
	observers := edge.Observers{p.metrics}
	if c.accessLog {
		var access *edge.AccessLog
		if access, err = edge.NewAccessLogWith(log.With().Str("component", "access").Logger(), edge.AccessLogOptions{
			PerSecond: c.accessLogRate,
			Format:    edge.AccessLogFormat(c.accessLogFormat),
			// The combined format is not JSON: its lines go to standard
			// output, where the logger writes, but not through it.
			Out:            os.Stdout,
			Anonymise:      c.accessLogAnon,
			TrustedProxies: s.trusted,
			Registerer:     p.reg,
		}); err != nil {
			return nil, err
		}
		observers = append(observers, access)
	}
	var pages *edge.ErrorPages
	if c.errorPages != "" {
		if pages, err = edge.NewErrorPages(edge.ErrorPagesOptions{
			Dir: c.errorPages,
			Log: log.With().Str("component", "error-pages").Logger(),
		}); err != nil {
			return nil, err
		}
	}
	p.handler = &edge.Handler{Table: p.live, Forwarder: p.proxy, Observer: observers, Admission: p.admission,
		TrustedProxies: s.trusted, ErrorPages: pages, MaxBodyBytes: c.maxBodyBytes}

	p.handshakeErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "scafo_edge_tls_handshake_errors_total",
		Help: "TLS handshakes that failed before a request: no certificate for the name, protocol errors, clients giving up.",
	})
	if err = promreg.Register(p.reg, p.handshakeErrors); err != nil {
		return nil, fmt.Errorf("register handshake metrics: %w", err)
	}
	return p, nil
}

// newAdmission derives the connection budget from the process's limits and
// the overload flags, and says what it came to.
func newAdmission(s settings, reg prometheus.Registerer, closeIdleUpstreams func(time.Duration), log zerolog.Logger) (*admission.Controller, error) {
	alog := log.With().Str("component", "admission").Logger()
	l, f, err := admission.Derive(s.limits, admission.System{Getenv: getenv, Files: os.DirFS("/")})
	if err != nil {
		return nil, err
	}
	if f.CgroupErr != nil {
		alog.Warn().Err(f.CgroupErr).Msg("a cgroup memory limit could not be read; the edge goes by the others it found")
	}
	if f.Cgroup > 0 && l.MemoryLimit > f.Cgroup {
		alog.Warn().Int64("memory_limit", l.MemoryLimit).Str("memory_limit_from", l.MemoryFrom).Int64("cgroup_limit", f.Cgroup).Str("cgroup_file", f.CgroupFile).
			Msg("the memory limit set is past the cgroup's: the kernel kills the edge at the cgroup's before the edge sheds at its own")
	}
	ev := alog.Info().Uint64("descriptor_limit", f.Descriptors).Int("reserved", f.Reserved).Int("max_conns", l.MaxConns).
		Int("max_conns_per_client", l.ConnsPerClient).Int("max_requests_per_client", l.RequestsPerClient).
		Float64("app_share", l.AppShare).Dur("app_queue_timeout", l.QueueTimeout)
	if f.RaisedFrom > 0 {
		ev = ev.Uint64("descriptor_soft_limit_was", f.RaisedFrom)
	}
	ev = ev.Int64("memory_limit", l.MemoryLimit).Str("memory_limit_from", l.MemoryFrom)
	if l.MemoryFile != "" {
		ev = ev.Str("memory_limit_file", l.MemoryFile)
	}
	if f.MemTotal > 0 {
		ev = ev.Int64("mem_total", f.MemTotal)
	}
	if f.GoLimit > 0 {
		ev = ev.Int64("go_memory_limit", f.GoLimit)
	}
	if l.ClientRate > 0 {
		ev = ev.Float64("client_rate", l.ClientRate).Int("client_burst", l.ClientBurst)
	}
	msg := "connection budget: from the descriptor limit less a reserve for the edge's own work, and half the memory limit at 32 KiB a connection"
	if l.MemoryLimit == 0 {
		msg = "connection budget: from the descriptor limit less a reserve for the edge's own work; no memory limit known, so none sheds for memory"
	}
	ev.Msg(msg)
	return admission.New(admission.Options{
		Limits:         l,
		Proxies:        append(slices.Clone(s.trusted), s.proxyFrom...),
		TrustedProxies: s.trusted,
		Log:            alog,
		Registerer:     reg,

		CloseIdleUpstreams: closeIdleUpstreams,
	})
}

// close releases the upstream pools and the state file.
func (p *parts) close() {
	if p.proxy != nil {
		p.proxy.Close()
	}
	p.db.Close()
}
