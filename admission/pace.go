package admission

import (
	"crypto/tls"
	"math/rand/v2"
	"net"
	"syscall"
	"time"
)

// A request head (its TLS handshake included, for a connection's first)
// that keeps arriving a few bytes at a time is read at the edge's pace, not
// its client's. Each read of a connection wakes a goroutine, and a client
// that trickles its headers chooses how often that happens: enough such
// connections leave the box's CPU to their wake-ups instead of to the
// other applications' visitors (bench/README, "a request head read at the
// edge's pace").
//
// So, once a head has come in trickleReads short reads, and has been on
// its way slowAge (since the accept or the connection's last request, so
// that an attacker's connection is paced only after it held its socket
// that long itself: a paced wait does not hear the client go), each further
// read of it waits its turn: paceEvery after the one before, and a random
// part of half that, so that the edge wakes for such a connection at
// moments of its own choosing, spread rather than in the client's bursts.
// Each turn taken doubles the next wait, up to paceEvery<<paceDoublings:
// every read is a system call and a wake-up,
// and a head still trickling after two turns is read once every 4 to 6 s
// instead of once a second. No further: the bytes wait in the kernel
// meanwhile, each segment in a buffer of its own unless the kernel can
// merge it into the one before (it can on loopback; from some network
// cards it cannot, and a buffer is then 1 to 4 KiB for a byte).
//
// While a read waits its turn, after a turn that found quietFrom bytes or
// more, the kernel is asked not to wake the edge's poller for the
// connection until trickleBytes wait (or it ends, or its receive memory
// or window runs short): each segment would be a wake-up still, if a
// cheaper one. Holding them costs two system calls and a wake-up a turn,
// more than a client sending a segment or two a turn costs. Before each
// wait, a peek tells whether the client has closed or reset, and then the
// read goes at once and returns the end, so that its connection is let go
// a turn after it went, not two (the turn's read returned what came
// before the close or reset).
//
// A read that finds trickleBytes or more waiting is followed by one at
// once, and so on while they find as much (a backlog is read as it comes,
// so that --max-header-bytes ends a head too large), and the next short
// read waits its turn again, from paceEvery: a client trickling at a
// steady rate has up to about three times trickleBytes waiting, one that
// sends in bursts up to its socket's receive buffer. A read whose turn
// falls after its connection's read deadline is made paceDeadlineLead
// before it instead: bytes that came in time are read, and with none the
// read fails at the deadline, as an unpaced one would have.
//
// Only while the box is contended (its connections, or its memory, past
// their high-water marks, or Accept waiting for room): until then a head
// on a slow link is read as it comes, as net/http would read it, and a
// slow visitor waits for nothing of the edge's.
//
// A visitor's request head is never paced: a client sends it at once, in
// full segments and a short last one that ends it (no read follows); a
// connection's first adds its TLS handshake's short reads (a ClientHello,
// two after a HelloRetryRequest, a Finished) and a PROXY protocol header's;
// a connection opened ahead of need (a browser's preconnect) makes none
// while it waits. A read of fewer bytes than its buffer had room for is not
// short when the buffer was nearly full: the server had less than
// trickleBytes to offer. HTTP/2 connections are not paced: their frames are
// often short, and the HTTP/2 server bounds a connection's work itself.
const (
	trickleReads     = 6
	trickleBytes     = 512
	paceEvery        = time.Second
	paceDoublings    = 2
	paceDeadlineLead = 50 * time.Millisecond
	// quietFrom is how many bytes the last turn must have found for the
	// next wait to hold the poller's wake-ups: holding them costs two
	// system calls and a wake-up a turn, more than the wake-ups of a
	// client trickling a byte or two a turn. Bytes stand
	// in for segments: a trickle sends a segment a byte or so.
	quietFrom = 3
)

// onHead reports whether t's server is reading a request head: its first
// (or its TLS handshake) or, between requests, the next. Not over HTTP/2.
func (t *trackedConn) onHead() bool {
	st := connState(t.state.Load())
	return (st == stateNew || st == stateIdle) && !t.h2.Load()
}

// noteHeadRead counts a read of n bytes into a buffer of size while t's
// server reads a request head. Only t's reader calls it.
func (t *trackedConn) noteHeadRead(n, size int) {
	if head := t.heads.Load(); head != t.head {
		t.head, t.trickles, t.turns = head, 0, 0
	}
	t.lastRead = uint16(min(n, trickleBytes))
	t.backlog = n >= min(trickleBytes, size)
	if t.backlog {
		t.turns = 0
		return
	}
	if t.trickles < trickleReads-1 {
		t.trickles++
		return // a visitor's head ends here: no clock read on its path
	}
	if t.trickles < trickleReads && !t.c.contended.Load() {
		// Nobody is short of anything: a head on a slow link is read as
		// it comes, as net/http reads it. It is paced from the first
		// short read made under contention.
		return
	}
	now := t.c.clock.Now()
	if t.trickles < trickleReads {
		if now.UnixNano()-t.since.Load() < int64(slowAge) {
			// Not before the head has been on its way slowAge: a client
			// that trickles a few bytes and resets would otherwise leave
			// its connection waiting a turn, counted against the budget,
			// long after it went (a paced wait does not hear a close).
			return
		}
		t.trickles++
		t.c.m.paced.Inc()
		if t.socket == nil {
			t.socket = newPacedSocket(t.Conn)
		}
	}
	// Paced: the next read's turn counts from this one.
	t.readAt = now
}

// paced reports whether t's next read waits its turn: only while the box
// is contended.
func (t *trackedConn) paced() bool {
	return t.trickles >= trickleReads && !t.backlog && t.onHead() && t.heads.Load() == t.head && t.c.contended.Load()
}

// awaitTurn waits until t may be read again, its read deadline comes, or
// it is closed.
func (t *trackedConn) awaitTurn() {
	every := paceEvery << t.turns
	if t.turns < paceDoublings {
		t.turns++
	}
	turn := t.readAt.Add(every + rand.N(every/2))
	wait := turn.Sub(t.c.clock.Now())
	if wait <= 0 {
		return
	}
	// The turn's timer, or one that fires a little before the read
	// deadline, on the wall clock it is set by, when that comes first:
	// what came in time is read, and a read that finds nothing fails at
	// the deadline. Reads in the deadline's last paceDeadlineLead go at
	// once; the connection ends with it.
	var fired <-chan time.Time
	if dl := t.readDeadline.Load(); dl != 0 {
		if untilDeadline := time.Until(time.Unix(0, dl)); untilDeadline < wait {
			lead := untilDeadline - paceDeadlineLead
			if lead <= 0 {
				return
			}
			deadline := time.NewTimer(lead)
			defer deadline.Stop()
			fired = deadline.C
		}
	}
	if t.socket != nil {
		if t.socket.peerGone() {
			// With nothing waiting, the read returns the end (after a
			// reset too: the peek took its error) without a turn, so
			// that a connection its client left is let go a turn after,
			// not two.
			return
		}
		// Nor does the poller wake for it meanwhile, but for its end,
		// when the client sends enough to make that worth two system
		// calls: each segment would, at a cost a trickle chooses. The
		// read is made with this undone, so that one that finds nothing
		// is woken by the next byte.
		if t.lastRead >= quietFrom {
			t.socket.setRcvLowat(trickleBytes)
			defer t.socket.setRcvLowat(1)
		}
	}
	if fired == nil {
		if t.paceTimer == nil {
			t.paceTimer = t.c.clock.NewTimer(wait)
		} else {
			t.paceTimer.Reset(wait)
		}
		defer t.paceTimer.Stop()
		fired = t.paceTimer.C()
	}
	t.waitUntil(fired)
}

// pacedSocket is a paced connection's socket, for the calls pacing makes
// on it (quiet_linux.go). Its callbacks are made once, so that a turn
// allocates nothing.
type pacedSocket struct {
	rc           syscall.RawConn
	lowat        int
	gone         bool
	peekBuf      [1]byte
	setLowatFunc func(fd uintptr)
	peekFunc     func(fd uintptr)
}

// waitUntil waits for fired, or for t to be closed.
func (t *trackedConn) waitUntil(fired <-chan time.Time) {
	select {
	case <-fired:
	case <-t.gone:
	}
}

// SetReadDeadline sets the read deadline, and notes it: a paced read
// waits no longer.
func (t *trackedConn) SetReadDeadline(d time.Time) error {
	d = t.heldToHeadDeadline(d)
	t.noteReadDeadline(d)
	return t.Conn.SetReadDeadline(d)
}

// SetDeadline sets both deadlines, and notes the read one.
func (t *trackedConn) SetDeadline(d time.Time) error {
	d = t.heldToHeadDeadline(d)
	t.noteReadDeadline(d)
	return t.Conn.SetDeadline(d)
}

// heldToHeadDeadline returns d, or the deadline of t's first head if that
// comes first (heads.go). No deadline (zero) is left as it is: the server
// clears its header deadline once the head is in. (With a ReadTimeout,
// which the edge does not set, the server would set the body's deadline
// before it reports the connection active, and that would be held too.)
func (t *trackedConn) heldToHeadDeadline(d time.Time) time.Time {
	if by := t.headDeadline.Load(); by != 0 && !d.IsZero() && d.UnixNano() > by {
		return time.Unix(0, by)
	}
	return d
}

func (t *trackedConn) noteReadDeadline(d time.Time) {
	if t.gone == nil {
		return // an upstream connection: never paced
	}
	if d.IsZero() || d.After(farDeadline) { // none, or as good as none (and past UnixNano's range)
		t.readDeadline.Store(0)
	} else {
		t.readDeadline.Store(d.UnixNano())
	}
}

var farDeadline = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)

// noteProtocol notes, once, whether conn (t's server's connection) speaks
// HTTP/2: called from its server's ConnState hook, once the handshake is
// done.
func (t *trackedConn) noteProtocol(conn net.Conn) {
	if t.protocolNoted.Load() {
		return
	}
	t.protocolNoted.Store(true)
	if tc, ok := conn.(*tls.Conn); ok && tc.ConnectionState().NegotiatedProtocol == "h2" {
		t.h2.Store(true)
	}
}
