package main

import (
	"errors"
	"flag"
	"net"
	"net/http"
	"time"
)

// sinkCmd serves a bare net/http server on -addr that answers every request
// 404: somewhere to aim a row's load instead of the proxy (`row
// -load-addr`), while fast.test is still measured through the proxy. What
// fast.test loses then is what the load costs the box by itself (the load
// processes' CPU, the kernel's work for their packets) and not what the
// proxy does with it: the floor a proxy's row is measured against on a box
// that runs the load beside it.
func sinkCmd(args []string) error {
	fs := flag.NewFlagSet("sink", flag.ContinueOnError)
	addr := fs.String("addr", "", "listen address, 127.0.0.1:PORT")
	headerTimeout := fs.Duration("read-header-timeout", 60*time.Second, "time a client has to send its request headers")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *addr == "" {
		return errors.New("need -addr")
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	return newSink(*headerTimeout).Serve(ln)
}

func newSink(headerTimeout time.Duration) *http.Server {
	return &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: headerTimeout}
}
