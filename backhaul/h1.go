package backhaul

// Every request but an upgrade, CONNECT, one with trailers and one that
// expects 100-continue takes a small HTTP/1.1 client of the package's own
// (internal/h1: the pool, the response-head parser, the body readers)
// rather than http.Transport: the request is written and its response
// read on the handler's goroutine, over a pooled keep-alive connection.
// http.Transport hands every request to a persistConn's writeLoop and
// takes the response from its readLoop, which costs two goroutine
// wake-ups, several channel operations, a context and ~60 allocations per
// request, and keeps a goroutine blocked on every idle connection. The
// request's header is written straight from the client's, without
// building an outbound map (h1request.go), and the response head is
// parsed straight into the client's response header (h1response.go). A
// request with a body (read whole first up to 64 KiB, streamed beyond)
// has it written by a second goroutine while the response is read, so
// that an upstream's early answer reaches the client (roundTripH1Body).
// This file is the exchange: retries, timeouts and that second goroutine.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/scafo/scafo-edge/backhaul/internal/h1"
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

// errInvalidRequest is a request the pooled client cannot write: a byte
// HTTP/1.1 does not allow in its method, target or a header. Like the
// h1 package's errors it matches nothing exported: Forward wraps it in
// ErrUpstreamFailed.
var errInvalidRequest = errors.New("request cannot be written as HTTP/1.1")

// exchangeH1 is exchange on the pooled client: it sends out to addr over
// a pooled connection and reads the response head into the connection's
// Head. A connection that fails is closed here; one that answered is
// relayH1's to release.
func (p *Proxy) exchangeH1(out *outbound, addr string) (answer, error) {
	ctx := out.r.Context()
	start := time.Now()
	var headBy time.Time
	if p.responseHeaderTimeout > 0 {
		// Counted from the start rather than from the request's write, as
		// the transport counts it: the difference is one write to a
		// connected socket.
		headBy = start.Add(p.responseHeaderTimeout)
	}
	pc, reused, err := p.pool.Get(ctx, addr, start)
	if err != nil {
		return answer{}, &connectError{addr: addr, err: err}
	}
	for {
		resend, err := p.roundTripH1(pc, out, start, headBy)
		if err == nil {
			return answer{pc: pc}, nil
		}
		pc.NC.Close()
		// A pooled connection may have been closed by the upstream just
		// as it was taken (the keep-alive race, which the peek before
		// reuse narrows but cannot close). Only then is the request sent
		// again, on a new connection, and only when roundTripH1 proved
		// that doing so cannot repeat an action.
		if !reused || !resend || ctx.Err() != nil {
			return answer{}, err
		}
		if pc, err = p.pool.Dial(ctx, addr); err != nil {
			return answer{}, &connectError{addr: addr, err: err}
		}
		reused = false
	}
}

// cutShortError reports a response body the upstream broke off after the
// response head was relayed.
type cutShortError struct{ err error }

func (e *cutShortError) Error() string { return e.err.Error() }
func (e *cutShortError) Unwrap() error { return e.err }

// roundTripH1 sends r on pc and reads the response head into pc.Head.
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
func (p *Proxy) roundTripH1(pc *h1.Conn, out *outbound, now, headBy time.Time) (resend bool, err error) {
	r := out.r
	before := pc.Written()
	if out.body != nil {
		// The response-header timeout counts from the body's last byte
		// (roundTripH1Body), as the transport counts it: an upload takes
		// as long as the client takes to send it.
		pc.Begin(r.Context(), now, time.Time{})
		return p.roundTripH1Body(pc, out, before)
	}
	pc.Begin(r.Context(), now, headBy)
	werr := p.writeRequest(pc.BW, r, out.fwd, pc.Addr, nil)
	sent := pc.Written() > before
	if werr != nil && (!sent || h1.IsTimeout(werr) || errors.Is(werr, errInvalidRequest)) {
		return !sent && !h1.IsTimeout(werr) && !errors.Is(werr, errInvalidRequest), werr
	}
	anyRead, err := pc.ReadHead(r.Method == http.MethodHead)
	if err == nil {
		if werr != nil {
			// Answered before the whole request was taken: what follows
			// on this connection cannot be trusted to frame.
			pc.Head.KeepAlive = false
		}
		return false, nil
	}
	if werr != nil {
		err = werr
	}
	return !anyRead && !h1.IsTimeout(err) && idempotent(r), err
}

// roundTripH1Body is roundTripH1 for a request with a body. The request is
// written by another goroutine while this one reads the response: an
// upstream may answer before it has read the whole body (a 413, a 201 and
// close), and that answer must reach the client while the body is still
// being sent, or after sending it failed. A client that leaves ends the
// exchange at once. When a response head arrives, the writer may still be
// running; endWrite waits for it once the response has been relayed.
func (p *Proxy) roundTripH1Body(pc *h1.Conn, out *outbound, before int64) (resend bool, err error) {
	if pc.Wrote == nil {
		pc.Wrote = make(chan error, 1)
	}
	pc.HeadState.Store(headAwaited)
	pc.HeadTimer = nil
	// The writer gets copies: out, on Forward's stack, must not escape to
	// it.
	r, body, fwd := out.r, out.body, out.fwd
	go func() {
		err := p.writeRequest(pc.BW, r, fwd, pc.Addr, body)
		switch {
		case err == nil && p.responseHeaderTimeout > 0:
			pc.HeadTimer = time.AfterFunc(p.responseHeaderTimeout, func() {
				if pc.HeadState.CompareAndSwap(headAwaited, headTimedOut) {
					pc.NC.Close()
				}
			})
		case err != nil && (h1.IsTimeout(err) || body.clientFailed.Load() || errors.Is(err, errInvalidRequest)):
			// The request cannot be sent whole: the upstream stopped
			// reading, or the client's body broke off. The upstream
			// waits in vain for the rest, before its answer or while
			// sending it; closing ends the exchange for the reader too.
			pc.HeadState.CompareAndSwap(headAwaited, headAbandoned)
			pc.NC.Close()
		}
		pc.Wrote <- err
	}()
	pc.StopWatch = context.AfterFunc(r.Context(), func() { pc.NC.Close() })
	anyRead, err := pc.ReadHead(r.Method == http.MethodHead)
	if err == nil && pc.HeadState.CompareAndSwap(headAwaited, headArrived) {
		return false, nil
	}
	pc.NC.Close()
	werr := awaitWriter(pc, out.w, body)
	pc.StopWatch()
	if pc.HeadTimer != nil {
		pc.HeadTimer.Stop()
	}
	switch pc.HeadState.Load() {
	case headTimedOut:
		return false, fmt.Errorf("read response head: %w", os.ErrDeadlineExceeded)
	case headAbandoned:
		// The writer gave up (and closed the connection under the
		// read, which may have had a head by then): its error decides.
		return false, werr
	}
	if h1.IsTimeout(err) || !body.replayable() {
		return false, err
	}
	if pc.Written() == before {
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
func endWrite(pc *h1.Conn, w http.ResponseWriter, body *requestBody) (complete bool) {
	select {
	case err := <-pc.Wrote:
		complete = err == nil
	default:
		// Usually the writer is done and about to say so; an upstream
		// that answered early and stopped reading gets a moment, as
		// http.Transport gives it (maxWriteWaitBeforeConnReuse).
		t := time.NewTimer(maxWriteWait)
		select {
		case err := <-pc.Wrote:
			complete = err == nil
		case <-t.C:
			pc.NC.Close()
			awaitWriter(pc, w, body)
		}
		t.Stop()
	}
	if pc.HeadTimer != nil && !pc.HeadTimer.Stop() {
		// It ran (finding the head arrived, so closing nothing) or is
		// about to: not stopped in time, it must not find a later
		// exchange on this connection.
		complete = false
	}
	// A watch that fired (the client left) is closing the connection.
	return pc.StopWatch() && complete
}

// awaitWriter returns the writer's result once nc is closed. A writer
// blocked writing to the upstream has failed already; one blocked reading
// the client's body (a client pausing its upload) is woken by a read
// deadline on the client's side, so that an answer is never held back for
// as long as the client pauses. The client cannot then send another
// request on its connection: its body was not read to the end.
func awaitWriter(pc *h1.Conn, w http.ResponseWriter, body *requestBody) error {
	if body.buffered != nil {
		// Sent from memory: the writer never waits on the client.
		return <-pc.Wrote
	}
	select {
	case err := <-pc.Wrote:
		return err
	default:
	}
	http.NewResponseController(w).SetReadDeadline(time.Now())
	return <-pc.Wrote
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
