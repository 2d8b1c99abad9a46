package backhaul

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/scafo/scafo-edge/backhaul/internal/h1"
	"github.com/scafo/scafo-edge/node"
)

// Errors Forward returns when it wrote nothing; the caller answers the client
// itself.
var (
	// ErrNoUpstream: no upstream produced a response, because none could be
	// connected or because the one connected failed before its response
	// headers (the edge answers 502).
	ErrNoUpstream = errors.New("no upstream answered")
	// ErrUpstreamTimeout: the upstream did not send response headers within
	// Options.ResponseHeaderTimeout (the edge answers 504).
	ErrUpstreamTimeout = errors.New("upstream response header timeout")
	// ErrUpstreamFailed: an upstream was connected but failed before its
	// response headers (reset, malformed response). An error that matches it
	// also matches ErrNoUpstream, so a caller may tell the cases apart in
	// its text without having to handle a third status.
	ErrUpstreamFailed = errors.New("upstream failed before responding")
)

// Result describes how Forward went, for access logs and metrics.
type Result struct {
	// Node and Address name the upstream that answered, or the last one
	// tried when none did; both are empty when none was tried.
	Node, Address string
	// Failovers counts the upstreams that could not be connected before the
	// last one tried.
	Failovers int
	// Status is the status code written to the client, 0 when Forward wrote
	// nothing.
	Status int
	// BytesIn counts the request body bytes read from the client, BytesOut
	// the response body bytes written to it; for an upgraded connection,
	// the bytes tunnelled each way.
	BytesIn, BytesOut int64
}

// Forward proxies r to the first usable upstream of ups, a priority list
// (never a weighting, docs/design.md rule 7). An upstream that cannot be
// connected is ejected for a while and the next one is tried, unseen by the
// client; ejected upstreams are skipped while another remains and are tried
// last, in order, rather than failing the request.
//
// When Result.Status is 0 nothing was written: the error matches
// ErrNoUpstream or ErrUpstreamTimeout and the caller answers 502 or 504, or
// it matches context.Canceled when the client went away first (nothing to
// answer; not an upstream failure). When Result.Status is set the response
// was written; an error then only reports a body cut short, and the client
// connection has already been closed so the client sees the truncation (on
// a connection that cannot be hijacked, HTTP/2, Forward panics with
// http.ErrAbortHandler instead, as httputil.ReverseProxy does).
func (p *Proxy) Forward(w http.ResponseWriter, r *http.Request, ups []node.Upstream) (Result, error) {
	var res Result
	if len(ups) == 0 {
		return res, fmt.Errorf("%w: empty upstream list", ErrNoUpstream)
	}
	upgrade := upgradeProtocol(r.Header)
	// The common request takes the pooled client (h1.go); the rest the
	// transport, with a request built for it.
	h1 := !p.h1Off && h1Eligible(r, upgrade)
	body, err := newRequestBody(r)
	if err != nil {
		return res, clientGone(err)
	}
	var out *http.Request
	if !h1 {
		out = p.outboundRequest(r, upgrade, body)
	}
	now := p.now()

	// Upstreams ejected when the request started get a turn only after
	// every other one failed to connect.
	var skipped indexSet
	var lastErr error
	tried := false
	for pass := 0; pass < 2; pass++ {
		for i, u := range ups {
			s := p.health.state(u, now)
			if pass == 0 && s.ejected(now) {
				skipped.add(i)
				continue
			}
			if pass == 1 && !skipped.has(i) {
				continue
			}
			if tried {
				// The transport may still touch the request it failed
				// from its own goroutines: each attempt gets its own.
				if !h1 {
					out = retarget(out)
				}
				res.Failovers++
				p.metrics.failover(res.Node)
			}
			tried = true
			res.Node, res.Address = u.Node, u.Address
			var connectFailed bool
			var err error
			if h1 {
				connectFailed, err = p.tryH1(w, r, body, u, s, &res)
			} else {
				connectFailed, err = p.try(w, r, out, body, u, s, upgrade, &res)
			}
			if !connectFailed {
				return res, err
			}
			lastErr = err
		}
		if skipped.empty() {
			break
		}
	}
	return res, fmt.Errorf("%w: %w", ErrNoUpstream, lastErr)
}

// indexSet is a set of small indexes; the first 64 cost no allocation,
// which covers any realistic upstream list.
type indexSet struct {
	lo uint64
	hi map[int]bool
}

func (s *indexSet) add(i int) {
	if i < 64 {
		s.lo |= 1 << i
		return
	}
	if s.hi == nil {
		s.hi = map[int]bool{}
	}
	s.hi[i] = true
}

func (s *indexSet) has(i int) bool {
	if i < 64 {
		return s.lo&(1<<i) != 0
	}
	return s.hi[i]
}

func (s *indexSet) empty() bool { return s.lo == 0 && len(s.hi) == 0 }

// try sends out to u and, when it answers, writes its response to w. It
// reports whether connecting failed, the one case where the next upstream
// may be tried.
func (p *Proxy) try(w http.ResponseWriter, r *http.Request, out *http.Request, body *requestBody,
	u node.Upstream, s *hostState, upgrade string, res *Result) (connectFailed bool, err error) {
	out.URL.Host = u.Address
	resp, rtErr := p.transport.RoundTrip(out)
	if rtErr == nil && (resp.StatusCode < 100 || resp.StatusCode > 999) {
		// Go's client takes "HTTP/1.1 099"; its server panics on it.
		resp.Body.Close()
		rtErr = fmt.Errorf("%w: status %d", h1.ErrMalformedResponse, resp.StatusCode)
	}
	if rtErr != nil {
		return p.failed(r, body, u, s, rtErr)
	}
	p.connected(u, s)
	err = p.respond(w, r, resp, upgrade, res)
	if body != nil {
		res.BytesIn += body.sent()
	}
	return false, err
}

// failed classifies a round trip that produced no response.
func (p *Proxy) failed(r *http.Request, body *requestBody, u node.Upstream, s *hostState, err error) (connectFailed bool, _ error) {
	ctx := r.Context()
	switch {
	case ctx.Err() != nil:
		return false, clientGone(ctx.Err())
	case body != nil && body.clientFailed.Load():
		// The client's upload broke off: its fault, not the upstream's.
		return false, clientGone(err)
	case isConnectError(err) && outOfDescriptors(err):
		// The edge ran out, not the upstream: ejecting it would turn
		// the edge's own shortage into an outage of every application
		// behind it.
		return true, err
	case isConnectError(err):
		p.connectFailed(u, s, err)
		return true, err
	}
	// Connected, so reachable: whatever went wrong next is no reason to
	// eject it, nor to try another (the request may have been acted on).
	p.connected(u, s)
	if h1.IsTimeout(err) {
		return false, fmt.Errorf("%w: %s: %w", ErrUpstreamTimeout, u.Address, err)
	}
	return false, fmt.Errorf("%w: %w: %s: %w", ErrNoUpstream, ErrUpstreamFailed, u.Address, err)
}

// outOfDescriptors reports whether a dial failed because this process or the
// system has no descriptor left.
func outOfDescriptors(err error) bool {
	return errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE)
}

// connectFailed ejects u and logs the first failure of an episode.
func (p *Proxy) connectFailed(u node.Upstream, s *hostState, err error) {
	n, d := p.health.connectFailed(s, p.now())
	p.metrics.connectFailure(u.Node)
	if n == 1 {
		p.log.Warn().Str("node", u.Node).Str("upstream", u.Address).Err(err).
			Dur("ejected_for", d).Msg("upstream connect failed; ejecting it")
	}
}

// connected clears u's failures and logs a recovery once.
func (p *Proxy) connected(u node.Upstream, s *hostState) {
	if n := p.health.connected(s); n > 0 {
		p.log.Info().Str("node", u.Node).Str("upstream", u.Address).Int32("failures", n).
			Msg("upstream recovered")
	}
}

// clientGone wraps the reason a client went away so that it matches
// context.Canceled: the caller must neither answer nor count a 502.
func clientGone(cause error) error {
	if errors.Is(cause, context.Canceled) {
		return fmt.Errorf("client gone: %w", cause)
	}
	return fmt.Errorf("client gone: %w: %w", context.Canceled, cause)
}

// outbound holds what a forwarded request points into, allocated once per
// request rather than piece by piece.
type outbound struct {
	url  url.URL
	vals [2]string // backing for X-Forwarded-For and X-Forwarded-Host
}

// outboundRequest builds the request the transport sends upstream, shared
// by every attempt (its URL host is set per attempt).
func (p *Proxy) outboundRequest(r *http.Request, upgrade string, body *requestBody) *http.Request {
	ob := &outbound{}
	ob.url.Scheme = "http"
	setTarget(&ob.url, r)
	base := http.Request{
		Method:        r.Method,
		URL:           &ob.url,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        p.outboundHeader(r, upgrade, &ob.vals),
		Host:          r.Host,
		ContentLength: r.ContentLength,
		// The server fills the declared trailers' values once the body is
		// read to its end, which is before the transport writes them.
		Trailer: r.Trailer,
	}
	if body != nil {
		base.Body = body
		// With GetBody set, the transport may resend the request on another
		// connection when a pooled one turned out dead before a byte was
		// written (Go's nothingWrittenError).
		base.GetBody = body.rewind
	}
	return base.WithContext(r.Context())
}

// newRequestBody returns r's body as the attempts read it, nil when r has
// none. A small body is read whole first (smallBody); failing to read it
// is the client's failure.
func newRequestBody(r *http.Request) (*requestBody, error) {
	// HTTP/1 hands a bodiless request http.NoBody. HTTP/2 and HTTP/3 hand
	// every request a body, an empty one when the length is zero: both
	// refuse data beyond a declared length, so zero means no body there.
	if r.Body == nil || r.Body == http.NoBody || (r.ContentLength == 0 && r.ProtoMajor >= 2) {
		return nil, nil
	}
	dropForbiddenTrailers(r.Trailer)
	body := &requestBody{rc: r.Body, length: r.ContentLength, trailer: r.Trailer}
	if smallBody(r) {
		b := make([]byte, r.ContentLength)
		if _, err := io.ReadFull(r.Body, b); err != nil {
			return nil, fmt.Errorf("read request body: %w", err)
		}
		body.buffered = b
		body.rc = io.NopCloser(bytes.NewReader(b))
	}
	return body, nil
}

// maxBufferedBody bounds the request bodies read whole before an upstream
// is chosen (as nginx buffers requests by default): a slow upload then
// holds no upstream connection, a client that leaves mid-upload never
// reaches the upstream, and the body can be sent again after a keep-alive
// race. Larger and unknown-length bodies stream.
const maxBufferedBody = 64 << 10

// smallBody reports whether r has a body read whole before forwarding.
func smallBody(r *http.Request) bool {
	return r.Body != nil && r.ContentLength > 0 && r.ContentLength <= maxBufferedBody &&
		len(r.TransferEncoding) == 0 && len(r.Trailer) == 0
}

// dropForbiddenTrailers deletes from a request's trailer the fields that
// may not travel as trailers (forbiddenTrailer) and those that claim an
// origin for the request (an upstream that merges trailers into headers
// would believe them). The server adds every field of a chunked body's
// trailer section to it, announced or not.
func dropForbiddenTrailers(tr http.Header) {
	for k := range tr {
		if forbiddenTrailer(k) || isForwarding(k) || aliasesProtected(k) {
			delete(tr, k)
		}
	}
}

// retarget copies out (shallowly: header and body are shared, the
// transport only reads them) with its own URL for another attempt.
func retarget(out *http.Request) *http.Request {
	u := *out.URL
	next := out.WithContext(out.Context())
	next.URL = &u
	return next
}

// setTarget sets u's request target so that the upstream receives r's
// original request-URI bytes: no cleaning, no unescaping, no prefix
// stripping (docs/design.md rule 4).
func setTarget(u *url.URL, r *http.Request) {
	ruri := r.RequestURI
	if ruri == "" || (ruri[0] != '/' && ruri != "*") {
		// Absolute form ("GET http://h/p HTTP/1.1") or a request built in
		// process: send the path and query in escaped form; an upstream
		// expects origin form.
		u.Path, u.RawPath = r.URL.Path, r.URL.RawPath
		u.RawQuery, u.ForceQuery = r.URL.RawQuery, r.URL.ForceQuery
		return
	}
	path, query, hasQuery := strings.Cut(ruri, "?")
	u.RawQuery, u.ForceQuery = query, hasQuery && query == ""
	if !strings.HasPrefix(path, "//") {
		// An opaque URL is written to the request line verbatim.
		u.Opaque = path
		return
	}
	// The transport would write an opaque "//x" as "http://x". As a path,
	// its escaped form is the raw bytes whenever they are a valid encoding,
	// which Go's server already required to accept the request.
	u.Path, u.RawPath = r.URL.Path, r.URL.RawPath
}

// requestBody is the client's body as the attempts read it. Its Close does
// nothing: the transport closes the body of a failed attempt, and the next
// attempt must still be able to send it (a failed connect never read it).
// The server closes the real body when the handler returns. Counters are
// atomic because the transport may still be writing the body after
// RoundTrip returned.
type requestBody struct {
	rc           io.ReadCloser
	length       int64       // the declared length, -1 for unknown
	buffered     []byte      // the whole body when read beforehand, else nil
	trailer      http.Header // the request's trailer, filled at the body's end
	n            atomic.Int64
	clientFailed atomic.Bool
}

func (b *requestBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.n.Add(int64(n))
	switch {
	case err == io.EOF:
		// The server has just filled the trailer; the transport writes
		// it next, from this goroutine.
		dropForbiddenTrailers(b.trailer)
	case err != nil && b.buffered == nil:
		b.clientFailed.Store(true)
	}
	return n, err
}

func (b *requestBody) Close() error { return nil }

// sent returns the body bytes read from the client.
func (b *requestBody) sent() int64 {
	if b.buffered != nil {
		return int64(len(b.buffered))
	}
	return b.n.Load()
}

// errBodyConsumed stops a retry whose body was already partly sent.
var errBodyConsumed = errors.New("request body already partly read; not replayable")

// replayable reports whether the body can be sent again from its start.
func (b *requestBody) replayable() bool {
	return b.buffered != nil || b.n.Load() == 0
}

// rewind returns the body again for a retry: a buffered body from its
// start, a streamed one only while nothing has been read from it.
func (b *requestBody) rewind() (io.ReadCloser, error) {
	if b.buffered != nil {
		return io.NopCloser(bytes.NewReader(b.buffered)), nil
	}
	if b.n.Load() > 0 {
		return nil, errBodyConsumed
	}
	return b, nil
}
