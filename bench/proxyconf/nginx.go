package main

import (
	"fmt"
	"strings"
)

// nginx is nginx's configuration: Workers worker processes, each listener
// with reuseport (otherwise one worker accepts every connection), an
// upstream per application kept alive (nginx keeps none unless told), and
// a server per application, the first the default. Its TLS listener
// (unless NginxPlainOnly) speaks TLS 1.2 and 1.3, and offers h2 by ALPN
// only with h2: the HTTP/1.1 cells run without it.
//
// Tuned raises keepalive_requests so no connection, client or upstream, is
// closed every 1000 requests, and turns buffering off: bodies stream
// through a 32 KiB buffer, as the Go proxies copy them, instead of spooling
// a 1 MiB body to a temporary file.
//
// With gzip (nginx-gzip.conf, the compression cell's), responses of 512
// bytes or more of the usual text types are gzipped for clients that take
// it, proxied ones included, at nginx's default gzip_comp_level (1);
// Debian's nginx has no zstd module.
func (s *Setup) nginx(h2, gzip bool) string {
	var b strings.Builder
	user := ""
	if s.Root {
		// Its workers would run as nobody, who cannot read the work
		// directory's files.
		user = "user root;"
	}
	dir := s.path("nginx")
	fmt.Fprintf(&b, `%s
worker_processes %d;
daemon off;
pid %s/nginx.pid;
error_log %[3]s/error.log error;
events { worker_connections %d; }
http {
  access_log off;
`, user, s.Workers, dir, s.NginxWorkerConnections)
	// keepAlive raises what a client or upstream connection may carry.
	keepAlive := func(indent string) {
		if s.Tuned {
			fmt.Fprintf(&b, "%[1]skeepalive_requests 100000000;\n%[1]skeepalive_timeout 120s;\n", indent)
		}
	}
	keepAlive("  ")
	if gzip {
		// text/html is always in gzip_types (naming it draws a warning).
		b.WriteString(`  gzip on;
  gzip_types text/plain text/css text/xml application/json application/javascript application/xml image/svg+xml;
  gzip_proxied any;
  gzip_min_length 512;
  gzip_vary on;
`)
	}
	for _, t := range [][2]string{{"client_body", "body"}, {"proxy", "proxy"}, {"fastcgi", "fastcgi"}, {"uwsgi", "uwsgi"}, {"scgi", "scgi"}} {
		fmt.Fprintf(&b, "  %s_temp_path %s/tmp/%s;\n", t[0], dir, t[1])
	}
	for _, r := range s.Routes {
		fmt.Fprintf(&b, "  upstream %s {\n    server %s;\n    keepalive 256;\n", r.Name, r.Addr)
		keepAlive("    ")
		b.WriteString("  }\n")
	}
	for i, r := range s.Routes {
		// The first server takes the listeners' reuseport (one server may
		// set it per address) and, with others, is the default.
		first := ""
		if i == 0 {
			first = " reuseport"
			if len(s.Routes) > 1 {
				first += " default_server"
			}
		}
		fmt.Fprintf(&b, "  server {\n    listen %s%s;\n", s.Addr, first)
		if !s.NginxPlainOnly {
			http2 := ""
			if h2 {
				http2 = " http2"
			}
			fmt.Fprintf(&b, "    listen %s ssl%s%s;\n", s.TLSAddr, http2, first)
		}
		fmt.Fprintf(&b, "    server_name %s;\n", r.Host)
		if !s.NginxPlainOnly {
			fmt.Fprintf(&b, "    ssl_certificate %s;\n    ssl_certificate_key %s;\n", s.path("cert.pem"), s.path("key.pem"))
			// TLS 1.2 and 1.3, as every other server here. nginx before
			// 1.23.4 (Debian 12 has 1.22) leaves 1.3 off unless told, and
			// a resumed TLS 1.2 handshake does no key exchange at all,
			// where a resumed 1.3 one still does (X25519): the
			// new-connection cells would compare different handshakes.
			b.WriteString("    ssl_protocols TLSv1.2 TLSv1.3;\n")
		}
		fmt.Fprintf(&b, `    location / {
      proxy_pass http://%s;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto $scheme;
`, r.Name)
		if s.Tuned {
			b.WriteString(`      proxy_buffering off;
      proxy_buffer_size 32k;
      proxy_buffers 4 32k;
      proxy_busy_buffers_size 64k;
`)
		}
		b.WriteString("    }\n  }\n")
	}
	b.WriteString("}\n")
	return b.String()
}
