package main

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// shutdown closes the listeners and waits up to timeout for in-flight
// requests, upgraded connections (WebSockets) included, then closes the
// connections that remain; upgraded ones end with the process.
// http.Server.Shutdown forgets a hijacked connection, so those are waited
// for through sv.requests, which counts every handler still running: a
// tunnel's lasts as long as the tunnel.
func (sv *servers) shutdown(timeout time.Duration, log zerolog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	defer func() {
		if err := sv.requests.Wait(ctx); err != nil {
			log.Warn().Msg("shutdown timeout passed with upgraded connections (WebSockets) still open; they close as the process exits")
		}
	}()
	var wg sync.WaitGroup
	for _, srv := range sv.all {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := srv.Shutdown(ctx); err != nil {
				log.Warn().Err(err).Msg("shutdown deadline passed; closing remaining connections")
				srv.Close()
			}
		}()
	}
	if sv.h3 != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sv.h3.Shutdown(ctx, log)
		}()
	}
	wg.Wait()
}

func serveOn(srv *http.Server, l net.Listener, useTLS bool) error {
	var err error
	if useTLS {
		err = srv.ServeTLS(l, "", "")
	} else {
		err = srv.Serve(l)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
