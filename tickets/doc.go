// Package tickets owns the edge's TLS session ticket keys: making them,
// rotating them on a schedule, handing them to the edge that replaces this
// one on an upgrade, and sharing them with the other edges of a fleet
// through the certificate store. It knows nothing of certificates, routing
// or listeners: the caller hands it a *tls.Config to encrypt and decrypt
// tickets for (Keys.Configure) and, optionally, a store.
//
// # Why
//
// A client that resumes a TLS session skips the certificate signature and
// its verification: the handshake costs an ECDHE and little else. Go makes
// ticket keys per process, so every upgrade would cost every returning
// visitor a full handshake, and so would a visitor whose next connection
// lands on another box of the fleet. Here the keys outlive the process
// (Export, handed over with the listening sockets) and are the fleet's.
//
// # The schedule (as Caddy's session ticket service)
//
// One key encrypts new tickets; it is replaced every Rotate (12 hours). A
// key is announced Lead (30 minutes) before it starts encrypting, so every
// edge of the fleet has read it before any edge issues a ticket under it,
// and it is accepted until Retain (36 hours) after it started: a ticket
// resumes for at least a day after it was issued, and no key lives longer
// than Retain plus Lead. Go's server checks a ticket's own age on top.
//
// # The fleet
//
// With a Store, the keys are one document in it (StoreKey), read every Sync
// (10 minutes). The edge that finds a rotation due takes the store's lock,
// reads again and writes the next key: one edge rotates, all adopt. Keys an
// edge held before adopting the store's (its own, or handed over) are
// still accepted, never used to encrypt, until they expire. While the store
// cannot be read, an edge rotates on its own: its tickets then resume only
// on itself until it reads the store again.
//
// Sharing the keys through the certificate store puts them beside what is
// more sensitive still: the certificates' private keys, which the store
// already holds and which let whoever reads them impersonate every name.
// Ticket keys are protected as those are: the store is reached only through
// the node with the ingress token, the edge never proxies /v1/storage
// (docs/design.md rule 6), and the node keeps them in the fleet's bucket.
// What a stolen ticket key gives is bounded in time by the schedule: TLS
// 1.3 tickets resume with a fresh ECDHE (Go's server only offers
// psk_dhe_ke), so it lets an attacker impersonate the server to a client
// holding a ticket, for the key's life; a TLS 1.2 ticket carries its
// session's master secret, so that session's recorded traffic can be read
// for as long as its key is accepted (Retain). That is the cost every
// server sharing ticket keys accepts (Caddy's distributed STEK, nginx's
// ssl_session_ticket_key). The ACME account key is another matter
// (docs/design.md rule 9): it is the edge's identity at the CA, names no
// domain and never expires, so it stays on the edge's disk.
package tickets
