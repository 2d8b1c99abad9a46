package admission

import (
	"net/http"
	"net/netip"

	"github.com/scafo/scafo-edge/internal/forwarded"
)

// Refusal says why Admit refused a request, Admitted when it did not.
type Refusal uint8

const (
	Admitted Refusal = iota
	// RefusedMemory: memory is past its high-water mark (503).
	RefusedMemory
	// RefusedClientRequests: the client address has its share of requests
	// in flight (429).
	RefusedClientRequests
	// RefusedClientRate: the client address passed its request rate (429).
	RefusedClientRate
	// RefusedAppQueueFull: the application holds its share and its queue
	// is full (503).
	RefusedAppQueueFull
	// RefusedAppQueueTimeout: the application held its share for the whole
	// queue timeout (503).
	RefusedAppQueueTimeout
	// RefusedCanceled: the client went away while its request waited.
	RefusedCanceled
	// RefusedBudget: the connection budget is spent and no idle connection
	// could give a descriptor for the request's upstream (503).
	RefusedBudget
)

var refusalLabels = [...]string{
	Admitted: "admitted", RefusedMemory: "memory", RefusedBudget: "budget",
	RefusedClientRequests: "client_requests", RefusedClientRate: "client_rate",
	RefusedAppQueueFull: "app_queue_full", RefusedAppQueueTimeout: "app_queue_timeout",
	RefusedCanceled: "client_canceled",
}

// String is the refusal's metric label.
func (r Refusal) String() string {
	if int(r) < len(refusalLabels) {
		return refusalLabels[r]
	}
	return "admitted"
}

// Ticket is an admitted request's hold on its shares; Release gives them
// back. The zero Ticket holds nothing.
type Ticket struct {
	t      *Controller
	app    *appState
	client *clientEntry
	conn   *trackedConn // the HTTP/1 connection it came on, if known
}

// Release gives the request's shares back; call it once the request is
// over (a WebSocket's once its tunnel closes).
func (k Ticket) Release() {
	cut := k.conn != nil && !k.conn.request.CompareAndSwap(k.app, nil)
	if k.app != nil {
		k.t.apps.release(k.app)
	}
	if cut {
		k.app.shedding.Add(-1) // shedHeld took it; given back after its slot
	}
	if k.client != nil {
		k.t.clients.releaseRequest(k.client)
	}
}

// Admit decides whether r, resolved to application's route, may go to its
// upstreams now: not while memory is high (503), not past its client
// address's rate, nor past its share of requests in flight while the
// application's slots are contended (429), and past the application's
// share only once a slot frees within the queue timeout (503). An admitted
// request holds its shares until Ticket.Release.
func (c *Controller) Admit(r *http.Request, application string) (k Ticket, why Refusal) {
	if c == nil {
		return Ticket{}, Admitted
	}
	defer func() {
		if why != Admitted && why != RefusedCanceled {
			c.refusal(why.String())
		}
	}()
	if c.memHigh.Load() {
		return Ticket{}, RefusedMemory
	}
	// The request may need a descriptor for its upstream. Past the budget
	// an idle connection gives one back if it can at once; past the
	// overdraft too, the request is refused rather than the edge running
	// out.
	if c.inUse() >= int64(c.limits.MaxConns) && !c.roomForRequest() {
		return Ticket{}, RefusedBudget
	}
	k.t = c
	app := c.apps.get(application)
	if key, ok := c.clientOfRequest(r); ok {
		// An address's share of requests binds only while requests contend
		// for its application's slots. With connections short and
		// requests not, its requests finish and give back what they hold:
		// refusing them would fail a NAT's browsers for what the
		// connections' own rules hold. Over HTTP/2 and HTTP/3 an address
		// holds many requests on few connections, and no shedding cuts
		// them: its share binds while the box is short of anything.
		contended := c.apps.busy(app) || (r.ProtoMajor != 1 && c.contended.Load())
		if k.client, why = c.clients.addRequest(key, c.clock.Now(), contended); why != Admitted {
			return Ticket{}, why
		}
	}
	if k.app, why = c.apps.acquire(r.Context(), application, app); why != Admitted {
		if k.client != nil {
			c.clients.releaseRequest(k.client)
		}
		return Ticket{}, why
	}
	// Only an HTTP/1 connection carries one request at a time: closing it
	// sheds that request alone (shedHeld).
	if r.ProtoMajor == 1 {
		if t, ok := r.Context().Value(connKey{}).(*trackedConn); ok {
			// Admitted now: a wait in the queue is not part of its hold.
			t.since.Store(c.clock.Now().UnixNano())
			k.conn = t
			t.request.Store(k.app)
		}
	}
	return k, Admitted
}

// clientOfRequest returns the client key r is counted by: its peer's
// address (after the PROXY protocol), or, when the peer is a proxy, the
// address X-Forwarded-For names after the last proxy. False: no address to
// count by (a proxy that named none).
func (c *Controller) clientOfRequest(r *http.Request) (netip.Addr, bool) {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}, false
	}
	ip := ap.Addr().Unmap().WithZone("") // a link-local peer's zone names no other client
	if !contains(c.trusted, ip) {
		if c.isProxy(ip) {
			return netip.Addr{}, false
		}
		return clientKey(ip), true
	}
	client, vouched, err := forwarded.Client(r.Header["X-Forwarded-For"], c.trusted)
	if err != nil || !vouched {
		return netip.Addr{}, false
	}
	return clientKey(client), true
}
