// Package admission owns the edge's resource budget and who may spend it:
// how many connections (client and upstream, each a descriptor) the edge
// takes on, what it sheds under pressure and in which order, and the fair
// shares that keep one application or one client address from taking the
// box's edge from everyone else. docs/design.md has every rule in one
// table, with its constant and why.
//
// The budget is derived at start from the descriptor and memory limits the
// process runs under (Derive); a Controller enforces it:
//
//   - on every listener (Listener, QUICListener): connections are counted
//     globally and per client address; while the box is under pressure, a
//     new connection of an address past its share is refused: held open,
//     unread, for a second, then closed, so that a client that reconnects
//     at once is not an accept loop (a share binds only when someone else
//     is short). At the global limit the edge first closes a connection to
//     make room (an idle one of an address past its share, a slow first
//     request, any idle one), and with none stops accepting, the kernel
//     keeping new connections in its backlog. HTTP/3 connections, which
//     hold no descriptor, take only what TCP leaves;
//   - under pressure (connections or memory past their high-water marks),
//     pooled upstream connections idle for a second are closed, then idle
//     client ones: those of the addresses furthest past their share first,
//     down to it, then the others oldest first (HTTP/2 ones after a
//     GOAWAY), and idle connections get a short idle timeout, until the
//     count is back under the low-water mark;
//   - a connection still on its first request's headers (or TLS handshake)
//     a second after it was accepted is a slow first request: never closed
//     to bring the count down (a slowloris reconnects at once), but at the
//     global limit room for a new connection, one for each accepted, those
//     of addresses at or past their share first, oldest first, at most a
//     sixteenth of the budget a second; and not for a connection of an
//     address that has slow first requests of its own, unless it takes
//     from an address that holds more: so that the attacker's
//     reconnections cannot turn the edge's CPU into churn;
//   - on a plain HTTP listener (PlainListener), a connection's first
//     request head that has not ended when it is accepted is awaited
//     outside the server, in one epoll set, with no goroutine or buffer of
//     its own, until it ends (or net/http would refuse what came, or 1 KiB
//     waits), its client goes, or the header timeout closes it; while the
//     box is under pressure (and only then: a slow link otherwise costs a
//     visitor nothing), one that keeps trickling is looked at on the
//     edge's schedule, not at each of its client's bytes: a second apart,
//     then twice as far each turn, up to 4 to 6 s (heads.go). Every other
//     head is read by the server as net/http reads it;
//   - on every request about to be forwarded (Admit): past the memory
//     high-water mark, or with the budget and its overdraft spent, new
//     requests are refused (503); past a client address's share of
//     requests in flight while the request's application is contended
//     (requests wait in its queue, or the request budget is at its
//     high-water mark), or past its optional rate, 429; past an
//     application's share of requests in flight to its upstreams, requests
//     wait in a short bounded queue, then 503.
//
// The admin listener (AdminListener) is not counted against the budget,
// whose pressure must not stop a health check, but held to a small pool of
// its own out of the descriptors reserved for the edge's own work
// (admin.go).
//
// A request already in flight is cut for pressure only when it is an
// HTTP/1 request held two seconds or more, during an episode of pressure
// beside another application, by one past its max-min fair part of the
// descriptors (setLevel, shedHeld): requests that never end hold what a
// NAT's browsers, which finish theirs, are short of.
//
// It does not know about routing or how bytes reach an upstream: the edge's
// handler names the application, and backhaul hands over the connections it
// dials to be counted.
package admission
