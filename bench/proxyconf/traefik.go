package main

import (
	"fmt"
	"strings"
)

// traefik is Traefik's dynamic configuration, for its file provider (the
// static one, the entry points "plain" and "tls", is the command line the
// script builds). The certificate is the default one, so the TLS entry
// point serves it, and h2, which Traefik offers by ALPN by default. No
// access log is configured, so none is written.
//
// One application takes every request, whatever its Host (routers "plain"
// and "tls", as bench/run.sh always had them); with several, each has a
// router per entry point matching its host ("<name>" and "<name>-tls").
// Tuned gives the services a transport keeping 256 idle connections.
//
// With compress (traefik-compress.yml, the compression cell's), every
// router goes through Traefik's compress middleware, zstd first, then
// gzip, at its defaults otherwise.
func (s *Setup) traefik(compress bool) string {
	var b strings.Builder
	mw := ""
	if compress {
		b.WriteString("http:\n  middlewares:\n    compress: {compress: {encodings: [zstd, gzip]}}\n  routers:\n")
		mw = ", middlewares: [compress]"
	} else {
		b.WriteString("http:\n  routers:\n")
	}
	if len(s.Routes) == 1 {
		name := s.Routes[0].Name
		fmt.Fprintf(&b, "    plain: {rule: \"PathPrefix(`/`)\", entryPoints: [plain], service: %s%s}\n", name, mw)
		fmt.Fprintf(&b, "    tls: {rule: \"PathPrefix(`/`)\", entryPoints: [tls], service: %s, tls: {}%s}\n", name, mw)
	} else {
		for _, r := range s.Routes {
			fmt.Fprintf(&b, "    %s: {rule: \"Host(`%s`)\", entryPoints: [plain], service: %[1]s%[3]s}\n", r.Name, r.Host, mw)
		}
		for _, r := range s.Routes {
			fmt.Fprintf(&b, "    %s-tls: {rule: \"Host(`%s`)\", entryPoints: [tls], service: %[1]s, tls: {}%[3]s}\n", r.Name, r.Host, mw)
		}
	}
	b.WriteString("  services:\n")
	for _, r := range s.Routes {
		fmt.Fprintf(&b, "    %s:\n      loadBalancer:\n", r.Name)
		if s.Tuned {
			b.WriteString("        serversTransport: bench\n")
		}
		fmt.Fprintf(&b, "        servers: [{url: \"http://%s\"}]\n", r.Addr)
	}
	if s.Tuned {
		b.WriteString("  serversTransports:\n    bench: {maxIdleConnsPerHost: 256}\n")
	}
	fmt.Fprintf(&b, `tls:
  stores:
    default:
      defaultCertificate: {certFile: "%s", keyFile: "%s"}
`, s.path("cert.pem"), s.path("key.pem"))
	return b.String()
}
