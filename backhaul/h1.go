package backhaul

// Every request but an upgrade, CONNECT, one with trailers and one that
// expects 100-continue takes a small HTTP/1.1 client of the package's own
// rather than http.Transport: a bodiless request is written and its
// response read on the handler's goroutine, over a pooled keep-alive
// connection. http.Transport hands every request to a persistConn's
// writeLoop and takes the response from its readLoop, which costs two
// goroutine wake-ups, several channel operations, a context and ~60
// allocations per request, and keeps a goroutine blocked on every idle
// connection (issue 8). The request's header is written straight from the
// client's, without building an outbound map, and the response head is
// parsed straight into the client's response header. A request with a
// body has its body written by a second goroutine while the response is
// read, so that an upstream's early answer reaches the client
// (roundTripH1Body).

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/scafo/scafo-edge/node"
)

// h1Eligible reports whether r takes the pooled client: anything but an
// upgrade, CONNECT, a request with trailers or one that expects 100-continue.
func h1Eligible(r *http.Request, upgrade string) bool {
	if upgrade != "" || r.Method == http.MethodConnect || len(r.Trailer) > 0 {
		return false
	}
	_, expect := r.Header["Expect"]
	return !expect
}

// Failures of the pooled client that are not I/O errors. They match
// nothing exported: Forward wraps them in ErrUpstreamFailed.
var (
	errMalformedResponse = errors.New("malformed HTTP response")
	errHeaderTooLarge    = errors.New("response header too large")
	errUnaskedSwitch     = errors.New("101 switching protocols without an upgrade asked for")
	errInvalidRequest    = errors.New("request cannot be written as HTTP/1.1")
)

// tryH1 is try for a request the pooled client takes: it sends r, with
// body (nil for none), to u and, when u answers, writes the response to w.
// It reports whether connecting failed, the one case where the next
// upstream may be tried.
func (p *Proxy) tryH1(w http.ResponseWriter, r *http.Request, body *requestBody, u node.Upstream, s *hostState, res *Result) (connectFailed bool, err error) {
	ctx := r.Context()
	start := time.Now()
	var headBy time.Time
	if p.rhTimeout {
		// Counted from the start rather than from the request's write, as
		// the transport counts it: the difference is one write to a
		// connected socket.
		headBy = start.Add(p.rhTimeoutDur)
	}
	pc, reused, err := p.pool.get(ctx, u.Address, start)
	if err != nil {
		return p.failed(r, body, u, s, err)
	}
	for {
		var resend bool
		if resend, err = p.roundTripH1(pc, r, body, start, headBy); err == nil {
			break
		}
		pc.nc.Close()
		// A pooled connection may have been closed by the upstream just
		// as it was taken (the keep-alive race, which the peek before
		// reuse narrows but cannot close). Only then is the request sent
		// again, on a new connection, and only when roundTripH1 proved
		// that doing so cannot repeat an action.
		if !reused || !resend || ctx.Err() != nil {
			return p.failed(r, body, u, s, err)
		}
		if pc, err = p.pool.dial(ctx, u.Address); err != nil {
			return p.failed(r, body, u, s, err)
		}
		reused = false
	}
	p.connected(u, s)
	clean, err := p.respondH1(w, r, pc, res)
	if body != nil {
		clean = pc.endWrite() && clean
		res.BytesIn = body.sent()
	}
	pc.rd.end()
	if clean && pc.reusable() {
		// Stamped with the exchange's start: the idle time is
		// overestimated by the exchange, which only makes the idle
		// timeout close it a little sooner.
		p.pool.put(pc, start)
	} else {
		pc.nc.Close()
	}
	var cut *cutShortError
	if errors.As(err, &cut) {
		// Closing the client's connection is what shows it the
		// truncation; over HTTP/2 this panics, so it comes last.
		abort(w)
	}
	return false, err
}

// cutShortError reports a response body the upstream broke off after the
// response head was relayed.
type cutShortError struct{ err error }

func (e *cutShortError) Error() string { return e.err.Error() }
func (e *cutShortError) Unwrap() error { return e.err }

// reusable reports whether pc may carry another request once its response
// was read to its end: the upstream wants to keep it, nothing it sent is
// left unread, and the response did not declare a body it does not carry.
// A HEAD, 204 or 304 response with a length or chunked framing is where an
// upstream that gets framing wrong sends the body anyway, a moment later,
// where the next request's response is expected (issue 13): the peek
// before reuse sees such bytes only if they arrived before it looked.
func (pc *h1Conn) reusable() bool {
	return pc.head.keepAlive && pc.br.Buffered() == 0 && !pc.head.declaredUnsent
}

// roundTripH1 sends r on pc and reads the response head into pc.head.
// When it fails, resend reports whether r may be sent again on another
// connection without risk of the upstream acting on it twice:
//   - when none of its bytes were written, for every method;
//   - when it was written (in part or whole) but the connection failed
//     before a byte of any response arrived and no timeout fired, for an
//     idempotent request only (the keep-alive race, as http.Transport
//     decides it);
//
// and in both cases only if its body, if any, can be sent again whole.
//
// A timeout is never a reason to resend: the upstream may be working on the
// request, slowly. A write that failed part way is not "nothing was sent":
// the upstream may have read the request's start and answered early (a 413
// before closing), and that answer is read and relayed.
func (p *Proxy) roundTripH1(pc *h1Conn, r *http.Request, body *requestBody, now, headBy time.Time) (resend bool, err error) {
	before := pc.out.written.Load()
	if body != nil {
		// The response-header timeout counts from the body's last byte
		// (roundTripH1Body), as the transport counts it: an upload takes
		// as long as the client takes to send it.
		pc.rd.begin(r.Context(), now, time.Time{})
		return p.roundTripH1Body(pc, r, body, before)
	}
	pc.rd.begin(r.Context(), now, headBy)
	werr := p.writeRequest(pc.bw, r, pc.addr, nil)
	sent := pc.out.written.Load() > before
	if werr != nil && (!sent || isTimeout(werr) || errors.Is(werr, errInvalidRequest)) {
		return !sent && !isTimeout(werr) && !errors.Is(werr, errInvalidRequest), werr
	}
	anyRead, err := pc.readHead(r.Method == http.MethodHead)
	if err == nil {
		if werr != nil {
			// Answered before the whole request was taken: what follows
			// on this connection cannot be trusted to frame.
			pc.head.keepAlive = false
		}
		return false, nil
	}
	if werr != nil {
		err = werr
	}
	return !anyRead && !isTimeout(err) && idempotent(r), err
}

// roundTripH1Body is roundTripH1 for a request with a body. The request is
// written by another goroutine while this one reads the response: an
// upstream may answer before it has read the whole body (a 413, a 201 and
// close), and that answer must reach the client while the body is still
// being sent, or after sending it failed. A client that leaves ends the
// exchange at once. When a response head arrives, the writer may still be
// running; endWrite waits for it once the response has been relayed.
func (p *Proxy) roundTripH1Body(pc *h1Conn, r *http.Request, body *requestBody, before int64) (resend bool, err error) {
	if pc.wrote == nil {
		pc.wrote = make(chan error, 1)
	}
	pc.head.state.Store(headAwaited)
	pc.headTimer = nil
	go func() {
		err := p.writeRequest(pc.bw, r, pc.addr, body)
		switch {
		case err == nil && p.rhTimeout:
			pc.headTimer = time.AfterFunc(p.rhTimeoutDur, func() {
				if pc.head.state.CompareAndSwap(headAwaited, headTimedOut) {
					pc.nc.Close()
				}
			})
		case err != nil && (isTimeout(err) || body.clientFailed.Load() || errors.Is(err, errInvalidRequest)) &&
			pc.head.state.CompareAndSwap(headAwaited, headAbandoned):
			// No answer is coming: the upstream stopped reading, or the
			// request could not be sent whole. Closing wakes the reader.
			pc.nc.Close()
		}
		pc.wrote <- err
	}()
	pc.stopWatch = context.AfterFunc(r.Context(), func() { pc.nc.Close() })
	anyRead, err := pc.readHead(r.Method == http.MethodHead)
	if err == nil && pc.head.state.CompareAndSwap(headAwaited, headArrived) {
		return false, nil
	}
	pc.nc.Close()
	werr := <-pc.wrote
	pc.stopWatch()
	if pc.headTimer != nil {
		pc.headTimer.Stop()
	}
	if pc.head.state.Load() == headTimedOut {
		return false, fmt.Errorf("read response head: %w", os.ErrDeadlineExceeded)
	}
	if werr != nil && (isTimeout(werr) || errors.Is(werr, errInvalidRequest)) {
		// The writer gave up and closed the connection under the read.
		return false, werr
	}
	if isTimeout(err) || !body.replayable() {
		return false, err
	}
	if pc.out.written.Load() == before {
		return true, err
	}
	return !anyRead && idempotent(r), err
}

// The states of a request-with-body's response head, between the reader,
// the writer and the response-header timer: whichever moves it first from
// headAwaited decides, so the timer never closes a connection whose head
// arrived, and the reader never relays a head the timer gave up on.
const (
	headAwaited int32 = iota
	headArrived
	headTimedOut
	headAbandoned // the writer gave up
)

// endWrite waits for the writer of a request body once its response has
// been relayed, and reports whether the whole request was sent. A writer
// still running means the upstream answered without reading the whole
// body: the connection is closed to stop it, and cannot carry another
// request.
func (pc *h1Conn) endWrite() (complete bool) {
	select {
	case err := <-pc.wrote:
		complete = err == nil
	default:
		// Usually the writer is done and about to say so; an upstream
		// that answered early and stopped reading gets a moment, as
		// http.Transport gives it (maxWriteWaitBeforeConnReuse).
		t := time.NewTimer(maxWriteWait)
		select {
		case err := <-pc.wrote:
			complete = err == nil
		case <-t.C:
			pc.nc.Close()
			<-pc.wrote
		}
		t.Stop()
	}
	if pc.headTimer != nil && !pc.headTimer.Stop() {
		// It ran (finding the head arrived, so closing nothing) or is
		// about to: not stopped in time, it must not find a later
		// exchange on this connection.
		complete = false
	}
	// A watch that fired (the client left) is closing the connection.
	return pc.stopWatch() && complete
}

// maxWriteWait is how long a relayed response waits for its request's
// writer before the connection is given up.
const maxWriteWait = 50 * time.Millisecond

// idempotent reports whether resending r cannot repeat an action: a safe
// method, or an idempotency key the client chose (as http.Transport
// decides).
func idempotent(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, k1 := r.Header["Idempotency-Key"]
	_, k2 := r.Header["X-Idempotency-Key"]
	return k1 || k2
}

// writeRequest writes r's head to bw, then body (nil for none), and
// flushes them: the original request-URI bytes (DESIGN.md rule 4), the
// Host, the end-to-end headers and the X-Forwarded-* set, by the rules
// outboundHeader applies for the transport. Nothing is allocated for the
// head: values are written where they are.
func (p *Proxy) writeRequest(bw *bufio.Writer, r *http.Request, addr string, body *requestBody) error {
	target := r.RequestURI
	if target == "" || (target[0] != '/' && target != "*") {
		// Absolute form, or a request built in process: its path and
		// query in escaped form, as an upstream expects origin form.
		target = r.URL.RequestURI()
	}
	host := r.Host
	if host == "" {
		host = addr
	}
	if !validMethod(r.Method) || !validTarget(target) || !validValue(host) {
		return errInvalidRequest
	}
	bw.WriteString(r.Method)
	bw.WriteByte(' ')
	bw.WriteString(target)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(host)
	bw.WriteString("\r\n")

	in := r.Header
	conn := in["Connection"]
	client, clientOK := clientAddr(r.RemoteAddr)
	trusted := clientOK && p.isTrusted(client)
	var priorXFF []string
	hasProto, hasXFHost := false, false
	for k, vs := range in {
		if isHopByHop(k) || k == "Host" || k == "Content-Length" ||
			(conn != nil && namedByConnection(conn, k)) || aliasesProtected(k) {
			continue
		}
		if isForwarding(k) {
			if !trusted {
				continue
			}
			switch k {
			case headerXFF:
				priorXFF = vs
				continue
			case headerXFProto:
				hasProto = true
			case headerXFHost:
				hasXFHost = true
			}
		}
		if !validToken(k) {
			return errInvalidRequest
		}
		for _, v := range vs {
			if !validValue(v) {
				return errInvalidRequest
			}
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	// "TE: trailers" is the one TE value a proxy that forwards trailers
	// may pass on (gRPC clients send it).
	if te := in["Te"]; te != nil && hasToken(te, "trailers") {
		bw.WriteString("Te: trailers\r\n")
	}
	if clientOK {
		bw.WriteString("X-Forwarded-For: ")
		for _, v := range priorXFF {
			if !validValue(v) {
				return errInvalidRequest
			}
			bw.WriteString(v)
			bw.WriteString(", ")
		}
		bw.Write(client.AppendTo(bw.AvailableBuffer()))
		bw.WriteString("\r\n")
	}
	if !hasProto {
		if r.TLS != nil {
			bw.WriteString("X-Forwarded-Proto: https\r\n")
		} else {
			bw.WriteString("X-Forwarded-Proto: http\r\n")
		}
	}
	if !hasXFHost && r.Host != "" {
		bw.WriteString("X-Forwarded-Host: ")
		bw.WriteString(r.Host)
		bw.WriteString("\r\n")
	}
	switch {
	case body != nil && body.length >= 0:
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(bw.AvailableBuffer(), body.length, 10))
		bw.WriteString("\r\n")
	case body != nil:
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	case r.Method != http.MethodGet && r.Method != http.MethodHead:
		// Many servers expect a length on a bodiless POST or DELETE; GET
		// and HEAD go without (as http.Transport writes them).
		bw.WriteString("Content-Length: 0\r\n")
	}
	bw.WriteString("\r\n")
	if body != nil {
		if err := writeBody(bw, body); err != nil {
			return err
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write request: %w", err)
	}
	return nil
}

// writeBody writes body to bw: its declared length exactly, or chunked
// when the length is unknown. A streamed body is flushed as it is read,
// the head first, so that an upload flows and an upstream can answer from
// the head alone. A body that ends short of its declared length is the
// client's failure (body.clientFailed is set).
func writeBody(bw *bufio.Writer, body *requestBody) error {
	if body.buffered != nil {
		if _, err := bw.Write(body.buffered); err != nil {
			return fmt.Errorf("write request body: %w", err)
		}
		return nil
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write request: %w", err)
	}
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	left := body.length
	for left != 0 {
		chunk := buf
		if left > 0 && int64(len(chunk)) > left {
			chunk = chunk[:left]
		}
		n, rerr := body.Read(chunk)
		if n > 0 {
			var err error
			if left > 0 {
				left -= int64(n)
				bw.Write(chunk[:n])
				err = bw.Flush()
			} else {
				err = writeChunk(bw, chunk[:n])
			}
			if err != nil {
				return fmt.Errorf("write request body: %w", err)
			}
		}
		switch {
		case rerr == io.EOF && left > 0:
			body.clientFailed.Store(true)
			return fmt.Errorf("read request body: %w", io.ErrUnexpectedEOF)
		case rerr == io.EOF:
			left = 0
		case rerr != nil:
			return fmt.Errorf("read request body: %w", rerr)
		}
	}
	if body.length < 0 {
		// The last chunk; the request's trailers are the transport's.
		bw.WriteString("0\r\n\r\n")
	}
	return nil
}

// writeChunk writes p as one chunk and flushes it.
func writeChunk(bw *bufio.Writer, p []byte) error {
	bw.Write(strconv.AppendInt(bw.AvailableBuffer(), int64(len(p)), 16))
	bw.WriteString("\r\n")
	bw.Write(p)
	bw.WriteString("\r\n")
	return bw.Flush()
}

// h1Head is the parsed head of the response being read on a connection.
type h1Head struct {
	status    int
	keepAlive bool
	body      bodyKind
	length    int64 // for bodyFixed
	// declaredUnsent: a response without a body (HEAD, 204, 304) that
	// declared a non-zero length or chunked framing anyway.
	declaredUnsent bool
	// state is the head's, for a request with a body (headAwaited…).
	state atomic.Int32

	// raw holds the canonical keys and the values of the header lines
	// back to back; fields index it. Once the head is read it is copied
	// into one string, so the whole header costs one allocation for its
	// text and one for its value slices.
	raw      []byte
	fields   []h1Field
	conn     []string // the Connection header's values
	trailers []string // the keys the Trailer header announces
}

type h1Field struct {
	kOff, kLen, vOff, vLen int
	key, value             string
}

type bodyKind uint8

const (
	bodyNone    bodyKind = iota
	bodyFixed            // Content-Length
	bodyChunked          // Transfer-Encoding: chunked
	bodyToClose          // neither: the body ends when the upstream closes
)

// readHead reads a response head on pc into pc.head, skipping 1xx
// responses (not passed on, as with the transport; their bytes count
// against the 1 MiB bound on the head, which is what bounds them). anyRead reports whether any byte of a response arrived, which
// tells a keep-alive race from an upstream failing mid-answer.
func (pc *h1Conn) readHead(headRequest bool) (anyRead bool, err error) {
	h := &pc.head
	total := 0
	for {
		h.reset()
		line, err := pc.readLine(&total)
		if err != nil {
			return total > 0, fmt.Errorf("read response status: %w", err)
		}
		var http10 bool
		if h.status, http10, err = parseStatusLine(line); err != nil {
			return true, err
		}
		if err := pc.readFields(&total); err != nil {
			return true, err
		}
		if h.status >= 200 {
			if err := h.finish(http10, headRequest); err != nil {
				return true, err
			}
			break
		}
		if h.status == http.StatusSwitchingProtocols {
			return true, errUnaskedSwitch
		}
	}
	pc.rd.headBy = time.Time{}
	return true, nil
}

func (h *h1Head) reset() {
	h.status, h.keepAlive, h.body, h.length, h.declaredUnsent = 0, false, bodyNone, 0, false
	if cap(h.raw) > 64<<10 {
		h.raw = nil // a huge head once should not stay with the connection
	}
	h.raw = h.raw[:0]
	clear(h.fields)
	h.fields = h.fields[:0]
	h.conn, h.trailers = h.conn[:0], h.trailers[:0]
}

// readLine reads one line of a head without its CRLF, counting its bytes
// in total against the 1 MiB bound on a response head. The line is valid
// until the next read.
func (pc *h1Conn) readLine(total *int) ([]byte, error) {
	line, err := pc.br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		// Longer than the read buffer (a large cookie): gather it.
		long := append([]byte(nil), line...)
		for err == bufio.ErrBufferFull && *total+len(long) <= maxResponseHeaderBytes {
			line, err = pc.br.ReadSlice('\n')
			long = append(long, line...)
		}
		line = long
	}
	*total += len(line)
	if *total > maxResponseHeaderBytes {
		return nil, errHeaderTooLarge
	}
	if err != nil {
		if err == io.EOF && *total > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// parseStatusLine parses "HTTP/1.1 200 OK"; the reason phrase is not kept
// (the client gets the standard one).
func parseStatusLine(line []byte) (status int, http10 bool, err error) {
	var rest []byte
	switch {
	case bytes.HasPrefix(line, []byte("HTTP/1.1 ")):
		rest = line[9:]
	case bytes.HasPrefix(line, []byte("HTTP/1.0 ")):
		rest, http10 = line[9:], true
	default:
		return 0, false, fmt.Errorf("%w: status line %q", errMalformedResponse, truncate(line))
	}
	if len(rest) < 3 || (len(rest) > 3 && rest[3] != ' ') {
		return 0, false, fmt.Errorf("%w: status line %q", errMalformedResponse, truncate(line))
	}
	for _, c := range rest[:3] {
		if c < '0' || c > '9' {
			return 0, false, fmt.Errorf("%w: status line %q", errMalformedResponse, truncate(line))
		}
		status = status*10 + int(c-'0')
	}
	if status < 100 {
		return 0, false, fmt.Errorf("%w: status %d", errMalformedResponse, status)
	}
	return status, http10, nil
}

func truncate(b []byte) []byte {
	if len(b) > 64 {
		return b[:64]
	}
	return b
}

// readFields reads header lines up to the empty line into pc.head.raw and
// pc.head.fields, canonicalising keys as net/textproto does.
func (pc *h1Conn) readFields(total *int) error {
	h := &pc.head
	for {
		line, err := pc.readLine(total)
		if err != nil {
			return fmt.Errorf("read response header: %w", err)
		}
		if len(line) == 0 {
			break
		}
		// Obsolete line folding: RFC 7230 §3.2.4 lets a proxy refuse the
		// message with a 502, which is rarer than any client mishandling
		// a fold it passed on.
		if line[0] == ' ' || line[0] == '\t' {
			return fmt.Errorf("%w: folded header line", errMalformedResponse)
		}
		i := bytes.IndexByte(line, ':')
		if i <= 0 || !validTokenBytes(line[:i]) {
			return fmt.Errorf("%w: header line %q", errMalformedResponse, truncate(line))
		}
		v := bytes.Trim(line[i+1:], " \t")
		if !validValueBytes(v) {
			return fmt.Errorf("%w: header line %q", errMalformedResponse, truncate(line))
		}
		f := h1Field{kOff: len(h.raw), kLen: i}
		h.raw = appendCanonical(h.raw, line[:i])
		f.vOff, f.vLen = len(h.raw), len(v)
		h.raw = append(h.raw, v...)
		h.fields = append(h.fields, f)
	}
	return nil
}

// finish turns the fields into strings and decides the body's framing
// (RFC 9112 §6) and whether the connection stays open. It is at least as
// strict as http.ReadResponse, field by field (FuzzResponseFraming holds
// it to that):
//   - Content-Length is digits only; repeated identical values are one
//     (copyHeader passes one on), anything else is malformed;
//   - Transfer-Encoding is one field saying "chunked", and overrides a
//     Content-Length, which is dropped; the connection is closed after
//     such a message (RFC 9112 §6.3: it may be an attempt at smuggling);
//   - on an HTTP/1.0 response Transfer-Encoding does not frame the body,
//     and the connection is closed after it (RFC 9112 §6.1);
//   - a Trailer announcing a framing field is malformed, as Go has it.
func (h *h1Head) finish(http10, headRequest bool) error {
	block := string(h.raw)
	connClose, connKeepAlive := false, false
	var length, te string
	nLength, nTE := 0, 0
	for i := range h.fields {
		f := &h.fields[i]
		f.key, f.value = block[f.kOff:f.kOff+f.kLen], block[f.vOff:f.vOff+f.vLen]
		switch f.key {
		case "Connection":
			h.conn = append(h.conn, f.value)
			connClose = connClose || hasToken([]string{f.value}, "close")
			connKeepAlive = connKeepAlive || hasToken([]string{f.value}, "keep-alive")
		case "Content-Length":
			if nLength > 0 && f.value != length {
				return fmt.Errorf("%w: differing Content-Length values", errMalformedResponse)
			}
			length = f.value
			nLength++
		case "Transfer-Encoding":
			te = f.value
			nTE++
		case "Trailer":
			for v := f.value; v != ""; {
				var k string
				k, v, _ = strings.Cut(v, ",")
				if k = strings.TrimSpace(k); k != "" {
					h.trailers = append(h.trailers, http.CanonicalHeaderKey(k))
				}
			}
		}
	}
	h.keepAlive = !connClose && (!http10 || connKeepAlive)
	chunked := false
	if nTE > 0 && !http10 {
		// Only chunked is understood, as by http.Transport; any other
		// coding would have to be delimited by the close.
		if nTE > 1 || !strings.EqualFold(te, "chunked") {
			return fmt.Errorf("%w: unsupported Transfer-Encoding %q", errMalformedResponse, te)
		}
		chunked = true
	}
	if nTE > 0 && (http10 || nLength > 0) {
		h.keepAlive = false
	}
	var n int64
	if nLength > 0 {
		var ok bool
		if n, ok = parseLength(length); !ok {
			return fmt.Errorf("%w: Content-Length %q", errMalformedResponse, truncate([]byte(length)))
		}
	}
	if chunked {
		for _, k := range h.trailers {
			if k == "Transfer-Encoding" || k == "Trailer" || k == "Content-Length" {
				return fmt.Errorf("%w: Trailer announces %s", errMalformedResponse, k)
			}
		}
	}
	switch {
	case headRequest || h.status == http.StatusNoContent || h.status == http.StatusNotModified:
		h.body = bodyNone
		h.declaredUnsent = chunked || n > 0
	case chunked:
		h.body = bodyChunked
	case nLength > 0:
		h.body, h.length = bodyFixed, n
		if n == 0 {
			h.body = bodyNone
		}
	default:
		h.body, h.keepAlive = bodyToClose, false
	}
	return nil
}

// parseLength parses a Content-Length value: decimal digits only, no sign,
// no list, at most 63 bits (as http.ReadResponse requires).
func parseLength(s string) (int64, bool) {
	if s == "" || len(s) > 19 {
		return 0, false
	}
	var n uint64 // 19 digits fit
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	return int64(n), n <= math.MaxInt64
}

// copyHeader copies the end-to-end fields into dst (w.Header()), sharing
// one backing array for their value slices. A repeated Content-Length
// (finish checked the values agree) is passed on once: two, even equal,
// make strict clients refuse the response.
func (h *h1Head) copyHeader(dst http.Header) {
	vals := make([]string, len(h.fields))
	for i := range h.fields {
		f := &h.fields[i]
		if isHopByHop(f.key) || (len(h.conn) > 0 && namedByConnection(h.conn, f.key)) {
			continue
		}
		if f.key == "Content-Length" && (h.body == bodyChunked || h.seenBefore(i, f.key)) {
			continue
		}
		vals[i] = f.value
		if prev, ok := dst[f.key]; ok && h.seenBefore(i, f.key) {
			dst[f.key] = append(prev, f.value)
			continue
		}
		dst[f.key] = vals[i : i+1 : i+1]
	}
}

// seenBefore reports whether a field before i has key: a repeated field
// (Set-Cookie) is appended to, a header dst had before is replaced.
func (h *h1Head) seenBefore(i int, key string) bool {
	for j := 0; j < i; j++ {
		if h.fields[j].key == key {
			return true
		}
	}
	return false
}

// respondH1 writes the response whose head pc.head holds to w, then its
// body and trailers. clean reports whether the body was read to its end,
// leaving the connection ready for another request.
func (p *Proxy) respondH1(w http.ResponseWriter, r *http.Request, pc *h1Conn, res *Result) (clean bool, err error) {
	head := &pc.head
	hdr := w.Header()
	head.copyHeader(hdr)
	noSniff(hdr)
	body := pc.bodyReader()
	if head.body == bodyChunked {
		// Trailers the upstream announced are announced to the client
		// too, so that the body is chunked and they can follow it.
		for _, k := range head.trailers {
			if !forbiddenTrailer(k) {
				hdr.Add("Trailer", k)
			}
		}
	}
	w.WriteHeader(head.status)
	res.Status = head.status
	if body == nil {
		return true, nil
	}
	// A body of unknown length may be a stream (server-sent events, long
	// poll, chunked progress): each piece goes out as it arrives. A body of
	// known length is left to the server's buffering.
	var rc *http.ResponseController
	if head.body != bodyFixed || isEventStream(hdr) {
		rc = http.NewResponseController(w)
		if err := rc.Flush(); err != nil {
			return false, clientGone(err)
		}
	}
	pool := &copyBufs
	if rc == nil && head.body == bodyFixed {
		pool = copyBufPool(head.length)
	}
	n, rerr, werr := copyBody(w, body, rc, pool)
	res.BytesOut = n
	switch {
	case werr != nil || r.Context().Err() != nil:
		return false, clientGone(errors.Join(werr, r.Context().Err()))
	case rerr != nil:
		// The upstream broke off mid-body; tryH1 closes the client's
		// connection to show the truncation, once this one is released.
		return false, &cutShortError{fmt.Errorf("read response body from %s: %w", res.Address, rerr)}
	}
	if head.body == bodyChunked {
		for _, t := range pc.chunks.trailer {
			if !forbiddenTrailer(t[0]) {
				hdr[http.TrailerPrefix+t[0]] = append(hdr[http.TrailerPrefix+t[0]], t[1])
			}
		}
	}
	return true, nil
}

// bodyReader returns the reader of the body whose head pc.head holds, nil
// when it has none.
func (pc *h1Conn) bodyReader() io.Reader {
	switch pc.head.body {
	case bodyFixed:
		pc.fixed.left = pc.head.length
		return &pc.fixed
	case bodyChunked:
		pc.chunks.reset()
		return &pc.chunks
	case bodyToClose:
		return &pc.close
	}
	return nil
}

// fixedBody reads a body delimited by Content-Length.
type fixedBody struct {
	br   *bufio.Reader
	left int64
}

func (b *fixedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.br.Read(p)
	b.left -= int64(n)
	if b.left == 0 {
		return n, io.EOF
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// closeBody reads a body delimited by the upstream closing the connection.
type closeBody struct{ br *bufio.Reader }

func (b *closeBody) Read(p []byte) (int, error) { return b.br.Read(p) }

// chunkedBody decodes a chunked body (RFC 7230 §4.1) and keeps its
// trailers. Each Read returns data of one chunk, so a stream's chunks are
// passed on as they arrive.
type chunkedBody struct {
	br      *bufio.Reader
	left    uint64 // bytes of the current chunk not yet read
	inChunk bool   // a chunk's data was begun: its CRLF is due after it
	err     error  // sticky: io.EOF once the last chunk and trailers are read
	trailer [][2]string
}

// Bounds on the framing of a chunked body, so an upstream cannot make the
// edge buffer without end.
const maxChunkLine = 4 << 10

func (c *chunkedBody) reset() {
	c.left, c.inChunk, c.err = 0, false, nil
	c.trailer = c.trailer[:0]
}

func (c *chunkedBody) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if c.left == 0 {
		if c.inChunk {
			if c.err = c.readCRLF(); c.err != nil {
				return 0, c.err
			}
			c.inChunk = false
		}
		size, err := c.readSize()
		if err != nil {
			c.err = err
			return 0, err
		}
		if size == 0 {
			if c.err = c.readTrailer(); c.err == nil {
				c.err = io.EOF
			}
			return 0, c.err
		}
		c.left, c.inChunk = size, true
	}
	if uint64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.br.Read(p)
	c.left -= uint64(n)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		c.err = err
	}
	return n, err
}

func (c *chunkedBody) readCRLF() error {
	b, err := c.br.Peek(2)
	if err != nil {
		return unexpected(err)
	}
	if b[0] != '\r' || b[1] != '\n' {
		return fmt.Errorf("%w: chunk not followed by CRLF", errMalformedResponse)
	}
	c.br.Discard(2)
	return nil
}

func (c *chunkedBody) line() ([]byte, error) {
	line, err := c.br.ReadSlice('\n')
	if err == bufio.ErrBufferFull || len(line) > maxChunkLine {
		return nil, fmt.Errorf("%w: chunk line too long", errMalformedResponse)
	}
	if err != nil {
		return nil, unexpected(err)
	}
	// A bare LF ends no line of chunked framing (RFC 9112 §7.1; Go
	// refuses it too): reading one as a line end is how framing is
	// desynchronised between two parsers.
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("%w: chunk line ends with a bare LF", errMalformedResponse)
	}
	return line[:len(line)-2], nil
}

func (c *chunkedBody) readSize() (uint64, error) {
	line, err := c.line()
	if err != nil {
		return 0, err
	}
	// As Go reads it: trailing whitespace goes, then the extension (not
	// passed on); what is left is the size, hex digits only.
	line = bytes.TrimRight(line, " \t")
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i]
	}
	if len(line) == 0 || len(line) > 16 {
		return 0, fmt.Errorf("%w: chunk size %q", errMalformedResponse, truncate(line))
	}
	var n uint64
	for _, b := range line {
		switch {
		case '0' <= b && b <= '9':
			b -= '0'
		case 'a' <= b && b <= 'f':
			b -= 'a' - 10
		case 'A' <= b && b <= 'F':
			b -= 'A' - 10
		default:
			return 0, fmt.Errorf("%w: chunk size %q", errMalformedResponse, truncate(line))
		}
		n = n<<4 | uint64(b)
	}
	return n, nil
}

// readTrailer reads the trailer section after the last chunk.
func (c *chunkedBody) readTrailer() error {
	total := 0
	for {
		line, err := c.line()
		if err != nil {
			return err
		}
		if len(line) == 0 {
			return nil
		}
		if total += len(line); total > maxResponseHeaderBytes {
			return errHeaderTooLarge
		}
		i := bytes.IndexByte(line, ':')
		if i <= 0 || !validTokenBytes(line[:i]) {
			return fmt.Errorf("%w: trailer line %q", errMalformedResponse, truncate(line))
		}
		v := bytes.Trim(line[i+1:], " \t")
		if !validValueBytes(v) {
			return fmt.Errorf("%w: trailer line %q", errMalformedResponse, truncate(line))
		}
		k := string(appendCanonical(nil, line[:i]))
		c.trailer = append(c.trailer, [2]string{k, string(v)})
	}
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// appendCanonical appends key in canonical form ("content-type" →
// "Content-Type"), as net/textproto does for a valid token.
func appendCanonical(dst, key []byte) []byte {
	upper := true
	for _, c := range key {
		switch {
		case upper && 'a' <= c && c <= 'z':
			c -= 'a' - 'A'
		case !upper && 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		dst = append(dst, c)
		upper = c == '-'
	}
	return dst
}

// tokenChars marks the bytes of an RFC 7230 token.
var tokenChars = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !tokenChars[s[i]] {
			return false
		}
	}
	return true
}

func validTokenBytes(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !tokenChars[c] {
			return false
		}
	}
	return true
}

func validMethod(m string) bool { return validToken(m) }

// validValue reports whether a header value has no control byte other than
// tab: a CR or LF would end the line and smuggle a header in.
func validValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

func validValueBytes(b []byte) bool {
	for _, c := range b {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// validTarget reports whether a request target can go on the request line:
// no space or control byte.
func validTarget(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c == 0x7f {
			return false
		}
	}
	return true
}
