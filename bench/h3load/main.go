// Command h3load is the HTTP/3 load generator of the benchmark (bench/run.sh):
// one client for every HTTP/3 row, so the rows differ by proxy only. It
// opens N separate QUIC connections to one URL, keeps M GET requests in
// flight on each of them for a fixed duration, and reports the
// requests completed, the request rate, the response body bytes, the errors
// (transport errors and non-2xx responses counted separately) and the
// latency percentiles p50/p90/p99/max.
//
// With -close it measures new connections instead, as wrk does with
// "Connection: close" over TLS: each of N workers dials a new QUIC
// connection (a UDP socket of its own, a full handshake), sends one GET,
// reads the response, closes the connection, and starts again. Never 0-RTT:
// the dial is quic-go's DialAddr, which sends nothing before the handshake
// completes. Without -resume every handshake is a full one (certificate and
// signature); with it, each worker keeps the session ticket of its previous
// connection and offers it on the next, as wrk (OpenSSL) does, so the
// handshake is a resumed one (PSK with a fresh key exchange, no signature).
// The JSON then also says how many of the window's connections resumed and
// which key exchange they used.
//
// scafo-edge and Caddy both serve HTTP/3 with quic-go, and the general
// purpose load tools either lack HTTP/3 or bring their own QUIC stack, whose
// flow control, congestion control and packet handling would then be part
// of what is measured. One client, built on the same quic-go http3 package
// as both servers, applied unchanged to both proxies, makes the difference
// between two rows a difference between the proxies and not between
// clients.
//
// Each connection is a separate http3.Transport, and every Transport dials
// its own UDP socket, so N really is the number of QUIC connections; the M
// workers of a connection share its Transport and so multiplex their
// requests as streams of that one connection. Latencies go into a bounded
// log-linear histogram (about 1.6% relative precision, exact maximum), so
// memory does not grow with the length of the run.
//
// Usage:
//
//	go run ./bench/h3load -url https://host:port/path -c N -m M -d 10s \
//	    [-warmup 3s] [-insecure] [-cacert file] [-sni name] [-json]
//	go run ./bench/h3load -url https://host:port/path -c N -close [-resume] \
//	    [-curves X25519] -d 10s ...
//
// "requests" counts responses read to their end within the measured window,
// whatever their status; "non2xx" is the part of them whose status was not
// 2xx; "errors" counts requests that got no complete response (dial, TLS,
// stream or timeout errors) and is not part of "requests". "bytes" counts
// response body bytes. Requests still in flight when the window closes are
// cancelled and not counted. The program exits with status 1 when no
// connection can be set up at all.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"
)

func main() {
	var cfg config
	flag.StringVar(&cfg.URL, "url", "", "target `URL` (https://host:port/path)")
	flag.IntVar(&cfg.Conns, "c", 1, "number of QUIC connections")
	flag.IntVar(&cfg.PerConn, "m", 1, "concurrent requests per connection")
	flag.DurationVar(&cfg.Duration, "d", 10*time.Second, "measured duration")
	flag.Uint64Var(&cfg.Requests, "n", 0, "end the measured window once this many requests have completed in it (0: -d alone ends it)")
	flag.DurationVar(&cfg.Warmup, "warmup", 0, "load applied before the measured duration, not reported")
	flag.DurationVar(&cfg.Timeout, "timeout", 10*time.Second, "per-request timeout")
	flag.BoolVar(&cfg.Insecure, "insecure", false, "do not verify the server certificate")
	flag.StringVar(&cfg.CACert, "cacert", "", "PEM `file` of root certificates to trust instead of the system roots")
	flag.StringVar(&cfg.SNI, "sni", "", "TLS server `name` and request authority, when they differ from the URL host (the URL host is still dialled)")
	flag.BoolVar(&cfg.Close, "close", false, "one request per QUIC connection: each of the -c workers dials a new connection, sends one GET and closes it, in a loop (-m must be 1)")
	flag.BoolVar(&cfg.Resume, "resume", false, "with -close: offer each worker's previous session ticket on its next connection (a resumed handshake, never 0-RTT)")
	flag.StringVar(&cfg.Curves, "curves", "", "comma `list` of key exchanges to offer, in order (X25519, X25519MLKEM768, P256, P384, P521); empty: Go's default")
	jsonOut := flag.Bool("json", false, "also print the result as one JSON object on the last line")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "h3load: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}

	ctx, stop := signalContext()
	defer stop()
	res, err := run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "h3load:", err)
		os.Exit(1)
	}
	fmt.Println(res.human(cfg))
	if *jsonOut {
		b, _ := json.Marshal(res)
		fmt.Println(string(b))
	}
}

// config is one run's parameters, as given on the command line.
type config struct {
	URL      string
	Conns    int
	PerConn  int
	Duration time.Duration
	Requests uint64 // ends the window early once this many completed in it; 0: no limit
	Warmup   time.Duration
	Timeout  time.Duration
	Insecure bool
	CACert   string
	SNI      string
	Close    bool   // a new connection per request
	Resume   bool   // with Close: resume the previous connection's session
	Curves   string // key exchanges offered, comma-separated; empty: Go's

	// roots, when set, replaces CACert (for tests).
	roots *x509.CertPool
}

// result is what a run reports; its JSON form is what bench/run.sh parses.
type result struct {
	Requests uint64  `json:"requests"`
	Errors   uint64  `json:"errors"`
	Non2xx   uint64  `json:"non2xx"`
	Seconds  float64 `json:"seconds"`
	RPS      float64 `json:"rps"`
	Bytes    uint64  `json:"bytes"`
	P50      float64 `json:"p50_ms"`
	P90      float64 `json:"p90_ms"`
	P99      float64 `json:"p99_ms"`
	Max      float64 `json:"max_ms"`
	// NewConns is set with -close only: what the window's connections
	// negotiated.
	NewConns *newConnStats `json:"new_connections,omitempty"`

	// firstError is one transport error seen during the run, for the human
	// line.
	firstError string
}

func (r result) human(cfg config) string {
	s := fmt.Sprintf("h3load %s c=%d m=%d: %d requests in %.2fs, %.1f req/s, %.2f MB/s, %d bytes, errors %d, non-2xx %d, latency p50 %.3fms p90 %.3fms p99 %.3fms max %.3fms",
		cfg.URL, cfg.Conns, cfg.PerConn, r.Requests, r.Seconds, r.RPS, float64(r.Bytes)/r.Seconds/1e6, r.Bytes,
		r.Errors, r.Non2xx, r.P50, r.P90, r.P99, r.Max)
	if nc := r.NewConns; nc != nil {
		s += fmt.Sprintf(", a new connection per request: %d handshakes, %d resumed, key exchange %s", nc.Handshakes, nc.Resumed, nc.KeyExchange)
	}
	if r.firstError != "" {
		s += " (first error: " + r.firstError + ")"
	}
	return s
}

// newConnStats describes the handshakes of a -close run's window: one per
// request counted (errors included when their handshake completed).
type newConnStats struct {
	Handshakes uint64 `json:"handshakes"`
	Resumed    uint64 `json:"resumed"`
	// KeyExchange is the group the last handshake negotiated (X25519,
	// X25519MLKEM768, ...); "mixed" when they were not all the same.
	KeyExchange string `json:"key_exchange"`
}

// target is what every worker needs to build and send its requests.
type target struct {
	url       string
	authority string // request Host, empty for the URL's
	dialAddr  *net.UDPAddr
	tlsConf   *tls.Config
	timeout   time.Duration
	fresh     bool // a new connection per request (-close)
	resume    bool // with fresh: resume the previous session (-resume)
}

// run sets up cfg.Conns connections, applies the load for cfg.Warmup plus
// cfg.Duration, and returns the measured window's numbers. It fails only
// when the configuration is unusable or no connection can be set up.
func run(ctx context.Context, cfg config) (result, error) {
	tg, err := newTarget(cfg)
	if err != nil {
		return result{}, err
	}
	if cfg.Conns < 1 || cfg.PerConn < 1 {
		return result{}, errors.New("-c and -m must be at least 1")
	}
	if cfg.Duration <= 0 || cfg.Warmup < 0 {
		return result{}, errors.New("-d must be positive and -warmup not negative")
	}
	if cfg.Close && cfg.PerConn != 1 {
		return result{}, errors.New("-close sends one request per connection: -m must be 1")
	}
	if cfg.Resume && !cfg.Close {
		return result{}, errors.New("-resume needs -close (long-lived connections resume nothing)")
	}

	// Set every connection up with one request before the clock starts, so
	// that handshakes are not part of the measured window and a target that
	// cannot be reached at all is reported as such. With -close, that first
	// request also leaves each worker a session ticket to resume with.
	conns := make([]*conn, cfg.Conns)
	setupErrs := make([]error, cfg.Conns)
	var wg sync.WaitGroup
	for i := range conns {
		conns[i] = newConn(tg)
		wg.Go(func() { setupErrs[i] = conns[i].prime(ctx) })
	}
	wg.Wait()
	defer func() {
		for _, c := range conns {
			c.tr.Close()
		}
	}()
	failed := 0
	for _, err := range setupErrs {
		if err != nil {
			failed++
		}
	}
	if failed == cfg.Conns {
		return result{}, fmt.Errorf("no connection to %s could be set up: %w", tg.dialAddr, setupErrs[0])
	}
	if failed > 0 {
		fmt.Fprintf(os.Stderr, "h3load: %d of %d connections failed to set up (first: %v); their workers keep retrying and count errors\n",
			failed, cfg.Conns, firstNonNil(setupErrs))
	}

	start := time.Now()
	ph := &phases{measureFrom: start.Add(cfg.Warmup), limit: cfg.Requests}
	ph.measureTo = ph.measureFrom.Add(cfg.Duration)
	loadCtx, cancel := context.WithDeadline(ctx, ph.measureTo)
	defer cancel()
	ph.stop = cancel
	for _, c := range conns {
		for range cfg.PerConn {
			wg.Go(func() { c.work(loadCtx, ph) })
		}
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return result{}, fmt.Errorf("interrupted: %w", err)
	}

	var res result
	h := new(histogram)
	if cfg.Close {
		res.NewConns = &newConnStats{}
	}
	for _, c := range conns {
		res.Requests += c.requests.Load()
		res.Errors += c.errors.Load()
		res.Non2xx += c.non2xx.Load()
		res.Bytes += c.bytes.Load()
		h.merge(&c.hist)
		if e, _ := c.firstErr.Load().(string); e != "" && res.firstError == "" {
			res.firstError = e
		}
		if nc := res.NewConns; nc != nil {
			nc.Handshakes += c.handshakes.Load()
			nc.Resumed += c.resumed.Load()
			switch kx, _ := c.keyExchange.Load().(string); {
			case kx == "" || kx == nc.KeyExchange:
			case nc.KeyExchange == "":
				nc.KeyExchange = kx
			default:
				nc.KeyExchange = "mixed"
			}
		}
	}
	res.Seconds = cfg.Duration.Seconds()
	if end := ph.endedAt.Load(); end != 0 {
		res.Seconds = time.Unix(0, end).Sub(ph.measureFrom).Seconds()
	}
	res.RPS = float64(res.Requests) / res.Seconds
	res.P50 = h.quantile(0.50)
	res.P90 = h.quantile(0.90)
	res.P99 = h.quantile(0.99)
	res.Max = float64(h.max.Load()) / 1e6
	return res, nil
}

func newTarget(cfg config) (*target, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("-url: %w", err)
	}
	if u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("-url %q: want https://host[:port]/path", cfg.URL)
	}
	port := u.Port()
	if port == "" {
		port = "443"
	}
	addr, err := net.ResolveUDPAddr("udp", net.JoinHostPort(u.Hostname(), port))
	if err != nil && isLocalhost(u.Hostname()) {
		// RFC 6761: *.localhost is loopback, though not every resolver says so.
		addr, err = net.ResolveUDPAddr("udp", net.JoinHostPort("127.0.0.1", port))
	}
	if err != nil {
		return nil, fmt.Errorf("resolving %s: %w", u.Host, err)
	}
	tlsConf := &tls.Config{InsecureSkipVerify: cfg.Insecure, RootCAs: cfg.roots}
	if cfg.Curves != "" {
		if tlsConf.CurvePreferences, err = parseCurves(cfg.Curves); err != nil {
			return nil, err
		}
	}
	if cfg.CACert != "" && cfg.roots == nil {
		pem, err := os.ReadFile(cfg.CACert)
		if err != nil {
			return nil, fmt.Errorf("-cacert: %w", err)
		}
		tlsConf.RootCAs = x509.NewCertPool()
		if !tlsConf.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-cacert %s: no PEM certificate found", cfg.CACert)
		}
	}
	tg := &target{url: u.String(), dialAddr: addr, tlsConf: tlsConf, timeout: cfg.Timeout,
		fresh: cfg.Close, resume: cfg.Resume}
	if cfg.SNI != "" {
		tlsConf.ServerName = cfg.SNI
		tg.authority = cfg.SNI
		if u.Port() != "" {
			tg.authority = net.JoinHostPort(cfg.SNI, u.Port())
		}
	}
	if cfg.Close {
		// Dialled without http3.Transport, which would otherwise set these:
		// the URL's host names the server (the SNI a proxy picks its
		// certificate by), and h3 is the only protocol.
		if tlsConf.ServerName == "" {
			tlsConf.ServerName = u.Hostname()
		}
		tlsConf.NextProtos = []string{http3.NextProtoH3}
	}
	return tg, nil
}

// curveNames are the key exchanges -curves accepts.
var curveNames = map[string]tls.CurveID{
	"x25519":         tls.X25519,
	"x25519mlkem768": tls.X25519MLKEM768,
	"p256":           tls.CurveP256,
	"p384":           tls.CurveP384,
	"p521":           tls.CurveP521,
}

func parseCurves(list string) ([]tls.CurveID, error) {
	var out []tls.CurveID
	for name := range strings.SplitSeq(list, ",") {
		key := strings.ReplaceAll(strings.ToLower(strings.TrimSpace(name)), "-", "")
		id, ok := curveNames[key]
		if !ok {
			return nil, fmt.Errorf("-curves: unknown key exchange %q (want X25519, X25519MLKEM768, P256, P384 or P521)", name)
		}
		out = append(out, id)
	}
	return out, nil
}

func isLocalhost(host string) bool {
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	return host == "localhost" || strings.HasSuffix(host, ".localhost")
}

// phases tells a worker whether a request belongs to the measured window.
type phases struct {
	measureFrom, measureTo time.Time

	// limit, when not 0, ends the window once that many requests completed
	// in it (stop cancels the load; endedAt is when, in Unix nanoseconds).
	limit    uint64
	measured atomic.Uint64
	stop     context.CancelFunc
	endedAt  atomic.Int64
}

// count records one request measured in the window, and ends the window
// when it was the limit's last.
func (ph *phases) count(t time.Time) {
	if ph.limit == 0 || ph.measured.Add(1) != ph.limit {
		return
	}
	ph.endedAt.Store(t.UnixNano())
	ph.stop()
}

// conn is one QUIC connection: its own http3.Transport, which holds a single
// connection to the one host it is used for, and that connection's counters.
// With -close it is one worker instead, whose every request dials a
// connection of its own (fresh).
type conn struct {
	tg *target
	tr *http3.Transport
	// tlsConf is this worker's under -close: its own session cache, so
	// that it resumes its own previous session as a wrk connection does.
	tlsConf *tls.Config

	requests, errors, non2xx, bytes atomic.Uint64
	hist                            histogram
	firstErr                        atomic.Value // string
	// -close only: handshakes in the window, those resumed, and the last
	// one's key exchange (string).
	handshakes, resumed atomic.Uint64
	keyExchange         atomic.Value
}

func newConn(tg *target) *conn {
	c := &conn{tg: tg}
	if tg.fresh {
		c.tlsConf = tg.tlsConf.Clone()
		if tg.resume {
			// One entry: the session of this worker's last connection.
			c.tlsConf.ClientSessionCache = tls.NewLRUClientSessionCache(1)
		}
	}
	c.tr = &http3.Transport{
		TLSClientConfig: tg.tlsConf,
		// Compare bodies as the servers send them.
		DisableCompression: true,
		// quic.DialAddr opens a UDP socket per call: connections share no
		// socket, as N separate clients would not.
		Dial: func(ctx context.Context, _ string, tlsCfg *tls.Config, qcfg *quic.Config) (*quic.Conn, error) {
			return quic.DialAddr(ctx, tg.dialAddr.String(), tlsCfg, qcfg)
		},
	}
	return c
}

// prime sends one request, dialling the connection.
func (c *conn) prime(ctx context.Context) error {
	o, err := c.do(ctx)
	if err == nil && o.status/100 != 2 {
		fmt.Fprintf(os.Stderr, "h3load: warning: %s answered %d\n", c.tg.url, o.status)
	}
	return err
}

// outcome is what one request got: the body length and the status, and
// under -close its connection's handshake (hs set once it completed).
type outcome struct {
	n      int64
	status int
	hs     *tls.ConnectionState
}

// do sends one GET and reads the body to its end.
func (c *conn) do(ctx context.Context) (outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, c.tg.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.tg.url, nil)
	if err != nil {
		return outcome{}, err
	}
	if c.tg.authority != "" {
		req.Host = c.tg.authority
	}
	var o outcome
	rt := http.RoundTripper(c.tr)
	if c.tg.fresh {
		// A connection for this request alone, closed once it is answered.
		qc, err := quic.DialAddr(ctx, c.tg.dialAddr.String(), c.tlsConf, nil)
		if err != nil {
			return o, err
		}
		defer qc.CloseWithError(0, "")
		st := qc.ConnectionState().TLS
		o.hs = &st
		rt = c.tr.NewClientConn(qc)
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return o, err
	}
	o.status = resp.StatusCode
	o.n, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return o, err
}

// work sends requests back to back until ctx ends, recording those that
// start and end inside the measured window.
func (c *conn) work(ctx context.Context, ph *phases) {
	for ctx.Err() == nil {
		t0 := time.Now()
		o, err := c.do(ctx)
		t1 := time.Now()
		if ctx.Err() != nil || t0.Before(ph.measureFrom) || t1.After(ph.measureTo) {
			// Warm-up, or cut by the end of the window.
			continue
		}
		if o.hs != nil {
			c.handshakes.Add(1)
			if o.hs.DidResume {
				c.resumed.Add(1)
			}
			c.keyExchange.Store(o.hs.CurveID.String())
		}
		if err != nil {
			c.errors.Add(1)
			c.firstErr.CompareAndSwap(nil, err.Error())
			ph.count(t1)
			continue
		}
		c.requests.Add(1)
		c.bytes.Add(uint64(o.n))
		if o.status/100 != 2 {
			c.non2xx.Add(1)
		}
		c.hist.record(t1.Sub(t0))
		ph.count(t1)
	}
}

// signalContext is cancelled by SIGINT or SIGTERM.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

func firstNonNil(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
