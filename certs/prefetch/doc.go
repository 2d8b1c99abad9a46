// Package prefetch obtains certificates for names a routing document adds
// before their first visitor asks, without spending an ACME order that
// on-demand issuance would not also have spent.
//
// On-demand issuance makes a new host's first visitor wait for the whole
// ACME exchange inside the TLS handshake. The routing document already
// lists every name the fleet will serve, so a Queue takes the names each
// new document adds and obtains their certificates in the background:
//
//   - Which names: only what on-demand issuance would approve today (a
//     route host or API host named exactly, never a "*.<base>" key: the
//     caller's Certifiable, which applies the certs package's decision
//     rules), never a name a managed wildcard certificate covers, and
//     nothing already held in memory or storage. A name is checked again
//     at its turn and just before its order: one that left the document
//     before then is never ordered.
//   - In what order and how fast: newest names first (names added by the
//     latest document before those of earlier ones, document order within
//     one), at most Workers at a time, and within a budget per edge:
//     PerHour orders an hour (a token bucket holding at most PerHour, so
//     up to twice PerHour in the hour that starts with it full) and
//     PerDomainPerWeek orders per registered domain (eTLD+1 by the public
//     suffix list, as Let's Encrypt counts) in any seven days. The
//     defaults (20 an hour, 10 per registered domain a week) stay well
//     inside Let's Encrypt's 300 new orders per account per three hours and
//     50 certificates per registered domain per week, leaving the rest to
//     on-demand issuance and renewals. A name takes its share of the
//     budget at its turn and spends it only on an order (a name found held
//     or unreachable gives it back); a name the budget holds back waits in
//     the queue, counted. The hourly bucket is the edge's own and lives in
//     its memory: a restart (a handover to a new process included) starts
//     it full, as Let's Encrypt's order limit is per account and each edge
//     has its own. The weekly count per registered domain is kept in the
//     certificate storage, one record per order, and read again just
//     before each order: it survives restarts and, in the fleet store,
//     counts every edge's orders, since Let's Encrypt counts certificates
//     per registered domain across accounts. An edge counts its own
//     names at work, so it alone never overshoots; other edges ordering
//     under one domain at the same moment read the record before each
//     other's orders land, and may overshoot it by up to Workers each
//     (two by default), since every worker of theirs can be at an order.
//     A fleet lock per registered domain would close that gap at one more
//     lock round trip to the node per order; the week's default of 10 is
//     a fifth of Let's Encrypt's 50, which absorbs it.
//   - Only names that reach the fleet: a custom domain is often added to
//     the document before its owner points DNS at the fleet, and an order
//     for it would fail validation (Let's Encrypt allows five failed
//     validations per account, name and hour). Before ordering, the queue
//     stores a random token and its secret answer in the certificate
//     storage (the fleet store when there is one), looks the name up as
//     a CA's resolver does (Let's Encrypt's, Boulder's bdns.LookupHost)
//     and sends GET http://<name>/.well-known/scafo-edge/reach/<token> to
//     every address the CA would validate at; only an edge of this fleet,
//     which reads the token from the same storage (ServeReach), can answer
//     it. Those addresses are the public ones among the A and AAAA
//     records: a loopback, private or reserved address may reach an edge
//     from here, never a public CA's validator, which drops it from the
//     answer, so it is ignored beside a public one, and a name with no
//     public address at all is not ordered. A and AAAA are asked for
//     apart, and as at the CA a failed query (SERVFAIL, a timeout) for one
//     family while the other answers is no error: the name is checked,
//     and validated, over the family that answered. Every address checked
//     must answer, since the CA may validate at any (Let's Encrypt
//     prefers IPv6 when an AAAA record exists): an AAAA record that
//     answers and still points at the old host keeps the name waiting. A
//     box with no IPv6 route cannot check an AAAA record; such a name is
//     listed as NoIPv6, logged once, and not ordered. Edges poll the
//     document on their own clocks, so the edge a new name's DNS leads to
//     may name it up to a poll interval after the edge checking it, and
//     answer the check as it answers any host it has no route for (404,
//     "no route for this host"); a check failing only so is tried again
//     after about one PollInterval, with jitter, a few times (listed as
//     Propagating) before the back-off below. A name that does not
//     answer costs no ACME traffic and is checked again after a growing
//     interval (RetryBase doubling up to RetryMax), listed by Status and
//     counted in a metric; one that leaves the document meanwhile, its
//     check in flight or not, is dropped, logged and counted as removed. The back-off is the queue's own: a
//     real visitor's handshake still triggers on-demand issuance at once.
//   - The fleet does the work once: with a shared store, every edge gets
//     the same document at about the same moment. Before working on a
//     name an edge try-locks "prefetch_<name>" in the storage; an edge
//     that finds it held does not wait on it (which would be N lock waits
//     per name on the node) but looks again later (BusyRetry, growing), by
//     when the holder has usually stored the certificate. The holder checks
//     storage again after taking the lock, and certmagic checks it once
//     more under its own issuance lock, so the fleet places exactly one
//     order per name. A holder that dies leaves a lock the store treats as
//     stale after its lifetime, and another edge takes the name over.
//   - And checks each name once: only the lock holder runs the
//     reachability check. When the name is not ready (propagating,
//     unreachable, or its order failed) the holder leaves a verdict in
//     the storage ("scafo-edge/reach-verdict/<name>": the result, its
//     error, when the name is due again, the counts of failures and
//     not-yet checks), and an edge whose turn finds one that still holds
//     takes it over, state, error, counts and next turn (at most RetryMax
//     away), instead of checking; it is read before the lock and again
//     under it. Past its due time the next edge to take the lock checks
//     and replaces it; an order that succeeds deletes it. A propagating
//     verdict is due for its writer at once and for the others BusyRetry
//     later, so the edge whose view reached the fleet checks again (one
//     behind a NAT without hairpinning cannot reach its own public
//     address); after a back-off the lock goes to whichever edge asks
//     first. What depends on the edge itself (NoIPv6, its budget, its
//     storage failing) leaves no verdict: each edge checks for itself.
//     Three edges given three names while the checked edge's document
//     lagged wrote 4 tokens a name before verdicts, 2 with them.
//
// A failed order (the name reached the fleet, yet validation failed) backs
// the name off like an unreachable one; the certs package also counts it
// as a failed issuance and counts its failed validations against the CA's
// limit per name and hour, so on-demand issuance waits out its own back-off
// for that name as after any failed validation. The queue keeps the name,
// listed as failed, and orders nothing for it before that back-off ends
// either (Certs.HeldBack), whatever started it.
//
// It knows nothing about ACME, routing or certmagic's configuration: the
// certs package hands it the decision, storage look-up and obtain calls.
package prefetch
