// Command cutover measures what a visitor sees while ports move from an old
// proxy to scafo-edge: a probe opens a new connection to the port every
// millisecond and sends one request, while the old proxy is stopped
// (SIGTERM, waited for) and the edge is started on the same port. It prints
// how long connections were refused and how long each step took.
//
// The old proxy is a stand-in: this program itself, serving plain HTTP on
// net/http and shutting down gracefully on SIGTERM, as Caddy and Traefik
// do. The window is the old proxy's exit plus the edge's start-up.
//
//	go build -o /tmp/scafo-edge ./cmd/scafo-edge
//	go run ./bench/cutover -edge /tmp/scafo-edge -runs 5 [-tls acme]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"
)

func main() {
	old := flag.String("serve-old", "", "internal: serve as the old proxy on this address until SIGTERM")
	edge := flag.String("edge", "", "scafo-edge binary")
	runs := flag.Int("runs", 5, "cut-overs to measure")
	tlsMode := flag.String("tls", "off", "the edge's --tls: off, or acme (HTTP then redirects; any answer not the old proxy's counts)")
	flag.Parse()
	if *old != "" {
		serveOld(*old)
		return
	}
	if *edge == "" {
		fmt.Fprintln(os.Stderr, "cutover: -edge is required")
		os.Exit(2)
	}
	var windows []time.Duration
	for i := range *runs {
		r, err := cutover(*edge, *tlsMode)
		if err != nil {
			fmt.Fprintln(os.Stderr, "cutover:", err)
			os.Exit(1)
		}
		fmt.Printf("run %d: refused %d probes over %v (first refused to first answer by the edge); old proxy exit %v, edge start to first answer %v; other errors %d\n",
			i+1, r.refused, r.window.Round(time.Millisecond), r.oldExit.Round(time.Millisecond), r.edgeStart.Round(time.Millisecond), r.otherErrors)
		windows = append(windows, r.window)
	}
	sort.Slice(windows, func(i, j int) bool { return windows[i] < windows[j] })
	fmt.Printf("refused window over %d runs: min %v, median %v, max %v\n", len(windows),
		windows[0].Round(time.Millisecond), windows[len(windows)/2].Round(time.Millisecond), windows[len(windows)-1].Round(time.Millisecond))
}

func serveOld(addr string) {
	srv := &http.Server{Addr: addr, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "old\n") })}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, "old proxy:", err)
		os.Exit(1)
	}
}

type result struct {
	refused, otherErrors       int
	window, oldExit, edgeStart time.Duration
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func cutover(edgeBin, tlsMode string) (result, error) {
	var r result
	addr, err := freeAddr()
	if err != nil {
		return r, err
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "edge\n") }))
	defer upstream.Close()
	dir, err := os.MkdirTemp("", "cutover-")
	if err != nil {
		return r, err
	}
	defer os.RemoveAll(dir)
	routes := filepath.Join(dir, "routes.json")
	doc := fmt.Sprintf(`{"v":1,"routes":[{"host":"app.example","application":"app","upstreams":[{"node":"n","address":%q}]}]}`, upstream.Listener.Addr().String())
	if err := os.WriteFile(routes, []byte(doc), 0o600); err != nil {
		return r, err
	}

	self, _ := os.Executable()
	oldCmd := exec.Command(self, "-serve-old", addr)
	oldCmd.Stderr = os.Stderr
	if err := oldCmd.Start(); err != nil {
		return r, err
	}
	defer oldCmd.Process.Kill()
	if !waitAnswer(addr, 10*time.Second) {
		return r, errors.New("old proxy never answered")
	}

	type probe struct {
		at      time.Time
		refused bool
		err     error
		body    string
	}
	var mu sync.Mutex
	var probes []probe
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{DisableKeepAlives: true},
			// The edge's redirect to HTTPS is its answer.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
		for {
			select {
			case <-stop:
				return
			default:
			}
			at := time.Now()
			req, _ := http.NewRequest("GET", "http://"+addr+"/", nil)
			req.Host = "app.example"
			resp, err := client.Do(req)
			p := probe{at: at, err: err}
			if err != nil {
				p.refused = errors.Is(err, syscall.ECONNREFUSED)
			} else {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				p.body = string(b)
			}
			mu.Lock()
			probes = append(probes, p)
			mu.Unlock()
			time.Sleep(time.Millisecond)
		}
	}()

	time.Sleep(200 * time.Millisecond) // probes against the old proxy first
	t0 := time.Now()
	oldCmd.Process.Signal(syscall.SIGTERM)
	oldCmd.Wait()
	r.oldExit = time.Since(t0)
	t1 := time.Now()
	edgeCmd := exec.Command(edgeBin, "serve", "--routes-file", filepath.Join(dir, "routes.json"), "--tls", tlsMode,
		"--http-addr", addr, "--https-addr", "127.0.0.1:0", "--cert-prefetch=false", "--admin-addr", "127.0.0.1:0", "--state-dir", filepath.Join(dir, "state"), "--log-level", "warn")
	edgeCmd.Stdout, edgeCmd.Stderr = io.Discard, os.Stderr
	if err := edgeCmd.Start(); err != nil {
		return r, err
	}
	defer func() {
		edgeCmd.Process.Signal(syscall.SIGTERM)
		edgeCmd.Wait()
	}()
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		n := len(probes)
		last := probe{}
		if n > 0 {
			last = probes[n-1]
		}
		mu.Unlock()
		if edgeAnswer(last.err, last.body) {
			break
		}
		if time.Now().After(deadline) {
			close(stop)
			wg.Wait()
			return r, errors.New("the edge never answered through the port")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	close(stop)
	wg.Wait()

	var firstRefused, firstEdge time.Time
	for _, p := range probes {
		switch {
		case p.refused:
			r.refused++
			if firstRefused.IsZero() {
				firstRefused = p.at
			}
		case p.err != nil:
			r.otherErrors++
		case edgeAnswer(p.err, p.body) && firstEdge.IsZero():
			firstEdge = p.at
			r.edgeStart = p.at.Sub(t1)
		}
	}
	if !firstRefused.IsZero() {
		r.window = firstEdge.Sub(firstRefused)
	}
	return r, nil
}

// edgeAnswer reports whether a probe was answered by the edge: an answer
// that is not the old proxy's.
func edgeAnswer(err error, body string) bool { return err == nil && body != "old\n" }

// waitAnswer reports whether addr answers HTTP within d.
func waitAnswer(addr string, d time.Duration) bool {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + addr + "/"); err == nil {
			resp.Body.Close()
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}
