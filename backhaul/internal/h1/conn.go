package h1

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"
)

// Conn is one keep-alive connection to an upstream, used by one exchange
// at a time. Everything an exchange needs to talk over it (buffers, the
// parsed response head, the body readers) lives here and is reused, so a
// request on a pooled connection allocates almost nothing of its own.
type Conn struct {
	NC   net.Conn      // the connection itself; closing it ends any exchange
	BW   *bufio.Writer // the request is written here; flushed through the send bound
	Addr string        // the upstream's address, the pool's key
	Head Head          // the head ReadHead read last

	// For a request with a body, written by the caller's second goroutine
	// while this one reads the response: its result, the response-header
	// timer it starts once done, the stop of the watch that closes NC when
	// the client leaves, and which of the reader, the writer and the timer
	// decided the head's fate first. They live here to be reused with the
	// connection; this package never touches them.
	Wrote     chan error
	HeadTimer *time.Timer
	StopWatch func() bool
	HeadState atomic.Int32

	rd     tickReader   // between br and NC
	out    ProgressConn // between BW and NC
	peek   peeker       // on NC, before reuse
	br     *bufio.Reader
	idleAt time.Time // when it was last put back; zero for a new connection

	fixed  fixedBody
	chunks chunkedBody
	close  closeBody
}

// Buffer sizes: a response head and a small body arrive in one read; a
// request head almost always fits the writer, so it leaves in one write.
const (
	readBufSize  = 16 << 10
	writeBufSize = 4 << 10
)

// NewConn returns a Conn on nc, a connection to addr, whose writes fail
// once one makes no progress for sendTimeout (<= 0: no bound).
func NewConn(nc net.Conn, addr string, sendTimeout time.Duration) *Conn {
	pc := &Conn{NC: nc, Addr: addr}
	pc.rd.nc = nc
	pc.out = ProgressConn{Conn: nc, Timeout: sendTimeout}
	pc.peek.init(nc)
	pc.BW = bufio.NewWriterSize(&pc.out, writeBufSize)
	pc.setReader(&pc.rd)
	return pc
}

// setReader makes src the source of responses on pc.
func (pc *Conn) setReader(src io.Reader) {
	pc.br = bufio.NewReaderSize(src, readBufSize)
	pc.fixed.br, pc.chunks.br, pc.close.br = pc.br, pc.br, pc.br
}

// Reusable reports whether pc may carry another request once its response
// was read to its end: the upstream wants to keep it, nothing it sent is
// left unread, and the response did not declare a body it does not carry.
// A HEAD, 204 or 304 response with a length or chunked framing is where an
// upstream that gets framing wrong sends the body anyway, a moment later,
// where the next request's response is expected (a desynchronised stream): the peek
// before reuse sees such bytes only if they arrived before it looked.
func (pc *Conn) Reusable() bool {
	return pc.Head.KeepAlive && pc.br.Buffered() == 0 && !pc.Head.DeclaredUnsent
}

// Begin starts an exchange for ctx at now: a read waiting on the upstream
// returns ctx's error once ctx ends, and a timeout error once headBy (zero:
// none) passes before the response head is read.
func (pc *Conn) Begin(ctx context.Context, now, headBy time.Time) { pc.rd.begin(ctx, now, headBy) }

// End ends the exchange; the idle connection keeps no context alive.
func (pc *Conn) End() { pc.rd.end() }

// Written returns how many bytes of requests the kernel has accepted on
// pc: a request that wrote none may be sent again on another connection.
func (pc *Conn) Written() int64 { return pc.out.Written() }

// Trailer returns the trailer fields of the chunked body read last, as
// canonical key and value; valid until the next exchange.
func (pc *Conn) Trailer() [][2]string { return pc.chunks.trailer }

// tickReader reads from an upstream connection on behalf of one exchange at
// a time, and is how a waiting exchange notices that its client went away
// or that the response-header timeout passed. Registering a callback on
// every request's context (context.AfterFunc) cost five allocations and a
// lock per request; instead the connection carries a read deadline that is
// re-armed only when it fires, and each firing checks the exchange. A busy
// connection thus makes no deadline call per request; a long wait is woken
// once a tick, the tick doubling up to maxTick, so the client's leaving is
// seen within that (the upstream then sees its connection close).
type tickReader struct {
	nc       net.Conn
	deadline time.Time       // the read deadline armed on nc; zero: none
	ctx      context.Context // the exchange's; nil while idle
	headBy   time.Time       // the response-header deadline; zero: none or read
	tick     time.Duration
}

const (
	firstTick = time.Second
	maxTick   = 8 * time.Second
)

// begin starts an exchange for ctx at now; headBy is its response-header
// deadline, zero for none.
func (t *tickReader) begin(ctx context.Context, now, headBy time.Time) {
	t.ctx, t.headBy, t.tick = ctx, headBy, firstTick
	switch {
	case !headBy.IsZero() && (t.deadline.IsZero() || headBy.Before(t.deadline)):
		t.arm(headBy)
	case t.deadline.IsZero():
		t.arm(now.Add(firstTick))
	}
}

// end ends the exchange; the idle connection keeps no context alive.
func (t *tickReader) end() { t.ctx, t.headBy = nil, time.Time{} }

func (t *tickReader) arm(d time.Time) {
	t.deadline = d
	t.nc.SetReadDeadline(d)
}

func (t *tickReader) Read(p []byte) (int, error) {
	for {
		n, err := t.nc.Read(p)
		if n > 0 || err == nil || !errors.Is(err, os.ErrDeadlineExceeded) {
			return n, err
		}
		// The deadline is a check, not a verdict.
		if t.ctx != nil && t.ctx.Err() != nil {
			return 0, t.ctx.Err()
		}
		now := time.Now()
		if !t.headBy.IsZero() && !now.Before(t.headBy) {
			return 0, err // a timeout: the caller answers 504
		}
		next := now.Add(t.tick)
		t.tick = min(2*t.tick, maxTick)
		if !t.headBy.IsZero() && t.headBy.Before(next) {
			next = t.headBy
		}
		t.arm(next)
	}
}
