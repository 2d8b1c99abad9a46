// Command imagecheck is the loopback upstream, the load generator and the
// binary check that deploy/image-check.sh runs around the images it built:
// the upstream answers every request with a line naming it, the load counts
// requests through the edge as answered, refused (nothing accepted the
// connection) or failed (any other error, or an answer that is not the
// upstream's) while the edge's container is replaced, and binary checks
// the binary in an image's file system (docker export) for its ELF machine,
// static linking and file capability, which is all that can be checked of
// an image for another architecture without running it.
//
//	imagecheck upstream -addr 127.0.0.1:0 -addr-file upstream.addr
//	imagecheck load -http http://127.0.0.1/ -https https://127.0.0.1/ -host check.localhost -http-host plain.http.localhost -max 3m
//	docker export CONTAINER | imagecheck binary -path scafo-edge -arch arm64
//
// load stops on SIGINT or SIGTERM, or at -max, and prints one line:
//
//	requests=N http=N https=N refused=N failed=N longest_ms=N
//
// It uses only the standard library so that the script can build it with
// the host's Go without touching the module's requirements.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// marker starts every upstream answer: the load tells the upstream's answer
// from one the edge made itself (a 502 or 503 page also has status text).
const marker = "image-check upstream: "

func main() {
	log.SetFlags(0)
	log.SetPrefix("imagecheck: ")
	if len(os.Args) < 2 {
		log.Fatal("usage: imagecheck upstream|load|binary [flags]")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "upstream":
		err = upstream(ctx, os.Args[2:])
	case "load":
		err = load(ctx, os.Args[2:])
	case "binary":
		err = binaryCheck(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want upstream, load or binary", os.Args[1])
	}
	if err != nil {
		log.Fatal(err)
	}
}

func upstream(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("upstream", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:0", "listen address (loopback)")
	addrFile := fs.String("addr-file", "", "write the address listened on to this file, once listening")
	fs.Parse(args)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	if *addrFile != "" {
		// Written whole under another name and renamed, so a reader never
		// sees half an address.
		tmp := *addrFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(ln.Addr().String()+"\n"), 0o644); err != nil {
			return err
		}
		if err := os.Rename(tmp, *addrFile); err != nil {
			return err
		}
	}
	// GET /slow/DURATION answers after DURATION, so a stop has a request
	// in flight to drain; GET /inflight (asked directly, not through the
	// edge) says how many such requests are waiting.
	var inflight atomic.Int64
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/inflight" {
				fmt.Fprintln(w, inflight.Load())
				return
			}
			if s, ok := strings.CutPrefix(r.URL.Path, "/slow/"); ok {
				d, err := time.ParseDuration(s)
				if err != nil {
					http.Error(w, err.Error(), http.StatusBadRequest)
					return
				}
				inflight.Add(1)
				select {
				case <-time.After(d):
				case <-r.Context().Done():
				}
				inflight.Add(-1)
			}
			fmt.Fprintf(w, "%s%s %s (Host: %s)\n", marker, r.Method, r.URL.RequestURI(), r.Host)
		}),
		ReadHeaderTimeout: 10 * time.Second,
	}
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// counts is what the load saw; every field is updated atomically by the
// workers and read once they have stopped.
type counts struct {
	http, https, refused, failed atomic.Int64
	longest                      atomic.Int64 // nanoseconds
	shown                        atomic.Int64 // failures printed so far
}

func load(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("load", flag.ExitOnError)
	httpURL := fs.String("http", "http://127.0.0.1/", "the edge's HTTP URL")
	httpsURL := fs.String("https", "", "the edge's HTTPS URL (empty: HTTP only)")
	host := fs.String("host", "check.localhost", "Host header and TLS server name of HTTPS requests")
	httpHost := fs.String("http-host", "", "Host header of HTTP requests (empty: -host)")
	workers := fs.Int("workers", 2, "workers per kind of connection (HTTP and HTTPS, new and kept-alive)")
	max := fs.Duration("max", 3*time.Minute, "stop by itself after this long")
	fs.Parse(args)
	if *httpHost == "" {
		*httpHost = *host
	}
	ctx, cancel := context.WithTimeout(ctx, *max)
	defer cancel()

	var c counts
	var wg sync.WaitGroup
	for u, h := range map[string]string{*httpURL: *httpHost, *httpsURL: *host} {
		if u == "" {
			continue
		}
		for _, keepAlive := range []bool{true, false} {
			for range *workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					worker(ctx, &c, u, h, keepAlive)
				}()
			}
		}
	}
	wg.Wait()
	fmt.Printf("requests=%d http=%d https=%d refused=%d failed=%d longest_ms=%d\n",
		c.http.Load()+c.https.Load()+c.refused.Load()+c.failed.Load(), c.http.Load(), c.https.Load(),
		c.refused.Load(), c.failed.Load(), time.Duration(c.longest.Load()).Milliseconds())
	return nil
}

// worker sends GETs one after another until ctx ends, on one kept-alive
// connection or on a new connection each.
func worker(ctx context.Context, c *counts, url, host string, keepAlive bool) {
	tr := &http.Transport{
		DisableKeepAlives: !keepAlive,
		// The edge's internal CA is made in its state volume; the check
		// measures whether connections are served, not whom to trust.
		TLSClientConfig: &tls.Config{ServerName: host, InsecureSkipVerify: true},
		Proxy:           nil,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 15 * time.Second}
	https := strings.HasPrefix(url, "https:")
	for ctx.Err() == nil {
		start := time.Now()
		err := get(ctx, client, url, host)
		if ctx.Err() != nil {
			return // cut by the stop, not by the edge
		}
		for d := int64(time.Since(start)); ; {
			l := c.longest.Load()
			if d <= l || c.longest.CompareAndSwap(l, d) {
				break
			}
		}
		switch {
		case err == nil && https:
			c.https.Add(1)
		case err == nil:
			c.http.Add(1)
		case errors.Is(err, syscall.ECONNREFUSED):
			c.refused.Add(1)
			c.show(err)
		default:
			c.failed.Add(1)
			c.show(err)
		}
	}
}

func get(ctx context.Context, client *http.Client, url, host string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Host = host
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("read body: %w", err)
	}
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(body), marker) {
		return fmt.Errorf("status %d: %.80q", resp.StatusCode, body)
	}
	return nil
}

// show prints the first few failures, which say more than the count.
func (c *counts) show(err error) {
	if c.shown.Add(1) <= 5 {
		log.Printf("%v", err)
	}
}
