package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/scafo/scafo-edge/certs/certstest"
)

func TestMain(m *testing.M) {
	before := goleak.IgnoreCurrent()
	code := certstest.RunWithPebble(m)
	if code == 0 {
		// certmagic keeps one rate limiter per CA and account for the
		// process's life (a package-level map it never stops).
		if err := goleak.Find(before, goleak.IgnoreAnyFunction("github.com/caddyserver/certmagic.(*RingBufferRateLimiter).loop")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// nameSet is the test's stand-in for the routing document's exact names.
type nameSet struct {
	mu    sync.Mutex
	names map[string]bool
}

func newNameSet(names ...string) *nameSet {
	s := &nameSet{names: map[string]bool{}}
	for _, n := range names {
		s.names[n] = true
	}
	return s
}

func (s *nameSet) Allowed(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.names[name]
}

func (s *nameSet) set(name string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.names[name] = on
}

// testEdge is the two listeners of an edge on loopback, serving through
// whichever Manager is current (so a restart keeps the ports Pebble knows).
type testEdge struct {
	httpLn, httpsLn     net.Listener
	httpPort, httpsPort int
	cur                 atomic.Pointer[Manager]
}

// inner is the edge's routing handler as far as these tests care.
var inner = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	fmt.Fprintf(w, "inner %s %s", r.Host, r.URL.RequestURI())
})

func newTestEdge(t testing.TB) *testEdge {
	t.Helper()
	e := &testEdge{}
	var err error
	if e.httpLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	if e.httpsLn, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	e.httpPort = certstest.PortOf(t, e.httpLn.Addr().String())
	e.httpsPort = certstest.PortOf(t, e.httpsLn.Addr().String())
	quiet := log.New(io.Discard, "", 0)
	httpSrv := &http.Server{ErrorLog: quiet, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.cur.Load().HTTPHandler(inner).ServeHTTP(w, r)
	})}
	httpsSrv := &http.Server{ErrorLog: quiet, Handler: inner, TLSConfig: &tls.Config{
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return e.cur.Load().TLSConfig(), nil
		},
	}}
	done := make(chan struct{}, 2)
	go func() { httpSrv.Serve(e.httpLn); done <- struct{}{} }()
	go func() { httpsSrv.ServeTLS(e.httpsLn, "", ""); done <- struct{}{} }()
	t.Cleanup(func() {
		httpSrv.Close()
		httpsSrv.Close()
		<-done
		<-done
	})
	return e
}

// start makes a Manager on the database at dir with opts and makes it current.
func (e *testEdge) start(t testing.TB, dir string, opts Options) *Manager {
	t.Helper()
	db := openTestDB(t, dir)
	opts.DB = db
	opts.HTTPPort, opts.HTTPSPort = e.httpPort, e.httpsPort
	m, err := New(context.Background(), opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(m.Close)
	e.cur.Store(m)
	return m
}

// restart stops the current Manager, closes its database and starts a new
// Manager on the same file.
func (e *testEdge) restart(t testing.TB, dir string, opts Options) *Manager {
	t.Helper()
	old := e.cur.Load()
	old.Close()
	if err := old.cfg.Storage.(*BoltStorage).db.Close(); err != nil {
		t.Fatalf("close db: %v", err)
	}
	return e.start(t, dir, opts)
}

// handshake connects to the HTTPS listener with SNI name and returns the
// leaf it was served, verified against roots.
func (e *testEdge) handshake(name string, roots *x509.CertPool) (*x509.Certificate, error) {
	d := &net.Dialer{Timeout: 30 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", e.httpsLn.Addr().String(), &tls.Config{
		ServerName:             name,
		RootCAs:                roots,
		SessionTicketsDisabled: true,
	})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

// get sends GET https://name/path through the HTTPS listener and returns
// the status, body and the time to the response's first byte.
func (e *testEdge) get(name, path string, roots *x509.CertPool) (int, string, time.Duration, error) {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", e.httpsLn.Addr().String())
		},
		TLSClientConfig:   &tls.Config{RootCAs: roots, ServerName: name},
		DisableKeepAlives: true,
		ForceAttemptHTTP2: true,
	}
	defer tr.CloseIdleConnections()
	var firstByte time.Time
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotFirstResponseByte: func() { firstByte = time.Now() }})
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+name+":"+strconv.Itoa(e.httpsPort)+path, nil)
	start := time.Now()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return 0, "", 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), firstByte.Sub(start), nil
}

// getHTTP sends GET http://host/path to the HTTP listener without
// following redirects.
func (e *testEdge) getHTTP(host, path string) (*http.Response, string, error) {
	req, _ := http.NewRequest(http.MethodGet, "http://"+e.httpLn.Addr().String()+path, nil)
	req.Host = host
	c := &http.Client{
		Timeout:       10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Transport:     &http.Transport{DisableKeepAlives: true},
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b), nil
}
