package backhaul

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"time"
)

// h1Conn is one keep-alive connection to an upstream, used by one request at
// a time. Everything a request needs to talk over it (buffers, the parsed
// response head, the body reader) lives here and is reused, so a request
// on a pooled connection allocates almost nothing of its own.
type h1Conn struct {
	nc   net.Conn
	rd   tickReader   // between br and nc
	out  progressConn // between bw and nc
	peek peeker       // on nc, before reuse

	// For a request with a body, written by another goroutine (h1.go):
	// its result, the response-header timer it starts once done, and the
	// stop of the watch that closes nc when the client leaves.
	wrote     chan error
	headTimer *time.Timer // the response-header timeout, from the body's end
	stopWatch func() bool
	br        *bufio.Reader
	bw        *bufio.Writer
	addr      string
	idleAt    time.Time // when it was last put back; zero for a new connection

	head   h1Head
	fixed  fixedBody
	chunks chunkedBody
	close  closeBody
}

// Buffer sizes: a response head and a small body arrive in one read; a
// request head almost always fits the writer, so it leaves in one write.
const (
	h1ReadBufSize  = 16 << 10
	h1WriteBufSize = 4 << 10
)

func newH1Conn(nc net.Conn, addr string, sendTimeout time.Duration) *h1Conn {
	pc := &h1Conn{nc: nc, addr: addr}
	pc.rd.nc = nc
	pc.out = progressConn{Conn: nc, timeout: sendTimeout}
	pc.peek.init(nc)
	pc.bw = bufio.NewWriterSize(&pc.out, h1WriteBufSize)
	pc.setReader(&pc.rd)
	return pc
}

// setReader makes src the source of responses on pc.
func (pc *h1Conn) setReader(src io.Reader) {
	pc.br = bufio.NewReaderSize(src, h1ReadBufSize)
	pc.fixed.br, pc.chunks.br, pc.close.br = pc.br, pc.br, pc.br
}

// connPool keeps idle keep-alive connections per upstream address, most
// recently used first, so that under light load the same few connections
// stay warm and the rest age out.
type connPool struct {
	dialer      net.Dialer
	maxIdle     int
	idleTimeout time.Duration
	sendTimeout time.Duration // Options.SendTimeout; <= 0: none

	mu    sync.Mutex
	hosts map[string]*idleConns
}

// idleConns is one address's idle connections, oldest first. Its timer
// closes the ones idle longer than the pool's idleTimeout; it is armed only
// while the list is not empty.
type idleConns struct {
	conns []*h1Conn
	timer *time.Timer
}

func newConnPool(dialTimeout, idleTimeout, sendTimeout time.Duration, maxIdle int) *connPool {
	return &connPool{
		dialer:      net.Dialer{Timeout: dialTimeout, KeepAlive: 30 * time.Second},
		maxIdle:     maxIdle,
		idleTimeout: idleTimeout,
		sendTimeout: sendTimeout,
		hosts:       map[string]*idleConns{},
	}
}

// get returns an idle connection to addr, reporting reused, or dials one.
// A dial failure is a *connectError.
//
// Every idle connection is peeked before reuse, however briefly it was
// idle: nothing reads an idle connection (that is what saves a goroutine
// per connection), so this is where a close from the upstream, or bytes
// it sent unasked, are seen. Bytes that arrive after a response has ended
// belong to no request: parsed as the next response they would hand one
// client another's answer (issue 13), so the connection is closed instead.
// The peek is one non-blocking system call.
func (cp *connPool) get(ctx context.Context, addr string, now time.Time) (pc *h1Conn, reused bool, err error) {
	for {
		pc = cp.pop(addr)
		if pc == nil {
			break
		}
		if !pc.rd.deadline.After(now) {
			// A passed deadline fails the peek before it looks.
			pc.rd.arm(now.Add(firstTick))
		}
		if pc.peek.alive() {
			return pc, true, nil
		}
		pc.nc.Close()
	}
	pc, err = cp.dial(ctx, addr)
	return pc, false, err
}

func (cp *connPool) dial(ctx context.Context, addr string) (*h1Conn, error) {
	nc, err := cp.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, &connectError{addr: addr, err: err}
	}
	return newH1Conn(nc, addr, cp.sendTimeout), nil
}

func (cp *connPool) pop(addr string) *h1Conn {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	l := cp.hosts[addr]
	if l == nil || len(l.conns) == 0 {
		return nil
	}
	last := len(l.conns) - 1
	pc := l.conns[last]
	l.conns[last] = nil
	l.conns = l.conns[:last]
	return pc
}

// put returns pc to the pool, or closes it when the pool is full.
func (cp *connPool) put(pc *h1Conn, now time.Time) {
	pc.idleAt = now
	cp.mu.Lock()
	l := cp.hosts[pc.addr]
	if l == nil {
		l = &idleConns{}
		cp.hosts[pc.addr] = l
	}
	if len(l.conns) >= cp.maxIdle {
		cp.mu.Unlock()
		pc.nc.Close()
		return
	}
	l.conns = append(l.conns, pc)
	if l.timer == nil {
		addr := pc.addr
		l.timer = time.AfterFunc(cp.idleTimeout, func() { cp.sweep(addr) })
	}
	cp.mu.Unlock()
}

// sweep closes addr's connections idle longer than idleTimeout and re-arms
// the timer for the oldest that remains; an address left with none is
// forgotten, so addresses that come and go with deploys do not accumulate.
func (cp *connPool) sweep(addr string) {
	now := time.Now()
	var expired []*h1Conn
	cp.mu.Lock()
	l := cp.hosts[addr]
	if l == nil {
		cp.mu.Unlock()
		return
	}
	n := 0
	for n < len(l.conns) && now.Sub(l.conns[n].idleAt) >= cp.idleTimeout {
		n++
	}
	expired = append(expired, l.conns[:n]...)
	l.conns = append(l.conns[:0], l.conns[n:]...)
	clear(l.conns[len(l.conns):cap(l.conns)])
	if len(l.conns) == 0 {
		l.timer = nil
		delete(cp.hosts, addr)
	} else {
		l.timer.Reset(cp.idleTimeout - now.Sub(l.conns[0].idleAt))
	}
	cp.mu.Unlock()
	for _, pc := range expired {
		pc.nc.Close()
	}
}

// closeIdle closes every idle connection. The pool stays usable.
func (cp *connPool) closeIdle() {
	cp.mu.Lock()
	hosts := cp.hosts
	cp.hosts = map[string]*idleConns{}
	for _, l := range hosts {
		if l.timer != nil {
			l.timer.Stop()
		}
	}
	cp.mu.Unlock()
	for _, l := range hosts {
		for _, pc := range l.conns {
			pc.nc.Close()
		}
	}
}

// idleCount returns the number of idle connections to addr.
func (cp *connPool) idleCount(addr string) int {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	if l := cp.hosts[addr]; l != nil {
		return len(l.conns)
	}
	return 0
}

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
			return 0, err // a timeout: the edge answers 504
		}
		next := now.Add(t.tick)
		t.tick = min(2*t.tick, maxTick)
		if !t.headBy.IsZero() && t.headBy.Before(next) {
			next = t.headBy
		}
		t.arm(next)
	}
}
