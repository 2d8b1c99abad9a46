package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// demoApps are the two upstreams testdata/demo/routes.json names. Each
// answers with its own name and the request as it arrived, so a newcomer sees
// host routing, the path flip and failover from curl alone.
var demoApps = []struct{ name, addr string }{
	{"demo app A (legacy)", "127.0.0.1:9101"},
	{"demo app B (new)", "127.0.0.1:9102"},
}

// demoCommand runs the edge on the demo document without a node or TLS, with
// the two demo upstream apps in-process. Extra flags are passed to serve.
func demoCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for _, app := range demoApps {
		l, err := net.Listen("tcp", app.addr)
		if err != nil {
			return fmt.Errorf("demo app on %s: %w", app.addr, err)
		}
		srv := &http.Server{Handler: demoApp(app.name), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				fmt.Fprintf(stderr, "demo app %s: %v\n", app.addr, err)
			}
		}()
		defer srv.Close()
	}
	defaults := []string{
		"--routes-file", "testdata/demo/routes.json",
		"--tls", "off",
		"--http-addr", "127.0.0.1:8080",
		"--admin-addr", "127.0.0.1:9180",
		"--state-dir", "./.state",
		"--log-format", "console",
		"--poll-interval", "1s",
	}
	return serveCommand(ctx, append(defaults, args...), stdout, stderr)
}

func demoApp(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "%s: %s %s (Host: %s, X-Forwarded-For: %s)\n",
			name, r.Method, r.RequestURI, r.Host, r.Header.Get("X-Forwarded-For"))
	})
}
