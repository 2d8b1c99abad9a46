// Package serving owns how the edge's client-facing listeners behave below
// the request handler: the HTTP/2 stream limit and the per-connection budget
// against rapid reset, the send timeout on client connections, the PROXY
// protocol, and the HTTP/3 listener with its own QUIC transport.
//
// It does not know about routing, upstreams or certificates: it is handed a
// handler and a TLS configuration.
package serving
