package backhaul

import (
	"math/rand/v2"
	"net/http"
	"net/netip"
	"strings"

	"github.com/scafo/scafo-edge/backhaul/internal/h1"
)

// isHopByHop reports whether a canonical header key names a hop-by-hop
// header (RFC 7230 §6.1, plus Proxy-Connection and Keep-Alive, which
// HTTP/1.0 era clients still send, and HTTP2-Settings, which belongs to
// one connection's upgrade to h2c, RFC 7540 §3.2.1). Those headers
// describe one connection and are never forwarded.
func isHopByHop(key string) bool {
	switch key {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Http2-Settings":
		return true
	}
	return false
}

// forbiddenTrailer reports whether a canonical key may not be passed on as
// a trailer: a field that frames the message, routes it, is hop-by-hop, or
// that a recipient would act on only in a header (RFC 9110 §6.5.1): the
// list Go's HTTP/2 server refuses, with Cookie, Set-Cookie and Upgrade (an
// upstream that merges trailers into headers would take a cookie the edge
// never saw in the head). A trailer naming one of them is dropped, never
// forwarded, in either direction.
func forbiddenTrailer(key string) bool {
	switch key {
	case "Authorization", "Cache-Control", "Connection", "Content-Encoding", "Content-Length",
		"Content-Range", "Content-Type", "Expect", "Host", "Keep-Alive", "Max-Forwards",
		"Pragma", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection", "Range",
		"Realm", "Te", "Trailer", "Transfer-Encoding", "Www-Authenticate", "Cookie", "Set-Cookie", "Upgrade":
		return true
	}
	return false
}

// aliasesProtected reports whether a header name with a byte other than a
// letter, digit or '-' names a hop-by-hop, framing or forwarding header once
// every such byte is read as '-'. CGI-style origins (PHP, WSGI, Rack) map
// '-' and '_' (PHP '.' too) to the same variable, so "X_Forwarded_For"
// would let a client choose the address the edge vouches for; such names
// are dropped (nginx drops every name with an underscore by default).
func aliasesProtected(key string) bool {
	plain := true
	for i := 0; i < len(key); i++ {
		if !isAlnum(key[i]) && key[i] != '-' {
			plain = false
			break
		}
	}
	if plain {
		return false
	}
	if foldedPrefix(key, "x-forwarded-") {
		return true
	}
	for _, name := range dashedProtected {
		if len(key) == len(name) && foldedPrefix(key, name) {
			return true
		}
	}
	return false
}

// dashedProtected lists the protected names that contain a '-', the only
// ones another byte in its place can alias.
var dashedProtected = [...]string{"x-real-ip", "x-request-id", "content-length", "transfer-encoding",
	"proxy-connection", "keep-alive", "proxy-authorization", "proxy-authenticate",
	"true-client-ip", "cf-connecting-ip", "fastly-client-ip", "x-client-ip", "x-cluster-client-ip", "client-ip"}

// foldedPrefix reports whether key starts with prefix (lower case),
// comparing letters case-insensitively and reading any byte but a letter
// or digit as '-'.
func foldedPrefix(key, prefix string) bool {
	if len(key) < len(prefix) {
		return false
	}
	for i := 0; i < len(prefix); i++ {
		c := key[i]
		switch {
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		case !isAlnum(c):
			c = '-'
		}
		if c != prefix[i] {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// namedByConnection reports whether key is listed in h's Connection header,
// which makes it hop-by-hop for this message (RFC 7230 §6.1).
func namedByConnection(conn []string, key string) bool { return h1.HasToken(conn, key) }

// hasToken reports whether the comma-separated header values contain tok,
// compared case-insensitively.
func hasToken(values []string, tok string) bool { return h1.HasToken(values, tok) }

// isForwarding reports whether key is a header through which a client claims
// an origin for the request; only a trusted proxy's are believed. Besides
// the standard ones, the client-address fields of CDNs and load balancers
// that applications read in their place (Akamai's and Cloudflare's
// True-Client-IP, Cloudflare's CF-Connecting-IP, Fastly's, Rackspace's
// X-Cluster-Client-IP, X-Client-IP, and Client-IP, which Rails and common
// PHP helpers read first), as nginx's realip and Rails do.
func isForwarding(key string) bool {
	if strings.HasPrefix(key, "X-Forwarded-") {
		return true
	}
	switch key {
	case "Forwarded", "X-Real-Ip", "True-Client-Ip", "Cf-Connecting-Ip", "Fastly-Client-Ip", "X-Client-Ip", "X-Cluster-Client-Ip", "Client-Ip":
		return true
	}
	return false
}

// upgradeProtocol returns the protocol a request or response asks to switch
// to, or "" when it does not ask (Connection must name "upgrade").
//
// An upgrade to h2c is never one: passed on, it would make the connection
// a tunnel to the upstream in which every later request skips routing,
// the denied prefixes and admission (h2c smuggling). The request goes on
// as a plain one, its Upgrade dropped as hop-by-hop.
func upgradeProtocol(h http.Header) string {
	if !hasToken(h["Connection"], "upgrade") || hasToken(h["Upgrade"], "h2c") {
		return ""
	}
	return h.Get("Upgrade")
}

// forwarding is the edge's forwarding-header policy applied to one
// request: which of the client's fields pass upstream as sent, and the
// X-Forwarded-* the edge sets. forwardingFor decides it once per request;
// both writers follow it, writeRequest for the pooled client and
// outboundHeader for the transport, so that the two paths cannot send
// different headers. It points into the request and allocates nothing.
// It stays within 128 bytes, so that the goroutine writing a request body
// (roundTripH1Body) captures a copy of it rather than a heap allocation.
type forwarding struct {
	// conn is the client's Connection header: the fields it names are
	// hop-by-hop for this message (RFC 7230 §6.1).
	conn []string
	// client is the client's address, which X-Forwarded-For ends with;
	// invalid when RemoteAddr did not parse, and then none is sent.
	client netip.Addr
	// priorXFF is a trusted proxy's X-Forwarded-For, which the client's
	// address is appended to.
	priorXFF []string
	// proto and host are the X-Forwarded-Proto and X-Forwarded-Host the
	// edge sets, "" where a trusted proxy's passes instead (or, for host,
	// where the request has no Host).
	proto, host string
	// trusted reports whether the client is a trusted proxy, whose
	// forwarding fields are believed.
	trusted bool
	// te reports whether the client accepts trailers: "TE: trailers" is
	// the one TE value a proxy that forwards trailers may pass on (gRPC
	// clients send it).
	te bool
	// relayID reports whether the client's X-Request-Id passes as sent
	// (requestIDFor); otherwise ownID is sent in its place.
	relayID bool
	// ownID is the edge's own request ID, 0 when the client's is relayed.
	ownID uint64
}

// forwardingFor decides the forwarding policy for r.
func (p *Proxy) forwardingFor(r *http.Request) forwarding {
	in := r.Header
	f := forwarding{conn: in["Connection"], te: hasToken(in["Te"], "trailers")}
	client, ok := clientAddr(r.RemoteAddr)
	if ok {
		f.client = client
		f.trusted = p.isTrusted(client)
	}
	if f.trusted && !f.namedByConnection(headerXFF) {
		f.priorXFF = in[headerXFF]
	}
	if !f.kept(in, headerXFProto) {
		f.proto = "http"
		if r.TLS != nil {
			f.proto = "https"
		}
	}
	if !f.kept(in, headerXFHost) {
		f.host = r.Host
	}
	id := requestIDFor(in, f.trusted)
	f.relayID, f.ownID = id.relayed != "", id.own
	return f
}

// RequestID names one request in the edge's access log and to its upstream,
// as X-Request-Id: the ID a trusted proxy sent, passed on as sent, or else
// the edge's own, 16 random hexadecimal digits. The zero value is no ID.
type RequestID struct {
	relayed string // a trusted proxy's
	own     uint64 // the edge's own, when relayed is ""
}

// RequestIDFor returns the ID the edge gives r: the one its peer sent in
// X-Request-Id when the peer (RemoteAddr, after the PROXY protocol) is in
// trusted and the ID is well formed (requestIDFor), else a new one of the
// edge's. Forward decides the same for the requests it forwards and
// reports it in Result.RequestID; the handler calls this for the requests
// it answers itself.
func RequestIDFor(r *http.Request, trusted []netip.Prefix) RequestID {
	client, ok := clientAddr(r.RemoteAddr)
	return requestIDFor(r.Header, ok && contains(trusted, client))
}

// requestIDFor decides a request's ID, the one place that does: a client's
// X-Request-Id is believed only from a trusted proxy, and only as one field
// naming one ID of at most maxRequestIDLen visible ASCII bytes without a
// quote, backslash or comma, none named by its Connection. Any other
// client's is dropped and replaced, so that an application cannot be made
// to log a string a client chose as the edge's ID (nor an access log a
// forged one).
func requestIDFor(h http.Header, trusted bool) RequestID {
	if trusted {
		if v := h[headerXRequestID]; len(v) == 1 && validRequestID(v[0]) && !namedByConnection(h["Connection"], headerXRequestID) {
			return RequestID{relayed: v[0]}
		}
	}
	id := rand.Uint64()
	for id == 0 {
		id = rand.Uint64()
	}
	return RequestID{own: id}
}

// maxRequestIDLen bounds a relayed request ID: long enough for a UUID, an
// AWS trace ID or a W3C traceparent, short enough for a log line.
const maxRequestIDLen = 128

func validRequestID(s string) bool {
	if s == "" || len(s) > maxRequestIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c >= 0x7f || c == '"' || c == '\\' || c == ',' {
			return false
		}
	}
	return true
}

// IsZero reports whether id is no ID.
func (id RequestID) IsZero() bool { return id.relayed == "" && id.own == 0 }

// Relayed reports whether id is a trusted proxy's rather than the edge's own.
func (id RequestID) Relayed() bool { return id.relayed != "" }

// AppendTo appends id's text to b.
func (id RequestID) AppendTo(b []byte) []byte {
	if id.relayed != "" {
		return append(b, id.relayed...)
	}
	if id.own == 0 {
		return b
	}
	const digits = "0123456789abcdef"
	for shift := 60; shift >= 0; shift -= 4 {
		b = append(b, digits[id.own>>uint(shift)&0xf])
	}
	return b
}

// String returns id's text, "" for no ID.
func (id RequestID) String() string {
	if id.relayed != "" || id.own == 0 {
		return id.relayed
	}
	var b [16]byte
	return string(id.AppendTo(b[:0]))
}

// passes reports whether the client's field k goes upstream as the client
// sent it. Host and Content-Length never do: each writer sets them from
// the request itself. Nor does X-Forwarded-For: a trusted proxy's is
// priorXFF, extended. X-Request-Id passes only as requestIDFor decided.
func (f *forwarding) passes(k string) bool {
	switch {
	case isHopByHop(k) || k == "Host" || k == "Content-Length" || aliasesProtected(k):
		return false
	case k == headerXRequestID:
		return f.relayID
	case f.namedByConnection(k):
		return false
	case isForwarding(k):
		return f.trusted && k != headerXFF
	}
	return true
}

// kept reports whether a trusted proxy's field k is in h and passes, in
// place of the edge's own.
func (f *forwarding) kept(h http.Header, k string) bool {
	if !f.trusted {
		return false
	}
	_, ok := h[k]
	return ok && f.passes(k)
}

// namedByConnection reports whether the client's Connection names k.
func (f *forwarding) namedByConnection(k string) bool {
	return f.conn != nil && namedByConnection(f.conn, k)
}

// Values shared by every request; the transport only reads them.
var (
	teTrailers    = []string{"trailers"}
	connUpgrade   = []string{"Upgrade"}
	noUserAgent   = []string{""}
	headerXFF     = "X-Forwarded-For"
	headerXFProto = "X-Forwarded-Proto"
	headerXFHost  = "X-Forwarded-Host"
	// headerXRequestID is the request's ID (RequestID).
	headerXRequestID = "X-Request-Id"
)

// outboundHeader returns the header the transport sends upstream for r, by
// the policy f: r's fields that pass (value slices shared, not copied),
// the upgrade headers when upgrade is set, and the X-Forwarded-* set. vals
// backs the values it computes, so that they cost no allocation of their
// own.
func outboundHeader(r *http.Request, f *forwarding, upgrade string, vals *[4]string) http.Header {
	in := r.Header
	out := make(http.Header, len(in)+4)
	for k, v := range in {
		if f.passes(k) {
			out[k] = v
		}
	}
	if f.te {
		out["Te"] = teTrailers
	}
	// A proxy passes the client's User-Agent or none: left absent, the
	// transport would write its own. Checked on what passes, not on what
	// the client sent: a User-Agent its Connection names is dropped too.
	if _, ok := out["User-Agent"]; !ok {
		out["User-Agent"] = noUserAgent
	}
	if upgrade != "" {
		out["Connection"] = connUpgrade
		out["Upgrade"] = []string{upgrade}
	}
	if f.client.IsValid() {
		ip := f.client.String()
		if len(f.priorXFF) > 0 {
			ip = strings.Join(f.priorXFF, ", ") + ", " + ip
		}
		vals[0] = ip
		out[headerXFF] = vals[0:1:1]
	}
	if f.proto != "" {
		vals[1] = f.proto
		out[headerXFProto] = vals[1:2:2]
	}
	if f.host != "" {
		vals[2] = f.host
		out[headerXFHost] = vals[2:3:3]
	}
	if f.ownID != 0 {
		vals[3] = RequestID{own: f.ownID}.String()
		out[headerXRequestID] = vals[3:4:4]
	}
	return out
}

// clientAddr parses the client's IP from a RemoteAddr ("ip:port").
func clientAddr(remote string) (netip.Addr, bool) {
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		return ap.Addr().Unmap(), true
	}
	if a, err := netip.ParseAddr(remote); err == nil {
		return a.Unmap(), true
	}
	return netip.Addr{}, false
}

// isTrusted reports whether the client is one of the trusted proxies.
func (p *Proxy) isTrusted(a netip.Addr) bool { return contains(p.trusted, a) }

func contains(nets []netip.Prefix, a netip.Addr) bool {
	for _, pfx := range nets {
		if pfx.Contains(a) {
			return true
		}
	}
	return false
}

// copyResponseHeader copies the upstream's end-to-end response headers into
// dst, sharing the value slices.
func copyResponseHeader(dst, src http.Header) {
	conn := src["Connection"]
	for k, v := range src {
		if isHopByHop(k) || (conn != nil && namedByConnection(conn, k)) {
			continue
		}
		dst[k] = v
	}
}
