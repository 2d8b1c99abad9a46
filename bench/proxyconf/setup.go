package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
)

// Setup is what every proxy's configuration is written from: where it
// listens, the applications behind it, and the few settings in which
// bench/run.sh and bench/overload.sh configure the proxies differently.
type Setup struct {
	// Dir is the work directory: the configurations go there, and the
	// certificate is Dir's cert.pem and key.pem (bundle.pem, both in one,
	// for HAProxy).
	Dir string
	// Addr and TLSAddr are every proxy's plain and TLS listeners.
	Addr, TLSAddr string
	// Routes are the applications, in order. The first is where nginx and
	// HAProxy send a Host no route names.
	Routes []Route
	// Workers is nginx's worker_processes and HAProxy's nbthread (the
	// scripts set GOMAXPROCS to the same).
	Workers int
	// Root: the configurations are for a process running as root (nginx
	// then names root as its workers' user, so they can read Dir).
	Root bool

	// Tuned gives the proxies bench/run.sh's fairness settings
	// (bench/README.md, "Fairness"): idle upstream pools of 256
	// connections (Caddy, Traefik, HAProxy; nginx keeps 256 either way,
	// as it keeps none unless told), nginx's keepalive_requests and
	// keepalive_timeout raised and its buffering off. Without it, each
	// proxy keeps its defaults (bench/overload.sh).
	Tuned bool

	// NginxWorkerConnections is nginx's worker_connections.
	NginxWorkerConnections int
	// NginxPlainOnly and HAProxyPlainOnly: no TLS listener for them (and
	// so no h2 variant).
	NginxPlainOnly, HAProxyPlainOnly bool
	// HAProxyMaxConn is HAProxy's global maxconn; zero leaves none, and
	// HAProxy derives one from the descriptor limit.
	HAProxyMaxConn int
	// HAProxyServerMaxConn, when not zero, adds haproxy-queue.cfg: the
	// same, plus this maxconn on each server and "timeout queue
	// HAProxyQueueTimeout" in the defaults.
	HAProxyServerMaxConn int
	HAProxyQueueTimeout  string
}

// Route is one application: requests for Host go to Addr. Name names it in
// every configuration (scafo-edge's application, nginx's upstream,
// HAProxy's backend, Traefik's service).
type Route struct {
	Name, Host, Addr string
}

// name is what a route's name may be: it goes unquoted into every
// configuration.
var name = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

// check reports the first setting that would write a broken configuration.
func (s *Setup) check() error {
	switch {
	case s.Dir == "":
		return errors.New("-dir: required")
	case len(s.Routes) == 0:
		return errors.New("-route: at least one")
	case s.Workers < 1:
		return fmt.Errorf("-workers %d: want at least 1", s.Workers)
	case s.NginxWorkerConnections < 1:
		return fmt.Errorf("-nginx-worker-connections %d: want at least 1", s.NginxWorkerConnections)
	case s.HAProxyMaxConn < 0 || s.HAProxyServerMaxConn < 0:
		return errors.New("-haproxy-maxconn, -haproxy-server-maxconn: want 0 or more")
	}
	for _, a := range []struct{ flag, v string }{{"-addr", s.Addr}, {"-tls-addr", s.TLSAddr}} {
		if _, _, err := net.SplitHostPort(a.v); err != nil {
			return fmt.Errorf("%s %q: %w", a.flag, a.v, err)
		}
	}
	seen := map[string]bool{}
	for _, r := range s.Routes {
		if !name.MatchString(r.Name) || !name.MatchString(r.Host) {
			return fmt.Errorf("route %s=%s: want letters, digits, '.', '-' and '_' in a name and a host", r.Name, r.Host)
		}
		if seen[r.Name] {
			return fmt.Errorf("route %s: named twice", r.Name)
		}
		seen[r.Name] = true
		if _, _, err := net.SplitHostPort(r.Addr); err != nil {
			return fmt.Errorf("route %s: address %q: %w", r.Name, r.Addr, err)
		}
	}
	return nil
}

// Write writes the configuration files of proxy (scafo-edge, caddy,
// traefik, nginx or haproxy) into s.Dir.
func (s *Setup) Write(proxy string) error {
	var files map[string]string
	switch proxy {
	case "scafo-edge":
		files = map[string]string{"routes.json": s.edgeRoutes()}
	case "caddy":
		files = map[string]string{"caddy.json": s.caddy(false, false), "caddy-h3.json": s.caddy(true, false),
			"caddy-encode.json": s.caddy(false, true)}
	case "traefik":
		files = map[string]string{"traefik.yml": s.traefik(false), "traefik-compress.yml": s.traefik(true)}
	case "nginx":
		// Its temporary files' directories, which nginx makes below it.
		if err := os.MkdirAll(filepath.Join(s.Dir, "nginx", "tmp"), 0o755); err != nil {
			return err
		}
		files = map[string]string{"nginx/nginx.conf": s.nginx(false, false), "nginx/nginx-gzip.conf": s.nginx(false, true)}
		if !s.NginxPlainOnly {
			files["nginx/nginx-h2.conf"] = s.nginx(true, false)
		}
	case "haproxy":
		files = map[string]string{"haproxy.cfg": s.haproxy(haproxyPlain), "haproxy-gzip.cfg": s.haproxy(haproxyGzip)}
		if !s.HAProxyPlainOnly {
			files["haproxy-h2.cfg"] = s.haproxy(haproxyH2)
		}
		if s.HAProxyServerMaxConn > 0 {
			files["haproxy-queue.cfg"] = s.haproxy(haproxyQueue)
		}
	default:
		return fmt.Errorf("unknown proxy %q: want scafo-edge, caddy, traefik, nginx or haproxy", proxy)
	}
	for f, text := range files {
		if err := os.WriteFile(filepath.Join(s.Dir, f), []byte(text), 0o644); err != nil {
			return fmt.Errorf("%s: %w", proxy, err)
		}
	}
	return nil
}

// path is the name of a file in the work directory, as configurations
// refer to it.
func (s *Setup) path(name string) string { return filepath.Join(s.Dir, name) }
