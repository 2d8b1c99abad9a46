package main

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// fast.test under the load: its keep-alive clients and its new visitors.

type fastResult struct {
	served, failed int
	failures       Counts
	ms             []float64
}

// fastSample is one request of a keep-alive client: when it started, and
// how long it took if served 200, or how it failed.
type fastSample struct {
	start time.Time
	ms    float64
	fail  string
}

// fastBetween is what the requests started in [from, to) got: a span of
// a run is its own measure (the window within the attack), so each is
// counted where it began, however long it took.
func fastBetween(samples []fastSample, from, to time.Time) fastResult {
	res := fastResult{failures: Counts{}}
	for _, s := range samples {
		if s.start.Before(from) || !s.start.Before(to) {
			continue
		}
		if s.fail != "" {
			res.failed++
			res.failures[s.fail]++
			continue
		}
		res.served++
		res.ms = append(res.ms, s.ms)
	}
	return res
}

// fastURL is where fast.test is asked: plain HTTP, or in the h2 and h3
// rows HTTPS (h2 where offered, as a browser would), since a proxy serving
// TLS may redirect plain HTTP there (scafo-edge does).
func (c rowConfig) fastURL() string {
	if c.spec.Kind == "h2" || c.spec.Kind == "h3" {
		return "https://" + c.tlsAddr + "/"
	}
	return "http://" + c.addr + "/"
}

// transport is a client of url's scheme from src: over TLS it skips
// verification (scafo-edge's certificate comes from its internal CA) and
// names host.
func transport(url, host, src string, timeout time.Duration) *http.Transport {
	tr := &http.Transport{
		DialContext:        sourceDialer(src, timeout).DialContext,
		DisableCompression: true,
	}
	if strings.HasPrefix(url, "https:") {
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: true, ServerName: host}
		tr.TLSHandshakeTimeout = timeout
		tr.ForceAttemptHTTP2 = true
	}
	return tr
}

// fastLoad runs clients keep-alive clients of host at url for d, nothing
// else around them (the baseline).
func fastLoad(url, host, src string, clients int, d, timeout time.Duration) fastResult {
	start := time.Now()
	f := startFast(url, host, src, clients, timeout)
	f.stopAt(start.Add(d))
	return fastBetween(f.wait(), start, start.Add(d))
}

// fastClients are keep-alive clients of host at url: each its own
// connection, one request at a time, every request bounded by timeout;
// after a failure a client waits 50 ms and goes on (on a new connection).
// They ask until stopAt's time, which a row knows only once its ramp is
// over, so that one set of clients spans the attack and its window.
type fastClients struct {
	url, host, src string
	timeout        time.Duration

	renew     chan struct{} // closed by reconnect
	renewOnce sync.Once

	mu      sync.Mutex
	end     time.Time // zero until stopAt
	samples []fastSample

	wg sync.WaitGroup // the clients and every request, those left aside included
}

func startFast(url, host, src string, clients int, timeout time.Duration) *fastClients {
	f := &fastClients{url: url, host: host, src: src, timeout: timeout, renew: make(chan struct{})}
	for i := 0; i < clients; i++ {
		f.wg.Add(1)
		go f.client()
	}
	return f
}

// reconnect puts every client on a new connection for its next request,
// at once: a request started after reconnect returned is on one. A
// request then in flight is left to finish on its own connection, so that
// the next goes now, as a client started now would.
func (f *fastClients) reconnect() { f.renewOnce.Do(func() { close(f.renew) }) }

// stopAt: no request starts at end or after.
func (f *fastClients) stopAt(end time.Time) {
	f.mu.Lock()
	f.end = end
	f.mu.Unlock()
}

// wait returns every request's sample once the last has ended (stopAt
// first, or it never returns).
func (f *fastClients) wait() []fastSample {
	f.wg.Wait()
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.samples
}

func (f *fastClients) asking(t time.Time) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.end.IsZero() || t.Before(f.end)
}

func (f *fastClients) client() {
	defer f.wg.Done()
	newClient := func() (*http.Transport, *http.Client) {
		tr := transport(f.url, f.host, f.src, f.timeout)
		tr.MaxIdleConnsPerHost, tr.MaxConnsPerHost = 1, 1
		return tr, &http.Client{Transport: tr, Timeout: f.timeout}
	}
	tr, client := newClient()
	defer func() { tr.CloseIdleConnections() }()
	renew := f.renew // nil once renewed
	for {
		t0 := time.Now()
		// After reading the clock: whoever read it after reconnect finds
		// this request on a new connection.
		select {
		case <-renew:
			tr.CloseIdleConnections()
			tr, client = newClient()
			renew, t0 = nil, time.Now()
		default:
		}
		if !f.asking(t0) {
			return
		}
		done := make(chan string, 1)
		f.wg.Add(1)
		go func(client *http.Client) {
			defer f.wg.Done()
			fail := ask(client, f.url, f.host)
			s := fastSample{start: t0, fail: fail}
			if fail == "" {
				s.ms = float64(time.Since(t0).Microseconds()) / 1000
			}
			f.mu.Lock()
			f.samples = append(f.samples, s)
			f.mu.Unlock()
			done <- fail
		}(client)
		select {
		case fail := <-done:
			if fail != "" {
				tr.CloseIdleConnections()
				select {
				case <-time.After(50 * time.Millisecond):
				case <-renew:
				}
			}
		case <-renew:
			// Its connection is closed once it ends: a proxy would
			// otherwise keep it open as an idle keep-alive.
			aside := tr
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				<-done
				aside.CloseIdleConnections()
			}()
		}
	}
}

// ask is one request of host at url: "" if answered 200, else a status or
// how it failed.
func ask(client *http.Client, url, host string) string {
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Host = host
	resp, err := client.Do(req)
	if err != nil {
		return Classify(err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return Classify(err)
	}
	if resp.StatusCode != http.StatusOK {
		return strconv.Itoa(resp.StatusCode)
	}
	return ""
}

// sourceDialer dials from src (a loopback address; empty: the kernel's
// choice).
func sourceDialer(src string, timeout time.Duration) *net.Dialer {
	d := &net.Dialer{Timeout: timeout}
	if src != "" {
		d.LocalAddr = &net.TCPAddr{IP: net.ParseIP(src)}
		d.Control = bindNoPort
	}
	return d
}

// newVisitor: one request of host on a new connection; "" if answered 200
// within limit, else what happened; and how long it took.
func newVisitor(url, host, src string, limit time.Duration) (string, time.Duration) {
	t0 := time.Now()
	o := visit(url, host, src, limit)
	return o, time.Since(t0)
}

func visit(url, host, src string, limit time.Duration) string {
	tr := transport(url, host, src, limit)
	tr.DisableKeepAlives = true
	defer tr.CloseIdleConnections()
	return ask(&http.Client{Transport: tr, Timeout: limit}, url, host)
}
