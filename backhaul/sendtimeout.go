package backhaul

import (
	"context"
	"net"
	"time"

	"github.com/scafo/scafo-edge/backhaul/internal/h1"
)

// dialProgress dials addr for the transport, wrapping the connection so
// that its writes are bounded like the pooled client's and a reset does
// not hide an early answer. A dial failure is a *connectError.
func dialProgress(d *net.Dialer, sendTimeout time.Duration, count func(func() (net.Conn, error)) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	if count == nil {
		count = func(dial func() (net.Conn, error)) (net.Conn, error) { return dial() }
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := count(func() (net.Conn, error) { return d.DialContext(ctx, network, addr) })
		if err != nil {
			return nil, &connectError{addr: addr, err: err}
		}
		return &h1.ProgressConn{Conn: c, Timeout: sendTimeout, AbsorbReset: true}, nil
	}
}
