package admission

import (
	"context"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

// h3ExcessiveLoad is HTTP/3's H3_EXCESSIVE_LOAD (RFC 9114 §8.1).
const h3ExcessiveLoad quic.ApplicationErrorCode = 0x0107

// QUICListener returns l counted against the budget (docs/design.md,
// admission table). l must hand over connections whose handshake is
// complete (quic.Listener, not an early one): the handshake proves the
// client's address, which a spoofed Initial packet does not.
func (c *Controller) QUICListener(l http3.QUICListener) http3.QUICListener {
	if c == nil {
		return l
	}
	return &quicListener{QUICListener: l, c: c}
}

type quicListener struct {
	http3.QUICListener
	c *Controller
}

func (l *quicListener) Accept(ctx context.Context) (*quic.Conn, error) {
	c := l.c
	for {
		conn, err := l.QUICListener.Accept(ctx)
		if err != nil {
			return nil, err
		}
		if c.inUse()+c.quicConns.Load() >= int64(c.limits.MaxConns) {
			conn.CloseWithError(h3ExcessiveLoad, "")
			c.refusal(RefusedBudget.String())
			continue
		}
		client, ok := c.addClientConn(conn.RemoteAddr())
		if !ok {
			conn.CloseWithError(h3ExcessiveLoad, "")
			c.refusal(refusedClientConns)
			continue
		}
		c.quicConns.Add(1)
		c.opened()
		context.AfterFunc(conn.Context(), func() {
			c.quicConns.Add(-1)
			if client != nil {
				c.clients.releaseConn(client)
			}
			c.released()
		})
		return conn, nil
	}
}
