// Package handover passes a running edge's listening sockets to the edge
// that replaces it on the same state directory, so that an upgrade never
// refuses a connection: the sockets never close, and the kernel queues what
// arrives while neither process accepts. It is HAProxy's seamless reload
// (expose-fd listeners, -x) and nginx's binary upgrade, across containers
// that share the state volume and the host's network.
//
// It owns the UNIX socket <state-dir>/handover.sock (mode 0600, owner only;
// on Linux a successor is also refused unless the kernel says it runs as
// the edge's user or root, so a loosened mode gives nobody the sockets),
// the exchange over it, and the order of the steps. It knows nothing about
// HTTP serving, TLS or routing: the caller hands it listeners and a routing
// document and does the serving and the stopping.
//
// # The exchange
//
// The running edge (the old one) calls Listen and waits for a successor
// with Offer.Wait. A new edge started on the same state directory calls
// Take before it binds anything or opens edge.db:
//
//  1. new → old: hello, with the protocol version and the addresses the
//     new edge will serve (Serves). An edge that would not serve every
//     socket of the old one where it does is refused: a handover is an
//     upgrade of the same edge, not a takeover by whatever starts on the
//     state directory.
//  2. old → new: the listening sockets (TCP for HTTP, HTTPS and the admin
//     listener; the UDP socket of HTTP/3), as descriptors passed with
//     SCM_RIGHTS, each named by its role. The old edge keeps serving.
//  3. new → old: ack, once it holds every descriptor. Until the ack the old
//     edge has given nothing up: a successor that fails or dies before it
//     leaves the old edge serving as if nothing had happened.
//  4. The old edge stops accepting on TCP (it closes its own descriptors;
//     the sockets stay open through the new edge's), lets the TLS
//     handshakes and first requests already under way arrive (Gate: a
//     connection quiet for 100ms counts as idle), stops polling and ACME
//     work, closes edge.db (releasing bbolt's lock) and sends released,
//     with the last good routing document. Then it stops HTTP/3 (see
//     below) and sends http3-released, drains its remaining requests,
//     tunnels included, within --shutdown-timeout, and exits 0.
//  5. The new edge, on released, opens edge.db, serves the handed-over
//     document as fresh (the old edge had it from the node a poll ago;
//     stale if the old edge's was) until its own first poll, and accepts
//     on the inherited TCP sockets; on http3-released it serves HTTP/3 on
//     the inherited UDP socket. It then offers its own sockets on the
//     handover socket for the next upgrade.
//
// # Why the certificate cache never goes cold
//
// Certificates and keys live in edge.db (and the fleet store); a process
// can only read edge.db once the other has closed it. So the new edge
// accepts nothing, TLS or plain, until it has opened edge.db: from its first
// accepted connection certmagic finds every certificate the old edge held in
// storage and completes the handshake without an ACME order. Between the
// old edge's last accept and the new edge's first, connections wait in the
// listening socket's backlog (the kernel completes the TCP handshake and
// queues them; net.core.somaxconn deep): they are delayed by that gap, never
// refused. The old edge, for its part, closes edge.db only once its TLS
// handshakes in progress are done (bounded by the caller), so none of them
// finds storage gone.
//
// # Why HTTP/3 is released separately
//
// Two processes may share a listening TCP socket (the kernel gives each
// connection to one accept), but not a UDP socket carrying QUIC: each
// datagram goes to whichever process reads first, and a QUIC connection's
// packets must all reach the process that holds its keys. So the old edge
// stops HTTP/3 (GOAWAY, then waits for its streams, bounded by the caller),
// stops reading, and only then does the new edge start reading. In between,
// a new QUIC connection's Initial packets are dropped unanswered by the old
// edge, and the client retransmits them until the new edge reads: a delay,
// not a failure. A handshake caught half-way as the old edge stops is
// refused (quic-go cannot finish it without accepting the connection);
// the client tries again, as browsers do, over TCP if need be.
//
// Both edges make QUIC stateless resets with one key kept in the state
// directory (StatelessResetKey): a client still holding a connection the
// old edge dropped as it closed gets a reset it believes from the new edge
// and retries at once, instead of waiting out its idle timeout.
//
// # Falling back
//
// If there is no socket file, or nothing listens on it (a stale file left by
// an edge that crashed), Take returns an error that wraps ErrNoPeer: the new
// edge starts as it always did, binds its listeners itself and replaces the
// stale file. Any other failure (a peer that does not answer in time, an old
// edge that speaks another protocol, a refused exchange) is an error the
// caller logs in one line before falling back the same way.
package handover
