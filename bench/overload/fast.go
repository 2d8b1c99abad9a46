package main

import (
	"crypto/tls"
	"errors"
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

// fastLoad runs clients keep-alive clients of host at url for d: each its
// own connection, one request at a time, every request bounded by timeout;
// after a failure a client waits 50 ms and goes on (on a new connection).
func fastLoad(url, host, src string, clients int, d, timeout time.Duration) fastResult {
	var mu sync.Mutex
	res := fastResult{failures: Counts{}}
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for i := 0; i < clients; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tr := transport(url, host, src, timeout)
			tr.MaxIdleConnsPerHost, tr.MaxConnsPerHost = 1, 1
			defer tr.CloseIdleConnections()
			client := &http.Client{Transport: tr, Timeout: timeout}
			var ms []float64
			served, failed := 0, 0
			fails := Counts{}
			for time.Now().Before(end) {
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				req.Host = host
				t0 := time.Now()
				resp, err := client.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != http.StatusOK {
						err = statusError(resp.StatusCode)
					}
				}
				if err != nil {
					failed++
					var se statusError
					if errors.As(err, &se) {
						fails[strconv.Itoa(int(se))]++
					} else {
						fails[Classify(err)]++
					}
					tr.CloseIdleConnections()
					time.Sleep(50 * time.Millisecond)
					continue
				}
				served++
				ms = append(ms, float64(time.Since(t0).Microseconds())/1000)
			}
			mu.Lock()
			res.served += served
			res.failed += failed
			res.failures.Add(fails)
			res.ms = append(res.ms, ms...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return res
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

type statusError int

func (s statusError) Error() string { return "status " + strconv.Itoa(int(s)) }

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
	client := &http.Client{Transport: tr, Timeout: limit}
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
