package backhaul

// Preparing a client's request, once, for every attempt Forward makes: the
// path it takes, its body as the attempts read it, the forwarding policy
// applied to it and, for the transport, the request that carries it.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
)

// outbound is a client's request as every attempt sends it. Forward keeps
// it on its stack, so that preparing costs no allocation: nothing may keep
// a pointer to it past an exchange (roundTripH1Body hands its writer
// copies).
type outbound struct {
	r *http.Request
	// upgrade is the protocol the client asks to switch to, "" for none.
	upgrade string
	// pooled reports whether the pooled client takes the request (h1.go);
	// the transport takes the rest, sending req.
	pooled bool
	// body is the client's body, nil when it has none.
	body *requestBody
	// fwd is the forwarding policy both paths' writers follow.
	fwd forwarding
	// w is the client's response, through which a writer blocked reading
	// the client's body is woken (awaitWriter).
	w http.ResponseWriter
	// req is the request the transport sends, nil on the pooled path.
	req *http.Request
}

// prepare makes r ready for every attempt. An error is the client's
// failure to send its body.
func (p *Proxy) prepare(w http.ResponseWriter, r *http.Request) (outbound, error) {
	out := outbound{r: r, w: w, upgrade: upgradeProtocol(r.Header)}
	// The common request takes the pooled client (h1.go); the rest the
	// transport, with a request built for it.
	out.pooled = !p.h1Off && h1Eligible(r, out.upgrade)
	body, err := newRequestBody(r)
	if err != nil {
		return out, err
	}
	out.body = body
	out.fwd = p.forwardingFor(r)
	switch {
	case !out.pooled:
		out.req = transportRequest(r, &out.fwd, out.upgrade, body)
	case body != nil && body.buffered == nil:
		// The body is read while the response may already be written:
		// without this, Go's HTTP/1 server discards the rest of the body
		// when the response head goes out, and the upstream waits for
		// bytes that never come.
		http.NewResponseController(w).EnableFullDuplex()
	}
	return out, nil
}

// transportRequest builds the request the transport sends upstream for r,
// by the forwarding policy f. Every attempt sends it, or a copy (see
// Proxy.exchange); its URL host is set per attempt.
func transportRequest(r *http.Request, f *forwarding, upgrade string, body *requestBody) *http.Request {
	// What the request points into, allocated once rather than piece by
	// piece.
	parts := &struct {
		url  url.URL
		vals [4]string // backing for the X-Forwarded-* and X-Request-Id values
	}{}
	parts.url.Scheme = "http"
	setTarget(&parts.url, r)
	base := http.Request{
		Method:        r.Method,
		URL:           &parts.url,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        outboundHeader(r, f, upgrade, &parts.vals),
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
	// refuse data beyond a declared length, so zero means no body there
	// once the stream has ended.
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	if r.ContentLength == 0 && r.ProtoMajor >= 2 {
		// Only a client that wrote "content-length: 0" can have left its
		// stream open with a length of zero: one that ended the stream
		// with its headers (every GET) declared nothing, and is not read,
		// which would also answer an Expect it sent with a 100.
		if _, declared := r.Header["Content-Length"]; declared {
			return nil, awaitEndOfStream(r.Body)
		}
		return nil, nil
	}
	dropForbiddenTrailers(r.Trailer, r.Header["Connection"])
	body := &requestBody{rc: r.Body, length: r.ContentLength, trailer: r.Trailer, conn: r.Header["Connection"]}
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

// awaitEndOfStream reads the body of an HTTP/2 or HTTP/3 request that
// declared a length of zero but left its stream open, until the stream
// ends. Data beyond the declared zero makes the request malformed (RFC 9113
// §8.1.1), and the server resets the stream when it reads that data; waiting
// for the end here makes that reset come before anything is forwarded,
// rather than race the upstream's answer. A well-formed client ends the
// stream with its next frame.
func awaitEndOfStream(body io.Reader) error {
	bp := copyBufs.Get().(*[]byte) // a local buffer would escape through Read
	defer copyBufs.Put(bp)
	n, err := io.ReadFull(body, (*bp)[:1])
	switch {
	case n > 0:
		return errors.New("read request body: data beyond a content-length of 0")
	case errors.Is(err, io.EOF):
		return nil
	default:
		return fmt.Errorf("read request body: %w", err)
	}
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
// origin or an ID for the request (an upstream that merges trailers into
// headers would believe them). The server adds every field of a chunked
// body's trailer section to it, announced or not.
func dropForbiddenTrailers(tr http.Header, conn []string) {
	for k := range tr {
		if forbiddenTrailer(k) || isForwarding(k) || k == headerXRequestID || aliasesProtected(k) || hasToken(conn, k) {
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
	conn         []string    // the request's Connection: the fields it names are hop-by-hop, trailers too
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
		dropForbiddenTrailers(b.trailer, b.conn)
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
