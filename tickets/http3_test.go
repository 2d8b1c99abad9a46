package tickets

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/scafo/scafo-edge/internal/testsupport"
)

// h3Server serves HTTP/3 with k's keys, as the edge's HTTP/3 listener is
// configured: quic-go clones the config and wraps its session hooks.
func h3Server(t *testing.T, k *Keys) string {
	t.Helper()
	cert, _ := testsupport.SelfSigned(t)
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}}
	k.Configure(cfg)
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http3.Server{TLSConfig: http3.ConfigureTLSConfig(cfg), Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok")
	})}
	served := make(chan struct{})
	go func() {
		defer close(served)
		srv.Serve(pc)
	}()
	t.Cleanup(func() {
		srv.Close()
		pc.Close()
		<-served
	})
	return pc.LocalAddr().String()
}

// h3Visit requests over a new QUIC connection and reports whether it
// resumed a session from cache. It dials with quic.DialAddr, which returns
// once the handshake is complete: http3.Transport's default, DialEarly,
// hands a resumed connection to the client before the server's transport
// parameters are in, and quic-go's client then races with itself
// (quic-go/quic-go#4303: the race detector failed this test one run in
// several). Resumption, not 0-RTT, is what is tested.
func h3Visit(t *testing.T, cache tls.ClientSessionCache, addr string) bool {
	t.Helper()
	tr := &http3.Transport{
		TLSClientConfig: &tls.Config{ServerName: "localhost", InsecureSkipVerify: true, ClientSessionCache: cache},
		Dial: func(ctx context.Context, addr string, tlsCfg *tls.Config, cfg *quic.Config) (*quic.Conn, error) {
			return quic.DialAddr(ctx, addr, tlsCfg, cfg)
		},
	}
	defer tr.Close()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("https://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.TLS != nil && resp.TLS.DidResume
}

func TestHTTP3SessionResumesOnTheSuccessor(t *testing.T) {
	old := mustNew(t, Options{})
	cache := tls.NewLRUClientSessionCache(8)
	addr := h3Server(t, old)
	if h3Visit(t, cache, addr) {
		t.Fatal("the first visit resumed")
	}
	// The ticket arrives after the handshake: the second visit to the same
	// edge shows it was received and is usable.
	testsupport.WaitFor(t, 5*time.Second, "a resumed visit to the same edge", func() bool { return h3Visit(t, cache, addr) })
	next := mustNew(t, Options{Inherited: old.Export()})
	old.Close()
	defer next.Close()
	if !h3Visit(t, cache, h3Server(t, next)) {
		t.Fatal("an HTTP/3 session did not resume on the successor")
	}
}
