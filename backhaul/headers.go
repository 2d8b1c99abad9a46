package backhaul

import (
	"net/http"
	"net/netip"
	"strings"

	"github.com/scafo/scafo-edge/backhaul/internal/h1"
)

// isHopByHop reports whether a canonical header key names a hop-by-hop
// header (RFC 7230 §6.1, plus Proxy-Connection and Keep-Alive, which
// HTTP/1.0 era clients still send). Those headers describe one connection
// and are never forwarded.
func isHopByHop(key string) bool {
	switch key {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// forbiddenTrailer reports whether a canonical key may not be passed on as
// a trailer: a field that frames the message, routes it, is hop-by-hop, or
// that a recipient would act on only in a header (RFC 9110 §6.5.1): the
// list Go's HTTP/2 server refuses, with Set-Cookie and Upgrade. A trailer
// naming one of them is dropped, never forwarded, in either direction.
func forbiddenTrailer(key string) bool {
	switch key {
	case "Authorization", "Cache-Control", "Connection", "Content-Encoding", "Content-Length",
		"Content-Range", "Content-Type", "Expect", "Host", "Keep-Alive", "Max-Forwards",
		"Pragma", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection", "Range",
		"Realm", "Te", "Trailer", "Transfer-Encoding", "Www-Authenticate", "Set-Cookie", "Upgrade":
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
var dashedProtected = [...]string{"x-real-ip", "content-length", "transfer-encoding",
	"proxy-connection", "keep-alive", "proxy-authorization", "proxy-authenticate"}

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
// an origin for the request; only a trusted proxy's are believed.
func isForwarding(key string) bool {
	return strings.HasPrefix(key, "X-Forwarded-") || key == "Forwarded" || key == "X-Real-Ip"
}

// upgradeProtocol returns the protocol a request or response asks to switch
// to, or "" when it does not ask (Connection must name "upgrade").
func upgradeProtocol(h http.Header) string {
	if !hasToken(h["Connection"], "upgrade") {
		return ""
	}
	return h.Get("Upgrade")
}

// Values shared by every request; the transport only reads them.
var (
	protoHTTP     = []string{"http"}
	protoHTTPS    = []string{"https"}
	teTrailers    = []string{"trailers"}
	connUpgrade   = []string{"Upgrade"}
	noUserAgent   = []string{""}
	headerXFF     = "X-Forwarded-For"
	headerXFProto = "X-Forwarded-Proto"
	headerXFHost  = "X-Forwarded-Host"
)

// outboundHeader returns the header to send upstream for r: r's end-to-end
// headers (value slices shared, not copied), the upgrade headers when
// upgrade is set, and the X-Forwarded-* set. vals backs the values it
// computes, so that they cost no allocation of their own.
func (p *Proxy) outboundHeader(r *http.Request, upgrade string, vals *[2]string) http.Header {
	in := r.Header
	conn := in["Connection"]
	client, clientOK := clientAddr(r.RemoteAddr)
	trusted := clientOK && p.isTrusted(client)

	out := make(http.Header, len(in)+3)
	for k, v := range in {
		if isHopByHop(k) || (conn != nil && namedByConnection(conn, k)) {
			continue
		}
		if (!trusted && isForwarding(k)) || aliasesProtected(k) {
			continue
		}
		out[k] = v
	}
	// "TE: trailers" is how gRPC clients say they accept trailers; it is the
	// one TE value a proxy that forwards trailers may pass on.
	if te := in["Te"]; te != nil && hasToken(te, "trailers") {
		out["Te"] = teTrailers
	}
	// A proxy passes the client's User-Agent or none: left absent, the
	// transport would write its own.
	if _, ok := in["User-Agent"]; !ok {
		out["User-Agent"] = noUserAgent
	}
	if upgrade != "" {
		out["Connection"] = connUpgrade
		out["Upgrade"] = []string{upgrade}
	}

	if clientOK {
		ip := client.String()
		if prior := out[headerXFF]; len(prior) > 0 {
			ip = strings.Join(prior, ", ") + ", " + ip
		}
		vals[0] = ip
		out[headerXFF] = vals[0:1:1]
	}
	if _, ok := out[headerXFProto]; !ok {
		if r.TLS != nil {
			out[headerXFProto] = protoHTTPS
		} else {
			out[headerXFProto] = protoHTTP
		}
	}
	if _, ok := out[headerXFHost]; !ok && r.Host != "" {
		vals[1] = r.Host
		out[headerXFHost] = vals[1:2:2]
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
func (p *Proxy) isTrusted(a netip.Addr) bool {
	for _, pfx := range p.trusted {
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
