package handover

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/scafo/scafo-edge/internal/testsupport"
	"github.com/scafo/scafo-edge/node"
)

// TestHTTP3ClientsCarryOver replaces an HTTP/3 server by another on the
// same UDP socket while clients keep sending requests: the old one drains
// with GOAWAY and stops reading before the new one reads, and no request
// fails (a new connection's Initial dropped in between is retransmitted).
func TestHTTP3ClientsCarryOver(t *testing.T) {
	cert, roots := testsupport.SelfSigned(t)
	tlsConf := &tls.Config{Certificates: []tls.Certificate{cert}}
	dir := t.TempDir()
	old, tk, h := handOver(t, dir)

	key, err := StatelessResetKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	oldSrv := startH3(t, old.socks.HTTP3, tlsConf, key, "old")

	port := old.socks.HTTP3.LocalAddr().(*net.UDPAddr).Port
	url := fmt.Sprintf("https://localhost:%d/", port)
	var (
		mu      sync.Mutex
		by      = map[string]int{}
		failed  atomic.Int64
		retried atomic.Int64
		slowest time.Duration
	)
	stop := make(chan struct{})
	var clients sync.WaitGroup
	for range 3 {
		tr := &http3.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}}
		t.Cleanup(func() { tr.Close() })
		clients.Add(1)
		go func() {
			defer clients.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				b, err := h3get(tr, url, &retried)
				if err != nil {
					failed.Add(1)
					t.Errorf("HTTP/3 request: %v", err)
					continue
				}
				mu.Lock()
				by[string(b)]++
				slowest = max(slowest, time.Since(start))
				mu.Unlock()
			}
		}()
	}
	count := func(name string) int {
		mu.Lock()
		defer mu.Unlock()
		return by[name]
	}
	testsupport.WaitFor(t, 10*time.Second, "HTTP/3 answers from the old server", func() bool { return count("old") >= 20 })

	ran := make(chan error, 1)
	go func() {
		ran <- h.Run(Steps{
			StopAccepting: func() {},
			Settle:        func(context.Context) error { return nil },
			StopWork:      func() *node.Update { return nil },
			CloseState:    func() error { return nil },
			StopHTTP3: func(ctx context.Context) {
				oldSrv.stop(ctx)
				old.socks.HTTP3.Close()
			},
		})
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tk.HTTP3Released(ctx); err != nil {
		t.Fatalf("HTTP3Released: %v", err)
	}
	newSrv := startH3(t, tk.Sockets.HTTP3, tlsConf, key, "new")
	testsupport.WaitFor(t, 10*time.Second, "HTTP/3 answers from the new server", func() bool { return count("new") >= 20 })
	close(stop)
	clients.Wait()
	if err := <-ran; err != nil {
		t.Errorf("Run: %v", err)
	}
	newSrv.stop(ctx)
	t.Logf("figures: HTTP/3 requests answered by old %d, by new %d, failed %d, retried %d, slowest %v", count("old"), count("new"), failed.Load(), retried.Load(), slowest)
}

// h3get GETs url, once more if the first try fails at the connection level,
// as browsers do: a QUIC handshake the old server refused as it closed, or
// a connection the client closed itself on the old server's GOAWAY, sent
// the request nowhere (or for a GET, harmlessly), and browsers retry such
// a request on a new connection or over TCP.
func h3get(tr *http3.Transport, url string, retried *atomic.Int64) ([]byte, error) {
	var err error
	for try := range 2 {
		if try > 0 {
			retried.Add(1)
		}
		var b []byte
		if b, err = h3once(tr, url); err == nil {
			return b, nil
		}
	}
	return nil, err
}

func h3once(tr *http3.Transport, url string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// h3server is HTTP/3 on a QUIC transport of its own over conn, as the edge
// runs it: stateless resets made with the state directory's key.
type h3server struct {
	tr     *quic.Transport
	ln     *quic.EarlyListener
	srv    *http3.Server
	served chan struct{}
}

func startH3(t *testing.T, conn net.PacketConn, tlsConf *tls.Config, key [32]byte, name string) *h3server {
	t.Helper()
	rk := quic.StatelessResetKey(key)
	s := &h3server{tr: &quic.Transport{Conn: conn, StatelessResetKey: &rk}, srv: &http3.Server{Handler: named(name)}, served: make(chan struct{})}
	var err error
	if s.ln, err = s.tr.ListenEarly(http3.ConfigureTLSConfig(tlsConf), &quic.Config{Allow0RTT: true}); err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(s.served)
		s.srv.ServeListener(s.ln)
	}()
	t.Cleanup(func() { s.stop(context.Background()) })
	return s
}

// stop refuses new connections (their Initial packets go unanswered until
// the successor reads), sends GOAWAY, waits for requests until ctx ends,
// then closes everything.
func (s *h3server) stop(ctx context.Context) {
	s.ln.Close()
	s.srv.Shutdown(ctx)
	s.srv.Close()
	s.tr.Close()
	<-s.served
}

func named(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, name) })
}
