// Package h1 is backhaul's HTTP/1.1 client for the common request: pooled
// keep-alive connections to upstreams (Pool, Conn), the writing of request
// bodies (WriteBody: taken whole from memory when the caller read them
// beforehand, up to 64 KiB, or streamed with their declared length or
// chunked), the response-head parser (Conn.ReadHead, Head), the body
// readers by framing (Conn.BodyReader) and the token tables both directions
// validate against.
//
// It works on the caller's goroutine: nothing reads an idle connection, a
// connection is peeked for stray bytes or a close before reuse, and a read
// that waits notices the exchange's context ending through a read deadline
// re-armed only when it fires. A request on a pooled connection allocates
// almost nothing here.
//
// It knows HTTP/1.1 framing, not proxying: which request headers are
// forwarded, the X-Forwarded-* set, which response fields are hop-by-hop,
// failover and retries are backhaul's, which hands them in.
package h1
