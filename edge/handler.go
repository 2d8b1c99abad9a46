package edge

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/scafo/scafo-edge/admission"
	"github.com/scafo/scafo-edge/backhaul"
	"github.com/scafo/scafo-edge/internal/clock"
	"github.com/scafo/scafo-edge/internal/hostname"
	"github.com/scafo/scafo-edge/node"
)

// Forwarder carries a request down a route's upstream priority list.
// backhaul.Proxy is the implementation; the interface keeps the handler
// ignorant of how bytes reach an upstream.
type Forwarder interface {
	// Forward writes the upstream's response to w, or writes nothing and
	// returns an error matching backhaul.ErrNoUpstream or
	// backhaul.ErrUpstreamTimeout.
	Forward(w http.ResponseWriter, r *http.Request, ups []node.Upstream) (backhaul.Result, error)
}

var _ Forwarder = (*backhaul.Proxy)(nil)

// Reason names a response the edge answered itself, or "" for a proxied one.
// Operators tell the cases apart by it in the body, the logs and the metrics.
type Reason string

const (
	ReasonNoDocument   Reason = "no_document"
	ReasonBadHost      Reason = "bad_host"
	ReasonBadTarget    Reason = "bad_target"
	ReasonMisdirected  Reason = "misdirected"
	ReasonDenied       Reason = "denied"
	ReasonNoRoute      Reason = "no_route"
	ReasonNoUpstream   Reason = "no_upstream"
	ReasonTimeout      Reason = "timeout"
	ReasonMethod       Reason = "method_not_allowed"
	ReasonCanceled     Reason = "client_canceled"
	ReasonBadBody      Reason = "bad_body"
	ReasonBodyTooLarge Reason = "body_too_large"
	ReasonOverloaded   Reason = "overloaded"
	ReasonAppBusy      Reason = "app_busy"
	ReasonClientBusy   Reason = "client_busy"
	ReasonClientRate   Reason = "client_rate"
	// The answers of the operator file's routes (policy.go).
	ReasonRedirect     Reason = "redirect"
	ReasonNotAllowed   Reason = "not_allowed"
	ReasonUnauthorized Reason = "unauthorized"
)

// Reasons lists every Reason, for metrics that pre-create their series.
var Reasons = []Reason{ReasonNoDocument, ReasonBadHost, ReasonBadTarget, ReasonMisdirected, ReasonDenied,
	ReasonNoRoute, ReasonNoUpstream, ReasonTimeout, ReasonMethod, ReasonCanceled, ReasonBadBody, ReasonBodyTooLarge,
	ReasonOverloaded, ReasonAppBusy, ReasonClientBusy, ReasonClientRate,
	ReasonRedirect, ReasonNotAllowed, ReasonUnauthorized}

// selfAnswers are the statuses and bodies of the responses the edge writes
// itself: short, plain, and saying which case it was. A client that prefers
// JSON gets them as jsonAnswers; for the statuses of PageStatuses, the
// operator's pages (ErrorPages) may stand in for the text.
var selfAnswers = map[Reason]struct {
	status int
	body   string
}{
	ReasonNoDocument:   {http.StatusServiceUnavailable, "scafo-edge: no routing document loaded yet\n"},
	ReasonBadHost:      {http.StatusBadRequest, "scafo-edge: malformed Host header\n"},
	ReasonBadTarget:    {http.StatusBadRequest, "scafo-edge: malformed request target\n"},
	ReasonMisdirected:  {http.StatusMisdirectedRequest, "scafo-edge: Host not covered by this connection's certificate\n"},
	ReasonDenied:       {http.StatusForbidden, "scafo-edge: this path of the API is not served publicly\n"},
	ReasonNoRoute:      {http.StatusNotFound, "scafo-edge: no route for this host\n"},
	ReasonNoUpstream:   {http.StatusBadGateway, "scafo-edge: no upstream could be reached\n"},
	ReasonTimeout:      {http.StatusGatewayTimeout, "scafo-edge: upstream did not answer in time\n"},
	ReasonMethod:       {http.StatusMethodNotAllowed, "scafo-edge: CONNECT is not supported\n"},
	ReasonBadBody:      {http.StatusBadRequest, "scafo-edge: the request's body broke off\n"},
	ReasonBodyTooLarge: {http.StatusRequestEntityTooLarge, "scafo-edge: the request's body is larger than this host accepts\n"},
	ReasonOverloaded:   {http.StatusServiceUnavailable, "scafo-edge: overloaded, retry shortly\n"},
	ReasonAppBusy:      {http.StatusServiceUnavailable, "scafo-edge: this application has its share of the edge in use, retry shortly\n"},
	ReasonClientBusy:   {http.StatusTooManyRequests, "scafo-edge: too many requests in flight from your address\n"},
	ReasonClientRate:   {http.StatusTooManyRequests, "scafo-edge: too many requests from your address\n"},

	ReasonNotAllowed:   {http.StatusForbidden, "scafo-edge: your address may not use this host\n"},
	ReasonUnauthorized: {http.StatusUnauthorized, "scafo-edge: this host wants a user and password\n"},
}

// retryAfter is the Retry-After of the answers that ask a client to come
// back, in seconds; the 503 before the first document has its own.
var retryAfter = map[Reason]string{
	ReasonOverloaded: "5",
	ReasonAppBusy:    "1",
	ReasonClientBusy: "1",
	ReasonClientRate: "1",
}

// refusalReasons maps an admission refusal to the edge's answer.
var refusalReasons = [...]Reason{
	admission.RefusedMemory:          ReasonOverloaded,
	admission.RefusedBudget:          ReasonOverloaded,
	admission.RefusedClientRequests:  ReasonClientBusy,
	admission.RefusedClientRate:      ReasonClientRate,
	admission.RefusedAppQueueFull:    ReasonAppBusy,
	admission.RefusedAppQueueTimeout: ReasonAppBusy,
}

// Record describes one answered request, for metrics and access logs.
type Record struct {
	Start    time.Time
	Duration time.Duration
	Method   string
	Host     string
	Path     string
	Proto    string
	// Route is the route the request was attributed to (the target route
	// on a path hit), nil when none resolved.
	Route  *Route
	Prefix string
	// Reason is set when the edge answered itself.
	Reason    Reason
	Status    int
	Node      string
	Failovers int
	BytesIn   int64
	BytesOut  int64
	// Request is the request answered, for what an observer reads beyond
	// these fields (the access log's client, User-Agent...): read only,
	// and not kept past Observe.
	Request *http.Request
	// RequestID is the ID the request was forwarded with (X-Request-Id);
	// zero when it was not forwarded.
	RequestID backhaul.RequestID

	// reset asks ServeHTTP to reset the client's stream once the request
	// is observed.
	reset bool
}

// Observer is told about every request once it has been answered. It runs on
// the request's goroutine, so it must be quick and must not keep rec.
type Observer interface {
	Observe(rec *Record)
}

// Handler is the edge's http.Handler; the same value serves the HTTP, HTTPS
// and HTTP/3 listeners. Its order of decisions is load-bearing:
//
//  0. A chunked HTTP/1 request gets Connection: close (RFC 9112 §6.1).
//  1. CONNECT is refused (405): the edge is never a forward proxy.
//  2. A request target with a space or control byte: 400, since it could
//     not be forwarded byte for byte in an HTTP/1.1 request line.
//  3. No table yet: 503 with Retry-After (docs/design.md rule 1).
//  4. On TLS, a Host the connection's certificate does not cover: 421, so a
//     coalesced connection cannot front another name (400 if the Host is
//     malformed).
//  5. Table.Resolve: host, then first path segment; a malformed Host: 400.
//  6. A denied prefix on an API host: 403, never proxied.
//  7. No route: 404, no upstream contacted.
//  8. A request its client has already cancelled (an HTTP/2 stream reset
//     before its handler ran) is not forwarded: nobody is left to answer.
//  9. Admission: past the memory high-water mark 503; past the client
//     address's share of requests in flight or its rate 429; past the
//     application's share, a short wait in its queue, then 503. Each with
//     Retry-After. Refusing costs no upstream anything.
//  10. An operator route's own rules (policy.go): outside its allow list
//     403, without valid basic auth credentials 401, a redirect answered
//     here; its response header rules wrap the writer.
//  11. A body larger than the route's limit (bodylimit.go): 413 when its
//     Content-Length says so, before a byte goes upstream; a body of
//     unknown length is cut where it crosses the limit, and the upstream
//     attempt with it: 413 when no response was started, else the client's
//     connection (HTTP/1) or stream is reset.
//  12. Forward down the route's upstream list: 502 when none could be
//     reached, 504 when the response-header timeout fired. The request
//     holds its admission shares until Forward returns (a WebSocket's
//     when its tunnel closes).
//
// Absolute-form request targets resolve by the Host Go's server derives from
// them, and are only ever sent to that route's upstreams.
type Handler struct {
	Table     *Live
	Forwarder Forwarder
	// Covers reports whether the certificate served for sni covers host
	// (both normalised). Nil: host must equal sni.
	Covers func(sni, host string) bool
	// RetryAfter is the Retry-After value sent with the 503 before the first
	// document. Empty: "5".
	RetryAfter string
	// Observer, if non-nil, sees every request after it is answered.
	Observer Observer
	// Canceled, if non-nil, is called on the request's goroutine for each
	// request its client cancelled before any response was written: before
	// it was forwarded or while the edge waited for the upstream. The
	// caller decides what a connection that keeps doing so deserves (an
	// HTTP/2 rapid reset costs the upstream a request per stream). It must
	// be quick. Nil: such requests are only recorded, as status 499 (and
	// over HTTP/1 their connections closed, see canceled).
	Canceled func(r *http.Request)
	// Admission, if non-nil, decides whether a resolved request may go to
	// its upstreams now (fair shares per application and client address,
	// memory pressure). Nil: every request may.
	Admission *admission.Controller
	// Clock is the clock for durations. Nil: the wall clock.
	Clock clock.Clock
	// TrustedProxies are the peers whose X-Forwarded-For names the client
	// an operator route's allow list judges (--trusted-proxies). Empty:
	// every request is judged by its peer address.
	TrustedProxies []netip.Prefix
	// ErrorPages, if non-nil, are the operator's pages for the edge's own
	// 404, 429, 502, 503 and 504 (--error-pages). Nil: the edge's text.
	ErrorPages *ErrorPages
	// MaxBodyBytes bounds a request's body (--max-body-bytes): a larger
	// declared Content-Length is answered 413 before anything is sent
	// upstream, and a body of unknown length is cut where it crosses it
	// (bodylimit.go). An operator route's max_body_bytes overrides it.
	// Zero: no bound.
	MaxBodyBytes int64
}

func (h *Handler) now() time.Time {
	if h.Clock != nil {
		return h.Clock.Now()
	}
	return time.Now()
}

// ServeHTTP implements http.Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h.Observer == nil {
		var rec Record // stays on the stack: nothing else sees it
		h.serve(w, r, &rec)
		if rec.reset {
			panic(http.ErrAbortHandler)
		}
		return
	}
	// Handing the record to an interface makes it escape; a pooled one
	// spares an allocation per request (Observers must not keep it).
	rec := records.Get().(*Record)
	*rec = Record{Start: h.now(), Method: r.Method, Host: r.Host, Path: r.URL.Path, Proto: r.Proto, Request: r}
	h.serve(w, r, rec)
	rec.Duration = h.now().Sub(rec.Start)
	h.Observer.Observe(rec)
	reset := rec.reset
	*rec = Record{} // holds no Route nor Request while pooled
	records.Put(rec)
	if reset {
		// Resets an HTTP/2 or HTTP/3 stream; net/http does not log it.
		panic(http.ErrAbortHandler)
	}
}

var records = sync.Pool{New: func() any { return new(Record) }}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request, rec *Record) {
	if r.ProtoMajor == 1 && len(r.TransferEncoding) > 0 {
		// Go's server reads a request carrying both Content-Length and
		// Transfer-Encoding by the latter and drops the former before the
		// handler sees it, so the two cannot be told apart here; RFC 9112
		// §6.1 says the server MUST close the connection after such a
		// request. Closing after every chunked HTTP/1 request costs a
		// reconnect to the rare client that streams an upload, and takes
		// away the desync a front proxy counting by Content-Length needs.
		w.Header().Set("Connection", "close")
	}
	if r.Method == http.MethodConnect {
		h.answer(w, r, rec, ReasonMethod)
		return
	}
	if !validTarget(r.RequestURI) || !targetForm(r) {
		h.answer(w, r, rec, ReasonBadTarget)
		return
	}
	t := h.Table.Load()
	if t == nil {
		h.answer(w, r, rec, ReasonNoDocument)
		return
	}
	if r.TLS != nil && r.TLS.ServerName != "" && !h.covers(r.TLS.ServerName, r.Host) {
		if !validHost(r.Host) {
			h.answer(w, r, rec, ReasonBadHost)
		} else {
			h.answer(w, r, rec, ReasonMisdirected)
		}
		return
	}
	res := t.Resolve(r.Host, requestPath(r), r.URL.Path)
	rec.Route, rec.Prefix = res.Route, res.Prefix
	switch res.Outcome {
	case BadHost:
		h.answer(w, r, rec, ReasonBadHost)
		return
	case Denied:
		h.answer(w, r, rec, ReasonDenied)
		return
	case NoRoute:
		h.answer(w, r, rec, ReasonNoRoute)
		return
	}
	if r.Context().Err() != nil {
		// Go's HTTP/2 server starts a handler for a stream the client
		// may reset in the next frame; once reset, forwarding it would
		// cost the upstream a request nobody reads.
		h.canceled(w, r, rec)
		return
	}
	ticket, refusal := h.Admission.Admit(r, shareKey(res.Route))
	switch refusal {
	case admission.Admitted:
	case admission.RefusedCanceled:
		h.canceled(w, r, rec)
		return
	default:
		h.answer(w, r, rec, refusalReasons[refusal])
		return
	}
	defer ticket.Release()
	if res.Route.policy != nil {
		// Only operator routes have one (redirect, allow list, basic auth,
		// response headers); judged after admission, so that a password
		// guesser spends its address's shares and rate.
		var answered bool
		if w, answered = h.enforce(w, r, rec, res.Route.policy); answered {
			return
		}
	}
	body, tooLarge := h.limitBody(r, res.Route)
	if tooLarge {
		closeUnread(w, r)
		h.answer(w, r, rec, ReasonBodyTooLarge)
		return
	}
	result, err := h.Forwarder.Forward(w, r, res.Route.Upstreams)
	rec.Status, rec.Node, rec.Failovers = result.Status, result.Node, result.Failovers
	rec.BytesIn, rec.BytesOut, rec.RequestID = result.BytesIn, result.BytesOut, result.RequestID
	switch {
	case body != nil && body.crossed.Load():
		h.bodyCut(w, r, rec)
	case err == nil:
	case errors.Is(err, backhaul.ErrUpstreamTimeout):
		h.answer(w, r, rec, ReasonTimeout)
	case errors.Is(err, backhaul.ErrNoUpstream):
		h.answer(w, r, rec, ReasonNoUpstream)
	case errors.Is(err, context.Canceled) && result.Status == 0 && r.Context().Err() == nil:
		// The body broke off (malformed, or shorter than it said) on a
		// connection its server still holds: its client may be waiting
		// for an answer, and nginx gives it 400 too.
		h.answer(w, r, rec, ReasonBadBody)
	case errors.Is(err, context.Canceled) && result.Status == 0:
		h.canceled(w, r, rec)
	case errors.Is(err, context.Canceled):
		// The client went away mid-response: a download or a stream it
		// stopped reading, not a request it never wanted.
		rec.Reason, rec.Status = ReasonCanceled, 499
	}
}

// shareKey names the application whose share a request of route spends:
// the document's application, the API apex's own, or for a route that names
// none, its host, so that such routes do not share one unnamed share.
func shareKey(route *Route) string {
	if k := applicationLabel(route); k != "" {
		return k
	}
	return route.Host
}

// canceled records a request its client cancelled before any response was
// written. 499 is nginx's name for this, kept for logs and metrics only.
//
// Over HTTP/1, Go's server takes the end of a client's input for a cancel,
// and a client that half-closed after its request may still be reading:
// left to itself, the server would answer it 200 with an empty body, a
// success that never was. Its connection is closed instead, with no
// answer, as nginx closes it. An HTTP/2 stream reset has nobody to answer.
func (h *Handler) canceled(w http.ResponseWriter, r *http.Request, rec *Record) {
	rec.Reason, rec.Status = ReasonCanceled, 499
	if h.Canceled != nil {
		h.Canceled(r)
	}
	if r.ProtoMajor == 1 {
		backhaul.CloseClient(w)
	}
}

// Screen wraps next, the plain listener's layer for ACME challenges and
// HTTPS redirects, so that the requests the edge refuses whatever their host
// (CONNECT, a malformed Host) get the edge's own 405 and 400 rather than a
// redirect built from a host that is not one.
func (h *Handler) Screen(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodConnect || !validHost(r.Host) {
			h.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// answer writes one of the edge's own responses: the operator's page for
// its status if there is one, the JSON form to a client that prefers JSON,
// else the edge's own text. The body varies with Accept.
func (h *Handler) answer(w http.ResponseWriter, r *http.Request, rec *Record, reason Reason) {
	a := selfAnswers[reason]
	hdr := w.Header()
	var body []byte // nil: a.body
	hdr["Content-Type"] = textPlainUTF8
	if prefersJSON(r.Header["Accept"]) {
		body = jsonAnswers[reason]
		hdr["Content-Type"] = applicationJSON
	} else if page := h.ErrorPages.page(a.status); page != nil {
		body = page
		hdr["Content-Type"] = textHTMLUTF8
	}
	hdr["Vary"] = varyAccept
	hdr["X-Content-Type-Options"] = noSniff
	if reason == ReasonNoDocument {
		ra := h.RetryAfter
		if ra == "" {
			ra = "5"
		}
		hdr.Set("Retry-After", ra)
	} else if ra := retryAfter[reason]; ra != "" {
		hdr.Set("Retry-After", ra)
	}
	if reason == ReasonMethod {
		hdr.Set("Allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")
	}
	w.WriteHeader(a.status)
	var n int
	if body != nil {
		n, _ = w.Write(body)
	} else {
		n, _ = io.WriteString(w, a.body)
	}
	rec.Reason, rec.Status, rec.BytesOut = reason, a.status, int64(n)
}

// Header values of the edge's own answers, shared by every response: the
// server only reads them, and a writer that appends to one (an Add) makes a
// new slice, as each has no room beyond its value.
var (
	textPlainUTF8   = []string{"text/plain; charset=utf-8"}
	textHTMLUTF8    = []string{"text/html; charset=utf-8"}
	applicationJSON = []string{"application/json"}
	varyAccept      = []string{"Accept"}
	noSniff         = []string{"nosniff"}
)

// covers applies the 421 rule: the Host of a request on a TLS connection must
// be a name the connection's certificate was chosen for.
func (h *Handler) covers(sni, host string) bool {
	host = stripPortAndDot(host)
	if strings.EqualFold(host, sni) {
		return true
	}
	if h.Covers == nil {
		return false
	}
	var a, b [hostname.MaxLen]byte
	hk, ok := hostname.Append(a[:0], host)
	if !ok {
		return false
	}
	sk, ok := hostname.Append(b[:0], sni)
	if !ok {
		return false
	}
	return h.Covers(string(sk), string(hk))
}

// validHost reports whether a Host header is well formed, without allocating.
func validHost(host string) bool {
	var buf [hostname.MaxLen]byte
	_, ok := hostname.Append(buf[:0], host)
	return ok
}

func stripPortAndDot(host string) string {
	if i := strings.LastIndexByte(host, ':'); i >= 0 && !strings.Contains(host[i:], "]") {
		host = host[:i]
	}
	return strings.TrimSuffix(host, ".")
}

// validTarget reports whether a request-target can be forwarded byte for
// byte in an HTTP/1.1 request line. Go's HTTP/1 server never lets a space or
// control byte through, but an HTTP/2 or HTTP/3 :path only has to start with
// "/": "/a b" would reach the upstream as "GET /a b HTTP/1.1", a request line
// its parser may split elsewhere than the edge did.
func validTarget(uri string) bool {
	for i := 0; i < len(uri); i++ {
		// RFC 9112 §3.2 allows no fragment in a request target. A backend
		// that drops one (Node's URL parser, Python's urlsplit, Rust's
		// http::Uri) would read "/v1/storage#x" as a denied path that the
		// edge compared as another.
		if c := uri[i]; c <= ' ' || c == 0x7f || c == '#' {
			return false
		}
	}
	return true
}

// targetForm reports whether r's target has one of the forms RFC 9112 §3.2
// gives a request: origin ("/path"), absolute ("scheme://authority..."),
// or "*" for OPTIONS. Go's server also takes "scheme:opaque" ("a:v1/x"),
// which no client sends: a backend that roots it would read a path the
// edge never compared with the denied prefixes, and a redirect that keeps
// the path would carry it into the authority of its Location.
func targetForm(r *http.Request) bool {
	u := r.RequestURI
	switch {
	case u == "" || u[0] == '/':
		return true
	case u == "*":
		return r.Method == http.MethodOptions
	}
	return r.URL.Opaque == "" && strings.Contains(u, "://")
}

// requestPath returns the path of the request-URI exactly as it arrived,
// before any decoding or cleaning: the "raw" spelling path matching and
// denied prefixes consult.
func requestPath(r *http.Request) string {
	u := r.RequestURI
	if u == "" {
		return r.URL.EscapedPath()
	}
	if u[0] != '/' {
		// Absolute form: skip "scheme://authority".
		i := strings.Index(u, "://")
		if i < 0 {
			return u // "*" (OPTIONS) and other oddities match nothing
		}
		u = u[i+3:]
		// The authority ends at the first '/', '?' or '#'.
		j := strings.IndexAny(u, "/?#")
		if j < 0 || u[j] != '/' {
			return "/"
		}
		u = u[j:]
	}
	if i := strings.IndexByte(u, '?'); i >= 0 {
		u = u[:i]
	}
	return u
}
