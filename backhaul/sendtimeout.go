package backhaul

import (
	"context"
	"errors"
	"net"
	"time"
)

// progressConn bounds how long one write to an upstream may make no
// progress (Options.SendTimeout), as the edge's --send-timeout does towards
// clients: an upstream that stops reading an upload is given up on, while
// one that keeps reading takes as long as it likes. It also counts the bytes
// the kernel accepted, which tells a request that never left from one that
// partly did: only the first may be sent again for every method.
//
// Writes to one connection come from one goroutine at a time (the pooled
// client's exchange, the transport's write loop, a tunnel's pump), so the
// fields need no lock.
type progressConn struct {
	net.Conn
	timeout time.Duration // <= 0: no bound
	armed   time.Time     // the write deadline set on Conn
	written int64
}

func (c *progressConn) Write(p []byte) (int, error) {
	if c.timeout > 0 {
		// The deadline moves only when less than the bound is left, so a
		// busy connection does not pay a deadline update per write; a
		// write that makes no progress fails after between one and one
		// and a half bounds.
		now := time.Now()
		if c.armed.Sub(now) < c.timeout {
			c.armed = now.Add(c.timeout + c.timeout/2)
			c.Conn.SetWriteDeadline(c.armed)
		}
	}
	n, err := c.Conn.Write(p)
	c.written += int64(n)
	return n, err
}

// dialProgress dials addr for the transport, wrapping the connection so
// that its writes are bounded like the pooled client's. A dial failure is
// a *connectError.
func dialProgress(d *net.Dialer, sendTimeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, &connectError{addr: addr, err: err}
		}
		if sendTimeout <= 0 {
			return c, nil
		}
		return &progressConn{Conn: c, timeout: sendTimeout}, nil
	}
}

// isTimeout reports whether err is a deadline passing: the response-header
// timeout or a write that made no progress. Either is final for the
// request: sending it again would double the load on an upstream already
// too slow (issue 13).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
