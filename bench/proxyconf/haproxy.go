package main

import (
	"fmt"
	"strings"
)

// haproxyVariant is one of HAProxy's configuration files.
type haproxyVariant int

const (
	haproxyPlain haproxyVariant = iota // haproxy.cfg: its TLS bind offers http/1.1 only
	haproxyH2                          // haproxy-h2.cfg: its TLS bind offers h2 first
	haproxyQueue                       // haproxy-queue.cfg: haproxyPlain with a per-server maxconn and a queue
	haproxyGzip                        // haproxy-gzip.cfg: haproxyPlain compressing responses with gzip
)

// haproxy is HAProxy's configuration: Workers threads, the timeouts and
// keep-alive of both scripts, X-Forwarded-For (and, with TLS,
// X-Forwarded-Proto) set, one frontend sending each host to its
// application's backend and any other to the first's. With Tuned, each
// server keeps 256 idle connections (http-reuse always shares them).
//
// The queue variant is what HAProxy's operators add for a slow backend:
// requests beyond HAProxyServerMaxConn at a server wait in its backend's
// queue, and one that waited HAProxyQueueTimeout gets 503.
//
// The gzip variant (the compression cell's) compresses the usual text
// types with gzip for clients that take it, at HAProxy's defaults
// otherwise; it has no zstd.
func (s *Setup) haproxy(variant haproxyVariant) string {
	var b strings.Builder
	fmt.Fprintf(&b, "global\n  nbthread %d\n", s.Workers)
	if s.HAProxyMaxConn > 0 {
		fmt.Fprintf(&b, "  maxconn %d\n", s.HAProxyMaxConn)
	}
	b.WriteString(`defaults
  mode http
  timeout connect 5s
  timeout client 120s
  timeout server 120s
  timeout http-keep-alive 120s
`)
	if variant == haproxyQueue {
		fmt.Fprintf(&b, "  timeout queue %s\n", s.HAProxyQueueTimeout)
	}
	if variant == haproxyGzip {
		b.WriteString("  compression algo gzip\n  compression type text/html text/plain text/css text/xml application/json application/javascript application/xml image/svg+xml\n")
	}
	fmt.Fprintf(&b, `  option http-keep-alive
  option forwardfor
  http-reuse always
frontend bench
  bind %s
`, s.Addr)
	if !s.HAProxyPlainOnly {
		alpn := "http/1.1"
		if variant == haproxyH2 {
			alpn = "h2,http/1.1"
		}
		fmt.Fprintf(&b, `  bind %s ssl crt %s alpn %s
  http-request set-header X-Forwarded-Proto https if { ssl_fc }
  http-request set-header X-Forwarded-Proto http if !{ ssl_fc }
`, s.TLSAddr, s.path("bundle.pem"), alpn)
	}
	for _, r := range s.Routes[1:] {
		fmt.Fprintf(&b, "  use_backend %s if { hdr(host) -i %s }\n", r.Name, r.Host)
	}
	fmt.Fprintf(&b, "  default_backend %s\n", s.Routes[0].Name)
	for _, r := range s.Routes {
		fmt.Fprintf(&b, "backend %s\n  server %[1]s %s", r.Name, r.Addr)
		if s.Tuned {
			b.WriteString(" pool-max-conn 256")
		}
		if variant == haproxyQueue {
			fmt.Fprintf(&b, " maxconn %d", s.HAProxyServerMaxConn)
		}
		b.WriteString("\n")
	}
	return b.String()
}
