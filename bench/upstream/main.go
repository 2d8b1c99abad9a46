// Command upstream is the origin server of the benchmark (bench/run.sh): it
// answers GET /1k with a fixed 1 KiB body, GET /1m with a fixed 1 MiB one
// and GET /html64k with a fixed 64 KiB HTML page (text/html, compressible
// as pages are: the compression cell), over HTTP/1.1 keep-alive, and optionally over TLS for the direct HTTPS
// ceiling. It does as little as possible per request so that the proxies'
// costs, not the origin's, set the differences between rows.
package main

import (
	"bytes"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

// body is a fixed response: its bytes and the header values sent with them,
// built once so a request only assigns slices.
type body struct {
	data   []byte
	length []string
}

func newBody(n int) body {
	// Printable bytes, so a body shown in a debugging session reads as text.
	b := bytes.Repeat([]byte("scafo-edge bench "), n/17+1)[:n]
	return body{data: b, length: []string{strconv.Itoa(n)}}
}

var contentType = []string{"application/octet-stream"}

// htmlType is /html64k's: a type every proxy compresses.
var htmlType = []string{"text/html; charset=utf-8"}

type handler struct {
	small, large, html body
	// TLS requests served, and those on a resumed session: /stats tells
	// whether the load generator's new connections resumed sessions (a
	// full handshake signs with the certificate key; a resumed one does
	// not), which says what a "new connection per request" cell measures.
	tlsRequests, resumed atomic.Int64
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.TLS != nil {
		h.tlsRequests.Add(1)
		if r.TLS.DidResume {
			h.resumed.Add(1)
		}
	}
	var b body
	switch r.URL.Path {
	case "/stats":
		fmt.Fprintf(w, "{\"tls_requests\": %d, \"resumed\": %d}\n", h.tlsRequests.Load(), h.resumed.Load())
		return
	case "/1k", "/":
		b = h.small
	case "/1m":
		b = h.large
	case "/html64k":
		b = h.html
	default:
		http.NotFound(w, r)
		return
	}
	hdr := w.Header()
	hdr["Content-Type"] = contentType
	if r.URL.Path == "/html64k" {
		hdr["Content-Type"] = htmlType
	}
	hdr["Content-Length"] = b.length
	if r.Method == http.MethodHead {
		return
	}
	w.Write(b.data)
}

func main() {
	addr := flag.String("addr", "127.0.0.1:18080", "plain HTTP listen address")
	tlsAddr := flag.String("tls-addr", "", "HTTPS listen address (needs -cert and -key); empty: none")
	cert := flag.String("cert", "", "PEM certificate for -tls-addr")
	key := flag.String("key", "", "PEM key for -tls-addr")
	flag.Parse()

	h := &handler{small: newBody(1 << 10), large: newBody(1 << 20), html: htmlBody(64 << 10)}
	newServer := func() *http.Server {
		return &http.Server{
			Handler:           h,
			ReadHeaderTimeout: 10 * time.Second,
			// Longer than any benchmark cell: a proxy's pooled connection
			// must never be closed under it mid-run.
			IdleTimeout: 10 * time.Minute,
			ErrorLog:    log.New(os.Stderr, "upstream: ", 0),
		}
	}

	errc := make(chan error, 2)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatalf("upstream: listen %s: %v", *addr, err)
	}
	srv := newServer()
	go func() { errc <- srv.Serve(ln) }()
	servers := []*http.Server{srv}

	if *tlsAddr != "" {
		if *cert == "" || *key == "" {
			log.Fatal("upstream: -tls-addr needs -cert and -key")
		}
		tln, err := net.Listen("tcp", *tlsAddr)
		if err != nil {
			log.Fatalf("upstream: listen %s: %v", *tlsAddr, err)
		}
		tsrv := newServer()
		// HTTP/1.1 only, like the proxies' HTTPS rows (wrk speaks no h2).
		tsrv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){}
		go func() { errc <- tsrv.ServeTLS(tln, *cert, *key) }()
		servers = append(servers, tsrv)
	}
	fmt.Fprintf(os.Stderr, "upstream: serving /1k, /1m and /html64k on %s", ln.Addr())
	if *tlsAddr != "" {
		fmt.Fprintf(os.Stderr, " and https://%s", *tlsAddr)
	}
	fmt.Fprintln(os.Stderr)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			log.Fatalf("upstream: serve: %v", err)
		}
	}
	for _, s := range servers {
		s.Close()
	}
}
