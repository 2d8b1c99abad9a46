// Command gotls is the floor of the benchmark's TLS cells, bench/run.sh's
// go-tls row: a bare Go HTTPS server, crypto/tls and net/http, with the TLS
// settings scafo-edge's HTTPS listener uses (certs.Manager.TLSConfig: TLS
// 1.2 and 1.3, ECDHE AEAD suites only for 1.2, ALPN h2 and http/1.1, Go's
// default key exchanges, session tickets on), and the benchmark's ECDSA
// P-256 certificate, as the edge's internal CA issues. Its handler writes a
// fixed 1 KiB body for GET /1k (1 MiB for /1m) itself: nothing is proxied,
// routed, admitted or logged, and the one certificate is held, not looked up.
// With -h3 it also serves HTTP/3 on the UDP side of the same port with
// quic-go's http3 server, as the edge does.
//
// What a request costs it is what any server on Go's crypto/tls (and
// quic-go) pays at least: against that row, the other Go rows' extra is
// their own, and a target below it is out of reach for a server on these
// libraries.
//
// Usage:
//
//	gotls -addr 127.0.0.1:18083 -cert cert.pem -key key.pem [-h3]
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
	"syscall"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/scafo/scafo-edge/certs"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:18083", "HTTPS listen `address` (TCP; with -h3 also UDP)")
	certFile := flag.String("cert", "", "PEM certificate `file`")
	keyFile := flag.String("key", "", "PEM key `file`")
	h3 := flag.Bool("h3", false, "also serve HTTP/3 on the UDP side of -addr")
	flag.Parse()
	if *certFile == "" || *keyFile == "" {
		log.Fatal("gotls: -cert and -key are needed")
	}
	cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
	if err != nil {
		log.Fatalf("gotls: %v", err)
	}
	s, err := listen(*addr, cert, *h3)
	if err != nil {
		log.Fatalf("gotls: %v", err)
	}
	fmt.Fprintf(os.Stderr, "gotls: serving https://%s (HTTP/3: %v)\n", s.tcp.Addr(), *h3)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
	case err := <-s.errc:
		if !errors.Is(err, http.ErrServerClosed) {
			log.Fatalf("gotls: serve: %v", err)
		}
	}
	s.close()
}

// tlsConfig is scafo-edge's HTTPS listener configuration
// (certs.Manager.TLSConfig) with one held certificate in place of the
// certificate manager's lookup, and without acme-tls/1, which no
// benchmark client offers.
func tlsConfig(cert tls.Certificate) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"h2", "http/1.1"},
		MinVersion:   tls.VersionTLS12,
		CipherSuites: certs.CipherSuites(),
	}
}

// handler answers /1k and /1m with fixed bodies built once, like
// bench/upstream: a request assigns two header slices and writes.
type handler struct{ small, large body }

type body struct {
	data   []byte
	length []string
}

func newBody(n int) body {
	b := bytes.Repeat([]byte("scafo-edge bench "), n/17+1)[:n]
	return body{data: b, length: []string{strconv.Itoa(n)}}
}

var contentType = []string{"application/octet-stream"}

func newHandler() *handler { return &handler{small: newBody(1 << 10), large: newBody(1 << 20)} }

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var b body
	switch r.URL.Path {
	case "/1k", "/":
		b = h.small
	case "/1m":
		b = h.large
	default:
		http.NotFound(w, r)
		return
	}
	hdr := w.Header()
	hdr["Content-Type"] = contentType
	hdr["Content-Length"] = b.length
	if r.Method != http.MethodHead {
		w.Write(b.data)
	}
}

// server is the HTTPS server and, with -h3, the HTTP/3 one beside it.
type server struct {
	tcp  net.Listener
	udp  net.PacketConn // nil without -h3
	tr   *quic.Transport
	srv  *http.Server
	h3   *http3.Server
	errc chan error
}

// listen binds addr (TCP, and UDP with h3) and serves until close.
func listen(addr string, cert tls.Certificate, h3 bool) (*server, error) {
	h := newHandler()
	conf := tlsConfig(cert)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen tcp %s: %w", addr, err)
	}
	s := &server{
		tcp:  ln,
		srv:  &http.Server{Handler: h, TLSConfig: conf, ReadHeaderTimeout: 10 * time.Second, ErrorLog: log.New(os.Stderr, "gotls: ", 0)},
		errc: make(chan error, 2),
	}
	if h3 {
		// The port the TCP listener got, so that ":0" means one port for both.
		if s.udp, err = net.ListenPacket("udp", ln.Addr().String()); err != nil {
			ln.Close()
			return nil, fmt.Errorf("listen udp %s: %w", ln.Addr(), err)
		}
		// As the edge listens (serving.HTTP3): a quic.Transport of its
		// own, connections handed over once their handshake is complete,
		// no 0-RTT (http3.Server.Serve would listen early and allow it).
		s.tr = &quic.Transport{Conn: s.udp}
		qln, err := s.tr.Listen(http3.ConfigureTLSConfig(conf), &quic.Config{})
		if err != nil {
			ln.Close()
			s.tr.Close()
			s.udp.Close()
			return nil, fmt.Errorf("listen for HTTP/3 on %s: %w", s.udp.LocalAddr(), err)
		}
		s.h3 = &http3.Server{Handler: h}
		go func() { s.errc <- s.h3.ServeListener(qln) }()
	}
	// ServeTLS adds h2 to net/http's server as it does for the edge.
	go func() { s.errc <- s.srv.ServeTLS(ln, "", "") }()
	return s, nil
}

func (s *server) close() {
	s.srv.Close()
	if s.h3 != nil {
		s.h3.Close()
		s.tr.Close()
		s.udp.Close()
	}
}
