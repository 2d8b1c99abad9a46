// Command edgeprof serves the edge's request path (edge.Handler in front of
// backhaul.Proxy, with the request metrics on, wired as cmd/scafo-edge's
// serve command wires them for --tls off --access-log=false) and exposes
// net/http/pprof on a second listener, so that bench/run.sh --profile can
// take CPU and allocation profiles under load until the edge serves pprof
// on its own admin listener. It reads one routing document from a file and
// never re-reads it.
package main

import (
	"errors"
	"flag"
	"log"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/scafo/scafo-edge/backhaul"
	"github.com/scafo/scafo-edge/edge"
	"github.com/scafo/scafo-edge/node"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:18081", "proxy listen address")
	pprofAddr := flag.String("pprof-addr", "127.0.0.1:18082", "pprof listen address")
	routes := flag.String("routes-file", "", "routing document (JSON)")
	flag.Parse()

	body, err := os.ReadFile(*routes)
	if err != nil {
		log.Fatalf("edgeprof: read routes: %v", err)
	}
	doc, err := node.Parse(body)
	if err != nil {
		log.Fatalf("edgeprof: parse routes: %v", err)
	}
	reg := prometheus.NewRegistry()
	live := &edge.Live{}
	edge.NewUpdater(live, zerolog.Nop(), reg).Apply(node.Update{
		Doc: doc, Body: body, Fingerprint: node.Fingerprint(body), FetchedAt: time.Now(),
	})
	if live.Load() == nil {
		log.Fatal("edgeprof: the routing document compiled to no table")
	}

	proxy := backhaul.New(backhaul.Options{Registerer: reg})
	defer proxy.Close()
	metrics := edge.NewMetrics(reg)
	handler := &edge.Handler{Table: live, Forwarder: proxy, Observer: edge.Observers{metrics}}

	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatalf("edgeprof: listen: %v", err)
	}
	pln, err := net.Listen("tcp", *pprofAddr)
	if err != nil {
		log.Fatalf("edgeprof: listen pprof: %v", err)
	}
	// The same server settings as the serve command's defaults.
	srv := &http.Server{
		Handler:           metrics.InFlight(handler),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	psrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	go func() { errc <- psrv.Serve(pln) }()
	log.Printf("edgeprof: proxy on %s, pprof on %s", ln.Addr(), pln.Addr())

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			log.Printf("edgeprof: serve: %v", err)
		}
	}
	srv.Close()
	psrv.Close()
}
