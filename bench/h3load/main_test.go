package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

// selfSigned returns a certificate for 127.0.0.1 and a pool that trusts it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "h3load test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:              []string{"h3load.test"},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(leaf)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, roots
}

// startServer serves a 1 KiB body over HTTP/3 on 127.0.0.1 and returns its
// address; /missing answers 404.
func startServer(t *testing.T) (string, *x509.CertPool) {
	addr, roots, _ := startCountingServer(t)
	return addr, roots
}

// startCountingServer is startServer, and also counts the QUIC connections
// it accepts.
func startCountingServer(t *testing.T) (string, *x509.CertPool, *atomic.Int64) {
	t.Helper()
	cert, roots := selfSigned(t)
	body := bytes.Repeat([]byte("x"), 1024)
	mux := http.NewServeMux()
	mux.HandleFunc("/missing", http.NotFound)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { w.Write(body) })
	conns := new(atomic.Int64)
	srv := &http3.Server{
		TLSConfig: http3.ConfigureTLSConfig(&tls.Config{Certificates: []tls.Certificate{cert}}),
		Handler:   mux,
		ConnContext: func(ctx context.Context, _ *quic.Conn) context.Context {
			conns.Add(1)
			return ctx
		},
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(pc) }()
	t.Cleanup(func() {
		srv.Close()
		pc.Close()
		<-done
	})
	return pc.LocalAddr().String(), roots, conns
}

func TestLoad(t *testing.T) {
	addr, roots := startServer(t)
	cfg := config{
		URL: "https://" + addr + "/", Conns: 2, PerConn: 4,
		// The window ends at the 20th request, however slow a loaded
		// machine makes them; the minute is only a bound.
		Duration: time.Minute, Requests: 20, Warmup: 50 * time.Millisecond,
		Timeout: 5 * time.Second, roots: roots,
	}
	res, err := run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res.human(cfg))
	if res.Requests == 0 || res.Errors != 0 || res.Non2xx != 0 {
		t.Fatalf("requests %d errors %d non2xx %d (%s), want >0, 0, 0", res.Requests, res.Errors, res.Non2xx, res.firstError)
	}
	if res.Requests < cfg.Requests || res.Seconds >= cfg.Duration.Seconds() {
		t.Errorf("requests %d in %.2fs, want the window to end at the %dth", res.Requests, res.Seconds, cfg.Requests)
	}
	if res.Bytes != res.Requests*1024 {
		t.Errorf("bytes %d, want %d", res.Bytes, res.Requests*1024)
	}
	if !(0 < res.P50 && res.P50 <= res.P90 && res.P90 <= res.P99 && res.P99 <= res.Max) {
		t.Errorf("percentiles out of order: %+v", res)
	}

	t.Run("non-2xx are counted apart from errors", func(t *testing.T) {
		cfg := cfg
		cfg.URL = "https://" + addr + "/missing"
		cfg.Requests, cfg.Warmup = 8, 0
		res, err := run(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if res.Requests == 0 || res.Non2xx != res.Requests || res.Errors != 0 {
			t.Errorf("requests %d non2xx %d errors %d, want all non-2xx and no errors", res.Requests, res.Non2xx, res.Errors)
		}
	})
	t.Run("-sni sets the server name and the authority", func(t *testing.T) {
		cfg := cfg
		cfg.SNI = "h3load.test"
		cfg.Requests, cfg.Warmup = 8, 0
		res, err := run(context.Background(), cfg)
		if err != nil || res.Requests == 0 || res.Errors != 0 {
			t.Errorf("%+v, %v", res, err)
		}
	})
}

// TestClose holds -close to one QUIC connection per request: the server
// accepts one for every request sent (the measured ones, the warm-up's and
// each worker's first), full handshakes unless -resume, and the key
// exchange -curves asks for.
func TestClose(t *testing.T) {
	for _, c := range []struct {
		name        string
		resume      bool
		curves      string
		wantKX      string
		wantResumed bool
	}{
		{name: "full handshakes", wantKX: "X25519MLKEM768"},
		{name: "X25519 only", curves: "X25519", wantKX: "X25519"},
		{name: "resumed", resume: true, curves: "x25519", wantKX: "X25519", wantResumed: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			addr, roots, accepted := startCountingServer(t)
			cfg := config{
				URL: "https://" + addr + "/", Conns: 3, PerConn: 1, Close: true,
				Resume: c.resume, Curves: c.curves,
				Duration: time.Minute, Requests: 15, Warmup: 50 * time.Millisecond,
				Timeout: 5 * time.Second, roots: roots,
			}
			res, err := run(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Log(res.human(cfg))
			if res.Requests < cfg.Requests || res.Errors != 0 || res.Non2xx != 0 {
				t.Fatalf("requests %d errors %d non2xx %d (%s), want >= %d, 0, 0", res.Requests, res.Errors, res.Non2xx, res.firstError, cfg.Requests)
			}
			if res.Bytes != res.Requests*1024 {
				t.Errorf("bytes %d, want %d", res.Bytes, res.Requests*1024)
			}
			nc := res.NewConns
			if nc == nil {
				t.Fatal("no new_connections in the result")
			}
			if nc.Handshakes != res.Requests {
				t.Errorf("%d handshakes for %d requests, want one each", nc.Handshakes, res.Requests)
			}
			// Every request the workers sent, counted or not (warm-up, the
			// first of each, those cut by the window's end), had its own
			// connection; a connection that carried two would leave fewer.
			if got := uint64(accepted.Load()); got < res.Requests+uint64(cfg.Conns) {
				t.Errorf("server accepted %d connections for %d measured requests and %d first ones, want one per request", got, res.Requests, cfg.Conns)
			}
			if nc.KeyExchange != c.wantKX {
				t.Errorf("key exchange %q, want %q", nc.KeyExchange, c.wantKX)
			}
			if c.wantResumed && nc.Resumed == 0 {
				t.Errorf("-resume: no handshake of %d resumed", nc.Handshakes)
			}
			if !c.wantResumed && nc.Resumed != 0 {
				t.Errorf("%d of %d handshakes resumed without -resume", nc.Resumed, nc.Handshakes)
			}
		})
	}
}

func TestBadFlags(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*config)
		want string
	}{
		{"-close with -m 2", func(c *config) { c.Close, c.PerConn = true, 2 }, "-m must be 1"},
		{"-resume without -close", func(c *config) { c.Resume = true }, "-resume needs -close"},
		{"unknown curve", func(c *config) { c.Curves = "X25519,X448" }, "unknown key exchange"},
		{"empty curve", func(c *config) { c.Curves = "X25519," }, "unknown key exchange"},
		{"no connections", func(c *config) { c.Conns = 0 }, "-c and -m"},
		{"http URL", func(c *config) { c.URL = "http://127.0.0.1:1/" }, "want https"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := config{URL: "https://127.0.0.1:1/", Conns: 1, PerConn: 1, Duration: time.Second, Timeout: time.Second, Insecure: true}
			c.edit(&cfg)
			_, err := run(context.Background(), cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("run: %v, want an error saying %q", err, c.want)
			}
		})
	}
}

func TestSetupFailure(t *testing.T) {
	// A UDP socket that never answers: the handshake cannot complete.
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	cfg := config{
		URL: "https://" + pc.LocalAddr().String() + "/", Conns: 2, PerConn: 1,
		Duration: time.Second, Timeout: 200 * time.Millisecond, Insecure: true,
	}
	if _, err := run(context.Background(), cfg); err == nil {
		t.Fatal("run against a silent port succeeded")
	}
}

func TestHistogram(t *testing.T) {
	var h histogram
	for i := 1; i <= 1000; i++ {
		h.record(time.Duration(i) * time.Millisecond)
	}
	for _, c := range []struct{ q, want float64 }{{0.5, 500}, {0.9, 900}, {0.99, 990}} {
		if got := h.quantile(c.q); got < c.want*0.98 || got > c.want*1.02 {
			t.Errorf("p%v = %.2fms, want %.0fms within 2%%", c.q*100, got, c.want)
		}
	}
	if got := h.quantile(1); got != 1000 {
		t.Errorf("p100 = %v, want the exact max 1000", got)
	}
	for _, us := range []uint64{0, 1, 63, 64, 65, 127, 128, 1 << 20, 1<<40 + 12345} {
		i := bucketOf(us)
		if i < 0 || i >= histBuckets {
			t.Fatalf("bucketOf(%d) = %d out of range", us, i)
		}
		if us < 1<<38 {
			if mid := bucketMid(i); mid < float64(us)*0.98 || mid > float64(us)*1.02+1 {
				t.Errorf("bucketMid(bucketOf(%d)) = %v", us, mid)
			}
		}
	}
	var empty histogram
	if empty.quantile(0.5) != 0 {
		t.Error("empty histogram quantile not 0")
	}
}
