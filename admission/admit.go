package admission

import (
	"net/http"
	"net/netip"

	"github.com/scafo/scafo-edge/internal/forwarded"
)

// Refusal says why Admit refused a request, Admitted when it did not.
type Refusal uint8

const (
	Admitted               Refusal = iota
	RefusedMemory                  // memory past its high-water mark (503)
	RefusedClientRequests          // the client address has its share in flight (429)
	RefusedClientRate              // the client address past its rate (429)
	RefusedAppQueueFull            // the application at its share, its queue full (503)
	RefusedAppQueueTimeout         // the application at its share a whole queue timeout (503)
	RefusedCanceled                // the client went away while its request waited
	RefusedBudget                  // the budget and its overdraft spent, nothing to close (503)
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

// Release gives the request's shares back once the request is over (a
// WebSocket's once its tunnel closes).
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
// upstreams now (docs/design.md, admission table: 503 and 429). An
// admitted request holds its shares until Ticket.Release.
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
	// The request may need a descriptor for its upstream.
	if c.inUse() >= int64(c.limits.MaxConns) && !c.roomForRequest() {
		return Ticket{}, RefusedBudget
	}
	k.t = c
	app := c.apps.get(application)
	if key, ok := c.clientOfRequest(r); ok {
		// When the share binds: docs/design.md, admission table.
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
// address (after the PROXY protocol), or, from a trusted proxy, the
// address X-Forwarded-For names after the last one. False: none to count
// by (another proxy, or a trusted one that named none).
func (c *Controller) clientOfRequest(r *http.Request) (netip.Addr, bool) {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}, false
	}
	ip := ap.Addr().Unmap().WithZone("") // a link-local peer's zone names no other client
	if !forwarded.Contains(c.trusted, ip) {
		if forwarded.Contains(c.proxies, ip) {
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
