package edge

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/backhaul"
	"github.com/scafo/scafo-edge/internal/forwarded"
	"github.com/scafo/scafo-edge/internal/promreg"
)

// noApplication labels requests no route was resolved for. Application names
// come from the document, never from the request, so the label set is
// bounded by what the node publishes.
const noApplication = "-"

// apiApplication labels requests routed to the platform API apex.
const apiApplication = "scafo-api"

// Metrics counts requests by application; it is an Observer.
type Metrics struct {
	requests  *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	bytesIn   *prometheus.CounterVec
	bytesOut  *prometheus.CounterVec
	self      *prometheus.CounterVec
	inFlight  prometheus.Gauge
	failovers *prometheus.CounterVec

	// series caches the children a request updates, by application and
	// label classes, so that Observe does not hash and look up label values
	// in four vectors per request: each lookup hashes and allocates, and the
	// request path allocates nothing of its own. It grows with the label sets
	// the vectors hold, which are bounded by the documents' applications.
	series sync.Map // seriesKey → *appSeries
}

// seriesKey names one request series: an application and the indexes of
// its code, method and protocol classes.
type seriesKey struct {
	app                 string
	code, method, proto uint8
}

// appSeries holds the children one request series updates.
type appSeries struct {
	requests prometheus.Counter
	duration prometheus.Observer
	bytesOut prometheus.Counter
	// bytesIn and failovers appear only once they count something, as
	// they did before they were cached.
	bytesIn, failovers lazyCounter
}

// lazyCounter is a vector's child for one application, made on first use.
type lazyCounter struct {
	vec *prometheus.CounterVec
	app string
	c   atomic.Pointer[prometheus.Counter]
}

func (l *lazyCounter) get() prometheus.Counter {
	if c := l.c.Load(); c != nil {
		return *c
	}
	c := l.vec.WithLabelValues(l.app)
	l.c.Store(&c)
	return c
}

// NewMetrics returns Metrics with its collectors registered on reg (nil: not
// registered), or the registration's error.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scafo_edge_requests_total",
			Help: "Requests answered, by application, status code class, method class and protocol.",
		}, []string{"application", "code", "method", "protocol"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "scafo_edge_request_duration_seconds",
			Help:    "Time from request to the end of its response, by application.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"application"}),
		bytesIn: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scafo_edge_request_bytes_total",
			Help: "Request body bytes sent to upstreams, by application.",
		}, []string{"application"}),
		bytesOut: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scafo_edge_response_bytes_total",
			Help: "Response body bytes written to clients, by application.",
		}, []string{"application"}),
		self: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scafo_edge_self_answered_total",
			Help: "Responses the edge answered itself, by application (\"-\" when no route resolved) and reason.",
		}, []string{"application", "reason"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "scafo_edge_requests_in_flight",
			Help: "Requests being served.",
		}),
		failovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "scafo_edge_request_failovers_total",
			Help: "Requests that reached an upstream only after another failed to connect, by application.",
		}, []string{"application"}),
	}
	for _, r := range Reasons {
		m.self.WithLabelValues(noApplication, string(r))
	}
	if err := promreg.Register(reg, m.requests, m.duration, m.bytesIn, m.bytesOut, m.self, m.inFlight, m.failovers); err != nil {
		return nil, fmt.Errorf("register request metrics: %w", err)
	}
	return m, nil
}

// Observe implements Observer.
func (m *Metrics) Observe(rec *Record) {
	app := applicationLabel(rec.Route)
	s := m.seriesFor(app, rec)
	s.requests.Inc()
	s.duration.Observe(rec.Duration.Seconds())
	if rec.BytesIn > 0 {
		s.bytesIn.get().Add(float64(rec.BytesIn))
	}
	s.bytesOut.Add(float64(rec.BytesOut))
	if rec.Reason != "" {
		m.self.WithLabelValues(app, string(rec.Reason)).Inc()
	}
	if rec.Failovers > 0 {
		s.failovers.get().Inc()
	}
}

// seriesFor returns the cached children for rec's series, making them on
// first sight.
func (m *Metrics) seriesFor(app string, rec *Record) *appSeries {
	k := seriesKey{app: app, code: codeClassIndex(rec.Status),
		method: methodClassIndex(rec.Method), proto: protocolClassIndex(rec.Proto)}
	if s, ok := m.series.Load(k); ok {
		return s.(*appSeries)
	}
	s := &appSeries{
		requests:  m.requests.WithLabelValues(app, codeClasses[k.code], methodClasses[k.method], protocolClasses[k.proto]),
		duration:  m.duration.WithLabelValues(app),
		bytesOut:  m.bytesOut.WithLabelValues(app),
		bytesIn:   lazyCounter{vec: m.bytesIn, app: app},
		failovers: lazyCounter{vec: m.failovers, app: app},
	}
	actual, _ := m.series.LoadOrStore(k, s)
	return actual.(*appSeries)
}

// InFlight wraps next so the in-flight gauge covers the whole request.
func (m *Metrics) InFlight(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.inFlight.Inc()
		defer m.inFlight.Dec()
		next.ServeHTTP(w, r)
	})
}

func applicationLabel(r *Route) string {
	switch {
	case r == nil:
		return noApplication
	case r.API:
		return apiApplication
	}
	return r.Application
}

// The label values of the request classes, indexed by the *ClassIndex
// functions.
var (
	codeClasses     = [...]string{"1xx", "2xx", "3xx", "4xx", "5xx", "other"}
	methodClasses   = [...]string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "OTHER"}
	protocolClasses = [...]string{"HTTP/1.0", "HTTP/1.1", "HTTP/2.0", "HTTP/3.0", "other"}
)

func codeClassIndex(status int) uint8 {
	if status >= 100 && status < 600 {
		return uint8(status/100 - 1)
	}
	return 5
}

// methodClassIndex folds methods into a bounded set: a client chooses the
// method string, so an unknown one must not mint a series.
func methodClassIndex(m string) uint8 {
	switch m {
	case http.MethodGet:
		return 0
	case http.MethodHead:
		return 1
	case http.MethodPost:
		return 2
	case http.MethodPut:
		return 3
	case http.MethodPatch:
		return 4
	case http.MethodDelete:
		return 5
	case http.MethodOptions:
		return 6
	}
	return 7
}

// protocolClassIndex folds the request's protocol into a bounded set.
func protocolClassIndex(p string) uint8 {
	switch p {
	case "HTTP/1.0":
		return 0
	case "HTTP/1.1":
		return 1
	case "HTTP/2.0":
		return 2
	case "HTTP/3.0":
		return 3
	}
	return 4
}

// AccessLog writes one line per request, JSON (AccessLogJSON) or the
// Apache and nginx "combined" format (AccessLogCombined), at most perSecond
// lines in any one second of the clock; lines beyond that are counted, not
// written, so a flood cannot fill a disk. It is an Observer.
type AccessLog struct {
	log    zerolog.Logger
	out    io.Writer    // the combined format's lines; nil for JSON
	limit  *lineLimiter // nil: no limit
	anon   bool
	trusts []netip.Prefix
	// dropped counts every line not written; reported is the part of it
	// already told in a written line's lines_dropped_before.
	dropped, reported atomic.Uint64
}

// AccessLogFormat names the access log's line format.
type AccessLogFormat string

const (
	// AccessLogJSON is one zerolog JSON object a line.
	AccessLogJSON AccessLogFormat = "json"
	// AccessLogCombined is the Apache and nginx "combined" format, which
	// log analysers read: client, identity and user ("-"), time, request
	// line, status, body bytes, Referer and User-Agent.
	AccessLogCombined AccessLogFormat = "combined"
)

// AccessLogOptions configures an AccessLog. The zero value writes JSON
// lines without a rate limit, with client addresses as the peers are.
type AccessLogOptions struct {
	// PerSecond bounds the lines written in any one second; <= 0: no limit.
	PerSecond int
	// Format is the line format; "": AccessLogJSON.
	Format AccessLogFormat
	// Out receives the combined format's lines, one Write each; required
	// with AccessLogCombined, unused with JSON (lines go to the logger).
	Out io.Writer
	// Anonymise logs client addresses cut to their network (IPv4 /24,
	// IPv6 /48), for operators who may not keep personal data (GDPR).
	Anonymise bool
	// TrustedProxies are the peers whose X-Forwarded-For names the client
	// logged, and whose X-Request-Id is the request's ID (--trusted-proxies,
	// read as the forwarded headers read them). Empty: the peer is the
	// client and the edge gives every request its own ID.
	TrustedProxies []netip.Prefix
	// Registerer registers the counter of dropped lines; nil: not
	// registered.
	Registerer prometheus.Registerer
}

// NewAccessLog returns a JSON access log writing to log at most perSecond
// lines a second, its counter of dropped lines registered on reg (nil: not
// registered), or the registration's error. perSecond <= 0 means no limit.
func NewAccessLog(log zerolog.Logger, perSecond int, reg prometheus.Registerer) (*AccessLog, error) {
	return NewAccessLogWith(log, AccessLogOptions{PerSecond: perSecond, Registerer: reg})
}

// NewAccessLogWith returns an access log configured by o, writing JSON lines
// to log, or an error for an unknown format, a combined format without Out,
// or a failed registration.
func NewAccessLogWith(log zerolog.Logger, o AccessLogOptions) (*AccessLog, error) {
	a := &AccessLog{log: log, anon: o.Anonymise, trusts: o.TrustedProxies}
	switch o.Format {
	case "", AccessLogJSON:
	case AccessLogCombined:
		if o.Out == nil {
			return nil, errors.New("access log: the combined format needs a writer")
		}
		a.out = o.Out
	default:
		return nil, fmt.Errorf("access log: format %q: want json or combined", o.Format)
	}
	if o.PerSecond > 0 {
		a.limit = &lineLimiter{limit: int64(o.PerSecond)}
	}
	dropped := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "scafo_edge_access_log_dropped_total",
		Help: "Access log lines not written because the rate limit was reached.",
	}, func() float64 { return float64(a.dropped.Load()) })
	if err := promreg.Register(o.Registerer, dropped); err != nil {
		return nil, fmt.Errorf("register access log metrics: %w", err)
	}
	return a, nil
}

// lineLimiter admits at most limit lines per second of the clock (a fixed
// window), without a lock. It replaced rate.Limiter, whose mutex and clock
// read every request paid: under a flood, when the access log matters most,
// every request is over the limit, and a refusal here costs two atomic
// loads. Requests racing at a window's turn may let a few lines more
// through; a burst may reach twice the limit across a window's edge.
type lineLimiter struct {
	limit  int64
	window atomic.Int64 // the second being counted, in Unix seconds
	count  atomic.Int64 // lines admitted in it
}

// allow reports whether a line ending at now may be written.
func (l *lineLimiter) allow(now time.Time) bool {
	sec := now.Unix()
	// Windows only move forward: a request ending a little earlier than
	// one already counted joins the current window.
	if w := l.window.Load(); sec > w && l.window.CompareAndSwap(w, sec) {
		l.count.Store(0)
	}
	if l.count.Load() >= l.limit {
		return false
	}
	return l.count.Add(1) <= l.limit
}

// maxLoggedField bounds the client-chosen fields a line carries (query,
// User-Agent, Referer): a client may send tens of kilobytes of each.
const maxLoggedField = 1024

// Observe implements Observer.
func (a *AccessLog) Observe(rec *Record) {
	if a.limit != nil {
		// The request's end, which the handler has already read from the
		// clock: one clock read less per request.
		end := rec.Start.Add(rec.Duration)
		if rec.Start.IsZero() {
			end = time.Now()
		}
		if !a.limit.allow(end) {
			a.dropped.Add(1)
			return
		}
	}
	var clientBuf [64]byte
	var idBuf [16]byte
	f := a.fields(rec, clientBuf[:0], idBuf[:0])
	if a.out != nil {
		a.writeCombined(rec, &f)
		return
	}
	ev := a.log.Info().
		Time("start", rec.Start).
		Str("application", applicationLabel(rec.Route)).
		Str("host", rec.Host).
		Str("method", rec.Method).
		Str("path", rec.Path).
		Str("proto", rec.Proto).
		Int("status", rec.Status).
		Int64("bytes_in", rec.BytesIn).
		Int64("bytes_out", rec.BytesOut).
		Float64("duration_ms", float64(rec.Duration.Microseconds())/1000)
	if len(f.client) > 0 {
		ev = ev.Bytes("client", f.client)
	}
	if f.query != "" {
		ev = ev.Str("query", f.query)
	}
	if f.userAgent != "" {
		ev = ev.Str("user_agent", f.userAgent)
	}
	if f.referer != "" {
		ev = ev.Str("referer", f.referer)
	}
	if f.tls != "" {
		ev = ev.Str("tls", f.tls)
	}
	if len(f.id) > 0 {
		ev = ev.Bytes("request_id", f.id)
	}
	if rec.Route != nil {
		ev = ev.Str("route", rec.Route.Host)
	}
	if rec.Prefix != "" {
		ev = ev.Str("prefix", rec.Prefix)
	}
	if rec.Node != "" {
		ev = ev.Str("upstream_node", rec.Node)
	}
	if rec.Failovers > 0 {
		ev = ev.Int("failovers", rec.Failovers)
	}
	if rec.Reason != "" {
		ev = ev.Str("answered_by_edge", string(rec.Reason))
	}
	if n := a.dropped.Load(); n != a.reported.Load() {
		if before := n - a.reported.Swap(n); before > 0 && before <= n {
			ev = ev.Uint64("lines_dropped_before", before)
		}
	}
	ev.Msg("request")
}

// requestFields are what a line says of the request beyond its Record,
// read from it once for either format. The byte fields are appended to
// buffers on Observe's stack, so that a line costs no allocation of its
// own.
type requestFields struct {
	client, id                []byte
	query, userAgent, referer string
	tls                       string
}

// fields fills f from rec's request: the client after the PROXY protocol
// and --trusted-proxies (forwarded.Origin, as the forwarded headers name
// it), anonymised if asked; the request ID (the one forwarded upstream, or
// for a request the edge answered itself one decided the same way).
func (a *AccessLog) fields(rec *Record, clientBuf, idBuf []byte) (f requestFields) {
	id := rec.RequestID
	r := rec.Request
	if r != nil {
		if ip := forwarded.Origin(r.RemoteAddr, r.Header["X-Forwarded-For"], a.trusts); ip.IsValid() {
			if a.anon {
				ip = anonymise(ip)
			}
			f.client = ip.AppendTo(clientBuf)
		}
		f.query = clip(r.URL.RawQuery)
		f.userAgent = clip(firstValue(r.Header["User-Agent"]))
		f.referer = clip(firstValue(r.Header["Referer"]))
		if r.TLS != nil {
			f.tls = tls.VersionName(r.TLS.Version)
		}
		if id.IsZero() {
			id = backhaul.RequestIDFor(r, a.trusts)
		}
	}
	if !id.IsZero() {
		f.id = id.AppendTo(idBuf)
	}
	return f
}

// anonymise cuts ip to its network: IPv4 /24, IPv6 /48, as the GDPR
// guidance for access logs (and Matomo, nginx's anonymisers) does.
func anonymise(ip netip.Addr) netip.Addr {
	bits := 48
	if ip.Is4() {
		bits = 24
	}
	p, _ := ip.Prefix(bits)
	return p.Addr()
}

func firstValue(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

func clip(s string) string {
	if len(s) > maxLoggedField {
		return s[:maxLoggedField]
	}
	return s
}

// Observers fans one record out to several observers in order.
type Observers []Observer

// Observe implements Observer.
func (os Observers) Observe(rec *Record) {
	for _, o := range os {
		o.Observe(rec)
	}
}
