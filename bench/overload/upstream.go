package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The applications behind the proxy. fast.test's answers at once with a
// small body; slow.test's holds every request until released (GET /release
// on this process's control address) or until -max-hold, whichever comes
// first, then answers 200 with "Connection: close", so that a proxy keeps
// no pooled connection from the held requests once they are answered.
// GET /ping on the slow address answers at once: the script's check that
// the route works, without holding anything.
//
// Several processes share the two ports (SO_REUSEPORT, the kernel spreads
// connections between them), so that no process nears the descriptor
// limit; each has its own control address.

type apps struct {
	released     chan struct{}
	release      sync.Once
	maxHold      time.Duration
	held, peak   atomic.Int64
	slow, fast   atomic.Int64
	answeredHeld atomic.Int64
}

var smallBody = []byte("fast.test: ok, answered at once by bench/overload upstream\n")
var heldBody = []byte("slow.test: released\n")

// Stats is what GET /stats and GET /release answer.
type Stats struct {
	Held     int64 `json:"held"`      // requests held now
	PeakHeld int64 `json:"peak_held"` // most held at once
	Slow     int64 `json:"slow"`      // slow.test requests seen (pings excluded)
	Answered int64 `json:"answered"`  // held requests answered 200
	Fast     int64 `json:"fast"`      // fast.test requests served
}

func (a *apps) stats() Stats {
	return Stats{Held: a.held.Load(), PeakHeld: a.peak.Load(), Slow: a.slow.Load(),
		Answered: a.answeredHeld.Load(), Fast: a.fast.Load()}
}

func (a *apps) serveFast(w http.ResponseWriter, r *http.Request) {
	a.fast.Add(1)
	w.Header()["Content-Length"] = []string{strconv.Itoa(len(smallBody))}
	w.Header()["Content-Type"] = []string{"text/plain"}
	w.Write(smallBody)
}

func (a *apps) serveSlow(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/ping" {
		a.serveFast(w, r)
		return
	}
	a.slow.Add(1)
	n := a.held.Add(1)
	for {
		p := a.peak.Load()
		if n <= p || a.peak.CompareAndSwap(p, n) {
			break
		}
	}
	defer a.held.Add(-1)
	t := time.NewTimer(a.maxHold)
	defer t.Stop()
	select {
	case <-a.released:
	case <-t.C:
	case <-r.Context().Done():
		return // the proxy (or the client) gave up on it
	}
	w.Header().Set("Connection", "close")
	w.Header()["Content-Length"] = []string{strconv.Itoa(len(heldBody))}
	w.Write(heldBody)
	a.answeredHeld.Add(1)
}

func (a *apps) control() http.Handler {
	mux := http.NewServeMux()
	reply := func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(a.stats())
	}
	mux.HandleFunc("/stats", func(w http.ResponseWriter, r *http.Request) { reply(w) })
	mux.HandleFunc("/release", func(w http.ResponseWriter, r *http.Request) {
		a.release.Do(func() { close(a.released) })
		reply(w)
	})
	return mux
}

// listenReusePort listens on addr with SO_REUSEPORT, so sibling processes
// share the port.
func listenReusePort(addr string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, 0xf /* SO_REUSEPORT */, 1)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	return lc.Listen(context.Background(), "tcp", addr)
}

func upstreamCmd(args []string) error {
	fs := flag.NewFlagSet("upstream", flag.ContinueOnError)
	fastAddr := fs.String("fast-addr", "", "fast.test's listen address (shared by SO_REUSEPORT)")
	slowAddr := fs.String("slow-addr", "", "slow.test's listen address (shared by SO_REUSEPORT)")
	controlAddr := fs.String("control-addr", "", "this process's /stats and /release")
	maxHold := fs.Duration("max-hold", 3*time.Minute, "answer a held request after this long even without a release")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *fastAddr == "" || *slowAddr == "" || *controlAddr == "" {
		return errors.New("need -fast-addr, -slow-addr and -control-addr")
	}
	a := &apps{released: make(chan struct{}), maxHold: *maxHold}
	logger := log.New(os.Stderr, fmt.Sprintf("upstream[%d]: ", os.Getpid()), 0)
	server := func(h http.Handler) *http.Server {
		return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second,
			IdleTimeout: 10 * time.Minute, ErrorLog: logger}
	}
	var servers []*http.Server
	errc := make(chan error, 3)
	for _, l := range []struct {
		addr  string
		h     http.HandlerFunc
		reuse bool
	}{{*fastAddr, a.serveFast, true}, {*slowAddr, a.serveSlow, true}, {*controlAddr, a.control().ServeHTTP, false}} {
		var ln net.Listener
		var err error
		if l.reuse {
			ln, err = listenReusePort(l.addr)
		} else {
			ln, err = net.Listen("tcp", l.addr)
		}
		if err != nil {
			return err
		}
		s := server(l.h)
		servers = append(servers, s)
		go func() { errc <- s.Serve(ln) }()
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	var err error
	select {
	case <-sig:
	case err = <-errc:
	}
	for _, s := range servers {
		s.Close()
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}
