package serving

import (
	"context"
	"net"
	"net/http"
	"net/netip"
	"time"

	"github.com/scafo/scafo-edge/handover"
)

// A Layer is one wrapper of a listener: what it is, and how it wraps the
// listener below it. A nil Wrap is a layer turned off.
type Layer struct {
	Name string
	Wrap func(net.Listener) net.Listener
}

// A Stack is the order in which a connection passes through the layers
// of its listener, from the socket up: each layer wraps the one before it,
// so that its connections wrap theirs.
type Stack []Layer

// Listener returns l wrapped by every layer that is on, in order.
func (s Stack) Listener(l net.Listener) net.Listener {
	for _, layer := range s {
		if layer.Wrap != nil {
			l = layer.Wrap(l)
		}
	}
	return l
}

// Names lists the layers that are on, from the socket up.
func (s Stack) Names() []string {
	var names []string
	for _, layer := range s {
		if layer.Wrap != nil {
			names = append(names, layer.Name)
		}
	}
	return names
}

// ClientOptions are what the layers of a client-facing listener need.
type ClientOptions struct {
	// Admission is the admission controller's listener for this socket
	// (Controller.Listener, or PlainListener where connections speak
	// plain HTTP/1): it counts the peer and makes room at the budget.
	Admission func(net.Listener) net.Listener
	// SendTimeout closes a connection whose write makes no progress this
	// long (0: never).
	SendTimeout time.Duration
	// ProxyFrom are the sources allowed a PROXY protocol header (none:
	// the layer is off); HeaderTimeout bounds its reading.
	ProxyFrom     []netip.Prefix
	HeaderTimeout time.Duration
	// Gate stops the listener for a handover.
	Gate *handover.Gate
}

// ClientStack is the one order of the layers of a public listener (HTTP or
// HTTPS), below TLS and HTTP:
//
//  1. admission, on the socket itself: it counts the peer that connected,
//     before anything reads a byte from it, and at the connection budget
//     makes room or waits for it;
//  2. spread deadlines, so that a flood opened in a burst does not time
//     out in one;
//  3. the send timeout, on every write to the client;
//  4. the PROXY protocol header, read before TLS and HTTP so that the
//     client address reaches logs, admission's shares by address and
//     forwarded headers;
//  5. the handover gate, last, right below TLS: it sees what each
//     connection receives, to know when the ones accepted have arrived.
func ClientStack(o ClientOptions) Stack {
	s := Stack{
		{"admission", o.Admission},
		{"spread deadlines", WithSpreadDeadlines},
		{"send timeout", func(l net.Listener) net.Listener { return WithSendTimeout(l, o.SendTimeout) }},
		{"proxy protocol", nil},
		{"handover gate", o.Gate.Listener},
	}
	if len(o.ProxyFrom) > 0 {
		s[3].Wrap = func(l net.Listener) net.Listener { return WithProxyProtocol(l, o.ProxyFrom, o.HeaderTimeout) }
	}
	return s
}

// ConnStates returns one http.Server.ConnState hook that calls each of
// hooks in order; nil hooks are skipped.
func ConnStates(hooks ...func(net.Conn, http.ConnState)) func(net.Conn, http.ConnState) {
	var on []func(net.Conn, http.ConnState)
	for _, h := range hooks {
		if h != nil {
			on = append(on, h)
		}
	}
	if len(on) == 1 {
		return on[0]
	}
	return func(c net.Conn, st http.ConnState) {
		for _, h := range on {
			h(c, st)
		}
	}
}

// ConnContexts chains http.Server.ConnContext hooks, in order; nil ones
// are skipped.
func ConnContexts(hooks ...func(context.Context, net.Conn) context.Context) func(context.Context, net.Conn) context.Context {
	var on []func(context.Context, net.Conn) context.Context
	for _, h := range hooks {
		if h != nil {
			on = append(on, h)
		}
	}
	return func(ctx context.Context, c net.Conn) context.Context {
		for _, h := range on {
			ctx = h(ctx, c)
		}
		return ctx
	}
}
