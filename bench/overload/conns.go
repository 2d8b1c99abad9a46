package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// One load process (overload conns): N connections to the proxy, each
// bounded in time, reporting on stdout, one JSON line each:
//
//	{"event":"ready",...}   every connection attempted (held: its request
//	                        written; idle: its first answer read)
//	{"event":"result",...}  every connection ended
//
// A line "release" on stdin (or stdin's end) says the slow application has
// been released: answers after it are not "early", and idle connections
// are closed. Modes:
//
//	held  each connection sends one GET to the held host and waits for the
//	      answer, at most -timeout
//	idle  each connection sends one GET, reads the answer, then stays open
//	      and silent until the release (a keep-alive visitor gone quiet)
//	h2    HTTP/2 over TLS: ceil(N/-streams) connections, each carrying
//	      -streams concurrent held requests
//	h3    the same over HTTP/3 (QUIC, UDP)
//	nat   each connection asks for the page every -interval until the
//	      release, keep-alive, reopened when the proxy closes it: browsers
//	      behind one NAT
//	slow  each connection trickles its request headers, a byte every
//	      -interval, never ending them (slowloris); reopened when the proxy
//	      ends it
type connsConfig struct {
	Mode        string
	Target      string // the proxy, host:port
	Host        string // Host header (and TLS server name in h2)
	Path        string
	N           int
	Streams     int
	Srcs        []string
	Offset      int
	DialTimeout time.Duration
	Timeout     time.Duration
	Concurrency int
	Interval    time.Duration
}

// ConnsReport is one line a load process prints.
type ConnsReport struct {
	Event     string `json:"event"`
	Attempted int    `json:"attempted"`
	// Open: held, requests still waiting for their answer; idle,
	// connections open after their first answer.
	Open int `json:"open"`
	// Outcomes: held and h2, what each request ended with; idle, what the
	// first request of each connection got.
	Outcomes Counts `json:"outcomes"`
	// Early: of Outcomes, those that came before the release.
	Early Counts `json:"early"`
	// ClosedEarly: idle connections the proxy closed (or reset) after
	// answering, before the release.
	ClosedEarly int `json:"closed_early"`
	// OpenAtRelease: idle connections still open when the release came.
	OpenAtRelease int `json:"open_at_release"`
	// NAT: nat, how long its requests waited.
	NAT NATTimes `json:"nat"`
}

// NATTimes is how long the requests of browsers behind a NAT waited: a
// count of failures says nothing of a browser kept waiting, nor of a
// connection the proxy closed and made it open again.
type NATTimes struct {
	// SlowestMs: the slowest answered request (on a new connection, from
	// the connect); Slow: requests answered or failed after more than 1 s.
	SlowestMs float64 `json:"slowest_ms"`
	Slow      int     `json:"slow"`
	// Reopened: connections opened after a browser's first (the proxy
	// closed one, or a connect failed); ReopenMaxMs, the slowest of them
	// from the connect to the answer; ReopenSlow, those over 1 s, answered
	// or not.
	Reopened    int     `json:"reopened"`
	ReopenMaxMs float64 `json:"reopen_max_ms"`
	ReopenSlow  int     `json:"reopen_slow"`
}

// Add counts one request that took took, answered or not, on a reopened
// connection or not.
func (t *NATTimes) Add(took time.Duration, answered, reopened bool) {
	ms, slow := float64(took.Microseconds())/1000, took > time.Second
	if answered {
		t.SlowestMs = max(t.SlowestMs, ms)
	}
	if slow {
		t.Slow++
	}
	if !reopened {
		return
	}
	t.Reopened++
	if answered {
		t.ReopenMaxMs = max(t.ReopenMaxMs, ms)
	}
	if slow {
		t.ReopenSlow++
	}
}

// Merge adds another process's times into t.
func (t *NATTimes) Merge(o NATTimes) {
	t.SlowestMs, t.ReopenMaxMs = max(t.SlowestMs, o.SlowestMs), max(t.ReopenMaxMs, o.ReopenMaxMs)
	t.Slow += o.Slow
	t.Reopened += o.Reopened
	t.ReopenSlow += o.ReopenSlow
}

// Merge adds another process's report into r.
func (r *ConnsReport) Merge(o ConnsReport) {
	r.Attempted += o.Attempted
	r.Open += o.Open
	if r.Outcomes == nil {
		r.Outcomes = Counts{}
	}
	if r.Early == nil {
		r.Early = Counts{}
	}
	r.Outcomes.Add(o.Outcomes)
	r.Early.Add(o.Early)
	r.ClosedEarly += o.ClosedEarly
	r.OpenAtRelease += o.OpenAtRelease
	r.NAT.Merge(o.NAT)
}

type loadProc struct {
	cfg       connsConfig
	mu        sync.Mutex
	outcomes  Counts
	early     Counts
	natTimes  NATTimes
	attempted atomic.Int64
	open      atomic.Int64
	closedEarly,
	openAtRelease atomic.Int64
	released  atomic.Bool
	releaseCh chan struct{}
	once      sync.Once
	idle      map[net.Conn]struct{}
}

func (p *loadProc) record(outcome string) {
	p.mu.Lock()
	p.outcomes[outcome]++
	if !p.released.Load() {
		p.early[outcome]++
	}
	p.mu.Unlock()
}

func (p *loadProc) release() {
	p.once.Do(func() {
		p.mu.Lock()
		p.released.Store(true)
		p.openAtRelease.Store(int64(len(p.idle)))
		for c := range p.idle {
			c.Close()
		}
		p.idle = nil
		p.mu.Unlock()
		close(p.releaseCh)
	})
}

func (p *loadProc) report(event string) ConnsReport {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := ConnsReport{Event: event, Attempted: int(p.attempted.Load()), Open: int(p.open.Load()),
		Outcomes: Counts{}, Early: Counts{}, ClosedEarly: int(p.closedEarly.Load()),
		OpenAtRelease: int(p.openAtRelease.Load()), NAT: p.natTimes}
	r.Outcomes.Add(p.outcomes)
	r.Early.Add(p.early)
	return r
}

// bindNoPort sets IP_BIND_ADDRESS_NO_PORT: with a source address bound, the
// port is chosen at connect time per destination, not at bind time, so
// one address can hold as many connections as the ephemeral range allows
// to each destination.
func bindNoPort(network, address string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, 24 /* IP_BIND_ADDRESS_NO_PORT */, 1)
	})
	if err != nil {
		return err
	}
	return serr
}

func (cfg connsConfig) dialer(i int) *net.Dialer {
	d := &net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: -1}
	if len(cfg.Srcs) > 0 {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(cfg.Srcs[(cfg.Offset+i)%len(cfg.Srcs)])}
		d.Control = bindNoPort
	}
	return d
}

func (cfg connsConfig) request() []byte {
	return []byte("GET " + cfg.Path + " HTTP/1.1\r\nHost: " + cfg.Host + "\r\nUser-Agent: bench-overload\r\nAccept: */*\r\n\r\n")
}

// dial opens connection i holding a place in sem; when it fails, it records
// why, gives the place back, counts the attempt and returns nil.
func (p *loadProc) dial(ctx context.Context, i int, sem chan struct{}, attempted func()) net.Conn {
	sem <- struct{}{}
	c, err := p.cfg.dialer(i).DialContext(ctx, "tcp", p.cfg.Target)
	if err != nil {
		<-sem
		p.record(ClassifyDial(err))
		attempted()
		return nil
	}
	return c
}

// held: one request per connection, waiting for its answer.
func (p *loadProc) held(ctx context.Context, i int, sem chan struct{}, attempted func()) {
	cfg := p.cfg
	c := p.dial(ctx, i, sem, attempted)
	if c == nil {
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(cfg.Timeout))
	_, err := c.Write(cfg.request())
	<-sem
	attempted()
	if err != nil {
		p.record(Classify(err))
		return
	}
	p.open.Add(1)
	resp, err := http.ReadResponse(bufio.NewReaderSize(c, 2048), nil)
	p.open.Add(-1)
	if err != nil {
		p.record(Classify(err))
		return
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	p.record(strconv.Itoa(resp.StatusCode))
}

// idleConn: one request, its answer, then silence until the release.
func (p *loadProc) idleConn(ctx context.Context, i int, sem chan struct{}, attempted func()) {
	cfg := p.cfg
	c := p.dial(ctx, i, sem, attempted)
	if c == nil {
		return
	}
	defer c.Close()
	// The first answer within the dial timeout (a visitor's patience).
	c.SetDeadline(time.Now().Add(cfg.DialTimeout))
	_, err := c.Write(cfg.request())
	var resp *http.Response
	br := bufio.NewReaderSize(c, 1024)
	if err == nil {
		resp, err = http.ReadResponse(br, nil)
	}
	if err == nil {
		_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
	}
	<-sem
	if err != nil {
		p.record(Classify(err))
		attempted()
		return
	}
	p.record(strconv.Itoa(resp.StatusCode))
	if resp.Close || resp.StatusCode != http.StatusOK {
		attempted()
		return // the proxy closes it itself: nothing to keep open
	}
	p.mu.Lock()
	if p.idle == nil { // released already
		p.mu.Unlock()
		attempted()
		return
	}
	p.idle[c] = struct{}{}
	p.mu.Unlock()
	p.open.Add(1)
	attempted()
	// Silence: a read that ends when the proxy closes the connection, the
	// release closes it, or -timeout passes.
	c.SetDeadline(time.Now().Add(cfg.Timeout))
	br.ReadByte() // whatever ends it: the proxy, the release or the timeout
	p.open.Add(-1)
	if !p.released.Load() {
		p.closedEarly.Add(1)
		p.mu.Lock()
		delete(p.idle, c)
		p.mu.Unlock()
	}
}

// h2Conn: one HTTP/2 connection carrying cfg.Streams held requests (fewer
// for the last connection, n).
func (p *loadProc) h2Conn(ctx context.Context, i, n int, sem chan struct{}, attempted func()) {
	cfg := p.cfg
	protos := new(http.Protocols)
	protos.SetHTTP2(true) // h2 only: a proxy that does not offer it fails the row
	d := cfg.dialer(i)
	tr := &http.Transport{
		DialContext:         d.DialContext,
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: true, ServerName: cfg.Host},
		TLSHandshakeTimeout: cfg.DialTimeout,
		ForceAttemptHTTP2:   true,
		Protocols:           protos,
		MaxConnsPerHost:     1,
		DisableCompression:  true,
	}
	defer tr.CloseIdleConnections()
	p.streams(ctx, n, "https://"+cfg.Target+cfg.Path, tr, 2, sem, attempted)
}

// streams sends n held requests for url through rt, one connection's
// streams, each recorded as it ends (OutNotH2 unless answered over HTTP
// version proto). A request counts as attempted once written, as the
// transport's trace says, or over HTTP/3, whose transport says nothing,
// 200 ms after it started. sem's slot is held until every request is
// written, a failure ended them or two seconds passed, so that
// connections open a few at a time.
func (p *loadProc) streams(ctx context.Context, n int, url string, rt http.RoundTripper, proto int, sem chan struct{}, attempted func()) {
	cfg := p.cfg
	sem <- struct{}{}
	var wg, wrote sync.WaitGroup
	wrote.Add(n)
	for s := 0; s < n; s++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var once sync.Once
			done := func() {
				once.Do(func() {
					attempted()
					wrote.Done()
				})
			}
			defer done()
			rctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
			defer cancel()
			rctx = httptrace.WithClientTrace(rctx, &httptrace.ClientTrace{
				WroteRequest: func(httptrace.WroteRequestInfo) { done() },
			})
			req, err := http.NewRequestWithContext(rctx, http.MethodGet, url, nil)
			if err != nil {
				p.record(OutError)
				return
			}
			req.Host = cfg.Host
			req.Header.Set("User-Agent", "bench-overload")
			if proto == 3 {
				// HTTP/3's transport traces no write.
				placed := time.AfterFunc(200*time.Millisecond, done)
				defer placed.Stop()
			}
			p.open.Add(1)
			resp, err := rt.RoundTrip(req)
			p.open.Add(-1)
			if err != nil {
				p.record(Classify(err))
				return
			}
			io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			if resp.ProtoMajor != proto {
				p.record(OutNotH2)
				return
			}
			p.record(strconv.Itoa(resp.StatusCode))
		}()
	}
	ch := make(chan struct{})
	go func() { wrote.Wait(); close(ch) }()
	t := time.NewTimer(2 * time.Second)
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
	}
	t.Stop()
	<-sem
	wg.Wait()
}

func connsCmd(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet("conns", flag.ContinueOnError)
	var cfg connsConfig
	var srcs string
	fs.StringVar(&cfg.Mode, "mode", "held", "held, idle, h2, h3, nat or slow")
	fs.StringVar(&cfg.Target, "target", "", "the proxy's address, host:port")
	fs.StringVar(&cfg.Host, "host", "slow.test", "Host header (h2: also the TLS server name)")
	fs.StringVar(&cfg.Path, "path", "/hold", "request path")
	fs.IntVar(&cfg.N, "n", 0, "connections (held, idle) or streams (h2)")
	fs.IntVar(&cfg.Streams, "streams", 100, "h2: streams per connection")
	fs.StringVar(&srcs, "src", "", "comma list of client source addresses, used in turn (empty: the kernel's choice)")
	fs.IntVar(&cfg.Offset, "offset", 0, "index of this process's first connection across all processes (spreads -src evenly)")
	fs.DurationVar(&cfg.DialTimeout, "dial-timeout", 10*time.Second, "connect timeout (idle: also the first answer's)")
	fs.DurationVar(&cfg.Timeout, "timeout", time.Minute, "the longest any connection lives")
	fs.IntVar(&cfg.Concurrency, "concurrency", 1000, "connections being opened at once")
	fs.DurationVar(&cfg.Interval, "interval", time.Second, "nat: time between a connection's requests; slow: between its header bytes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if srcs != "" {
		cfg.Srcs = strings.Split(srcs, ",")
		for _, s := range cfg.Srcs {
			if ip := net.ParseIP(s); ip == nil || !ip.IsLoopback() {
				return fmt.Errorf("-src %s: only loopback addresses", s)
			}
		}
	}
	if cfg.Target == "" || cfg.N <= 0 {
		return errors.New("need -target and -n")
	}
	if host, _, err := net.SplitHostPort(cfg.Target); err != nil || !net.ParseIP(host).IsLoopback() {
		return fmt.Errorf("-target %s: only a loopback host:port", cfg.Target)
	}
	p := &loadProc{cfg: cfg, outcomes: Counts{}, early: Counts{}, releaseCh: make(chan struct{}),
		idle: map[net.Conn]struct{}{}}
	// Everything ends by this, released or not.
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout+cfg.DialTimeout+10*time.Second)
	defer cancel()
	go func() {
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) == "release" {
				break
			}
		}
		p.release() // on "release" or on stdin's end (the row is gone)
	}()
	enc := json.NewEncoder(stdout)
	var attemptedWG, doneWG sync.WaitGroup
	attempted := func() { p.attempted.Add(1); attemptedWG.Done() }
	sem := make(chan struct{}, max(cfg.Concurrency, 1))
	switch cfg.Mode {
	case "slow":
		if cfg.Interval <= 0 {
			return errors.New("-interval must be positive")
		}
		attemptedWG.Add(cfg.N)
		doneWG.Add(cfg.N)
		if err := p.slow(ctx, sem, attempted, doneWG.Done); err != nil {
			return err
		}
	case "held", "idle", "nat":
		if cfg.Interval <= 0 {
			return errors.New("-interval must be positive")
		}
		run := map[string]func(context.Context, int, chan struct{}, func()){
			"held": p.held, "idle": p.idleConn, "nat": p.natConn,
		}[cfg.Mode]
		attemptedWG.Add(cfg.N)
		doneWG.Add(cfg.N)
		for i := 0; i < cfg.N; i++ {
			go func() {
				defer doneWG.Done()
				run(ctx, i, sem, attempted)
			}()
		}
	case "h2", "h3":
		if cfg.Streams <= 0 {
			return errors.New("-streams must be positive")
		}
		conns := int(math.Ceil(float64(cfg.N) / float64(cfg.Streams)))
		attemptedWG.Add(cfg.N)
		doneWG.Add(conns)
		for i := 0; i < conns; i++ {
			n := min(cfg.Streams, cfg.N-i*cfg.Streams)
			go func() {
				defer doneWG.Done()
				if cfg.Mode == "h2" {
					p.h2Conn(ctx, i, n, sem, attempted)
				} else {
					p.h3Conn(ctx, i, n, sem, attempted)
				}
			}()
		}
	default:
		return fmt.Errorf("-mode %q: want held, idle, h2, h3, nat or slow", cfg.Mode)
	}
	waitOr := func(wg *sync.WaitGroup) {
		ch := make(chan struct{})
		go func() { wg.Wait(); close(ch) }()
		select {
		case <-ch:
		case <-ctx.Done():
		}
	}
	waitOr(&attemptedWG)
	if err := enc.Encode(p.report("ready")); err != nil {
		return err
	}
	waitOr(&doneWG)
	return enc.Encode(p.report("result"))
}
