package h1

import (
	"errors"
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// ProgressConn bounds how long one write to an upstream may make no
// progress (Timeout, backhaul's Options.SendTimeout), as the edge's
// --send-timeout does towards clients: an upstream that stops reading an upload is given up on, while
// one that keeps reading takes as long as it likes. It also counts the bytes
// the kernel accepted, which tells a request that never left from one that
// partly did: only the first may be sent again for every method. Every
// Conn writes through one; backhaul's http.Transport dials through one too.
//
// A net.Conn may be written from several goroutines (a tunnel's pump after
// the transport's write loop), so its counters are atomic.
type ProgressConn struct {
	net.Conn
	Timeout time.Duration // <= 0: no bound
	armed   atomic.Int64  // the write deadline set on Conn, Unix nanoseconds
	written atomic.Int64

	// AbsorbReset makes a write the upstream refused with a reset report
	// success, and every later one too until the connection is closed;
	// only for http.Transport's connections, never a Conn's. The transport
	// races a failed write against the response: an
	// upstream that answers an upload early (a 201, a 413) and closes
	// with the upload unread makes the kernel reset, the rest of the
	// upload fails to write, and when that failure wins the client gets
	// a 502 for a request the upstream answered. Swallowing
	// the failure leaves the transport's read side to end the exchange:
	// with the answer that arrived before the reset, or with the reset
	// itself, a failure after bytes were written, which the transport
	// never resends (it opens a connection per request).
	AbsorbReset bool
	reset       atomic.Bool // a write was refused; later ones are dropped
	closed      atomic.Bool // Close was called
}

// Close closes the connection; writes after it fail even when resets are
// absorbed, which is what stops the transport copying the rest of an
// upload nobody will read.
func (c *ProgressConn) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}

// Written returns how many bytes the kernel has accepted.
func (c *ProgressConn) Written() int64 { return c.written.Load() }

func (c *ProgressConn) Write(p []byte) (int, error) {
	if c.reset.Load() {
		if c.closed.Load() {
			return 0, net.ErrClosed
		}
		return len(p), nil
	}
	if c.Timeout > 0 {
		// The deadline moves only when less than the bound is left, so a
		// busy connection does not pay a deadline update per write; a
		// write that makes no progress fails after between one and one
		// and a half bounds.
		now := time.Now()
		if c.armed.Load()-now.UnixNano() < int64(c.Timeout) {
			d := now.Add(c.Timeout + c.Timeout/2)
			c.armed.Store(d.UnixNano())
			c.Conn.SetWriteDeadline(d)
		}
	}
	n, err := c.Conn.Write(p)
	c.written.Add(int64(n))
	if err != nil && c.AbsorbReset && !c.closed.Load() &&
		(errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
		c.reset.Store(true)
		return len(p), nil
	}
	return n, err
}

// IsTimeout reports whether err is a deadline passing: the response-header
// timeout or a write that made no progress. Either is final for the
// request: sending it again would double the load on an upstream already
// too slow.
func IsTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
