// Command proxyconf writes the configuration files of the proxies the
// bench measures, scafo-edge, Caddy, Traefik, nginx and HAProxy, for
// bench/run.sh and bench/overload.sh alike: the scripts start the proxies,
// and this is the one place that says how each is configured.
//
//	proxyconf [flags] PROXY...
//
// writes into -dir, for each PROXY named:
//
//	scafo-edge  routes.json (its --routes-file)
//	caddy       caddy.json; caddy-h3.json, whose TLS server adds h3;
//	            caddy-encode.json, compressing (encode, zstd then gzip)
//	traefik     traefik.yml (the file provider's dynamic configuration;
//	            the static one is the command line the script builds);
//	            traefik-compress.yml, compressing (compress middleware)
//	nginx       nginx/nginx.conf; with TLS, nginx/nginx-h2.conf, whose TLS
//	            listener also offers h2; nginx/nginx-gzip.conf, compressing
//	haproxy     haproxy.cfg; with TLS, haproxy-h2.cfg, whose TLS bind
//	            offers h2 first; with -haproxy-server-maxconn,
//	            haproxy-queue.cfg; haproxy-gzip.cfg, compressing
//
// The compressing variants are bench/run.sh's http-html64k cell's; no other
// cell uses them (scafo-edge compresses by default and needs none).
//
// The certificate is -dir's cert.pem and key.pem (bundle.pem, both in one,
// for HAProxy), made by the script.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

func main() {
	if err := run(os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "proxyconf: %v\n", err)
		os.Exit(2)
	}
}

// run parses args into a Setup and writes the configuration of each proxy
// they name.
func run(args []string, stderr io.Writer) error {
	s, proxies, err := parse(args, stderr)
	if err != nil {
		return err
	}
	s.Root = os.Geteuid() == 0
	for _, p := range proxies {
		if err := s.Write(p); err != nil {
			return err
		}
	}
	return nil
}

// parse reads the flags into a Setup, checked, and returns the proxies
// named after them.
func parse(args []string, stderr io.Writer) (Setup, []string, error) {
	fs := flag.NewFlagSet("proxyconf", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var s Setup
	var routes routeFlag
	var plainOnly string
	fs.StringVar(&s.Dir, "dir", "", "the work directory: configurations are written here, the certificate is read from here (required)")
	fs.StringVar(&s.Addr, "addr", "", "the proxies' plain HTTP listener, host:port (required)")
	fs.StringVar(&s.TLSAddr, "tls-addr", "", "the proxies' TLS listener, host:port (required)")
	fs.Var(&routes, "route", "NAME=HOST=ADDR: requests for HOST go to the application NAME at ADDR; repeat in order, the first is the default (at least one)")
	fs.IntVar(&s.Workers, "workers", 0, "nginx worker_processes and HAProxy nbthread (required)")
	fs.BoolVar(&s.Tuned, "tuned", false, "bench/run.sh's fairness settings (bench/README.md): idle upstream pools of 256 everywhere, nginx's keep-alive raised and its buffering off")
	fs.StringVar(&plainOnly, "plain-only", "", "comma list of nginx, haproxy: those get no TLS listener")
	fs.IntVar(&s.NginxWorkerConnections, "nginx-worker-connections", 4096, "nginx's worker_connections")
	fs.IntVar(&s.HAProxyMaxConn, "haproxy-maxconn", 0, "HAProxy's global maxconn; 0: none, HAProxy derives one from ulimit -n")
	fs.IntVar(&s.HAProxyServerMaxConn, "haproxy-server-maxconn", 0, "with it, haproxy-queue.cfg: this maxconn on each server, and -haproxy-queue-timeout")
	fs.StringVar(&s.HAProxyQueueTimeout, "haproxy-queue-timeout", "5s", "haproxy-queue.cfg's timeout queue")
	if err := fs.Parse(args); err != nil {
		return Setup{}, nil, err
	}
	s.Routes = routes
	for _, p := range strings.Split(plainOnly, ",") {
		switch p {
		case "":
		case "nginx":
			s.NginxPlainOnly = true
		case "haproxy":
			s.HAProxyPlainOnly = true
		default:
			return Setup{}, nil, fmt.Errorf("-plain-only %s: want nginx or haproxy", p)
		}
	}
	if fs.NArg() == 0 {
		return Setup{}, nil, errors.New("name at least one proxy: scafo-edge, caddy, traefik, nginx or haproxy")
	}
	if err := s.check(); err != nil {
		return Setup{}, nil, err
	}
	return s, fs.Args(), nil
}

// routeFlag collects -route NAME=HOST=ADDR flags, in order.
type routeFlag []Route

func (r *routeFlag) String() string { return fmt.Sprint(*r) }

func (r *routeFlag) Set(v string) error {
	parts := strings.Split(v, "=")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return fmt.Errorf("%q: want NAME=HOST=ADDR", v)
	}
	*r = append(*r, Route{Name: parts[0], Host: parts[1], Addr: parts[2]})
	return nil
}
