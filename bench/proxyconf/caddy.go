package main

// obj is a JSON object, for configurations whose shape is Caddy's.
type obj = map[string]any

// caddy is Caddy's JSON configuration: the admin API and automatic HTTPS
// off, logs at ERROR (no access log is configured), the certificate loaded
// from files, and two servers, as Caddy makes every listener of a server
// TLS once it has a connection policy: plain (h1) on s.Addr and TLS (h1,
// h2, and with h3 also HTTP/3 on the UDP side of the port) on s.TLSAddr.
// Each routes a host to its application; Tuned sizes the idle pool.
//
// With encode (caddy-encode.json, the compression cell's), each route
// first runs Caddy's encode handler, zstd preferred to gzip, with its
// defaults otherwise (gzip level 5, zstd's default level, responses of 512
// bytes or more of the types it compresses): what a Caddyfile's
// "encode zstd gzip" gives.
func (s *Setup) caddy(h3, encode bool) string {
	var routes []any
	for _, r := range s.Routes {
		rp := obj{"handler": "reverse_proxy", "upstreams": []any{obj{"dial": r.Addr}}}
		if s.Tuned {
			rp["transport"] = obj{"protocol": "http", "keep_alive": obj{"enabled": true,
				"max_idle_conns": 256, "max_idle_conns_per_host": 256}}
		}
		handle := []any{rp}
		if encode {
			handle = []any{obj{"handler": "encode", "encodings": obj{"zstd": obj{}, "gzip": obj{}},
				"prefer": []any{"zstd", "gzip"}}, rp}
		}
		routes = append(routes, obj{"match": []any{obj{"host": []any{r.Host}}}, "handle": handle, "terminal": true})
	}
	protos := []any{"h1", "h2"}
	if h3 {
		protos = append(protos, "h3")
	}
	return marshal(obj{
		"admin":   obj{"disabled": true},
		"logging": obj{"logs": obj{"default": obj{"level": "ERROR"}}},
		"storage": obj{"module": "file_system", "root": s.path("caddy-data")},
		"apps": obj{
			"tls": obj{"certificates": obj{"load_files": []any{
				obj{"certificate": s.path("cert.pem"), "key": s.path("key.pem"), "tags": []any{"bench"}}}}},
			"http": obj{"servers": obj{
				"plain": obj{"listen": []any{s.Addr}, "protocols": []any{"h1"},
					"automatic_https": obj{"disable": true}, "routes": routes},
				"tls": obj{"listen": []any{s.TLSAddr}, "protocols": protos,
					"automatic_https":         obj{"disable": true},
					"tls_connection_policies": []any{obj{"certificate_selection": obj{"any_tag": []any{"bench"}}}},
					"routes":                  routes},
			}},
		},
	})
}
