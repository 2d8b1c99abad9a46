// Command authload measures what a password guesser costs everyone else:
// it sends wrong basic-auth credentials to one host from many source
// addresses at a fixed total rate, while a visitor from an address of its
// own asks another host at a steady pace; it prints the visitor's latency
// percentiles, before and during the guessing, and what the guesser got.
//
//	authload -edge 127.0.0.1:8080 -auth-host tool.example -other-host app.example
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	edge := flag.String("edge", "127.0.0.1:8080", "the edge's plain HTTP address")
	authHost := flag.String("auth-host", "tool.example", "the host behind basic auth")
	otherHost := flag.String("other-host", "app.example", "another application's host")
	rate := flag.Int("rate", 1000, "wrong attempts a second, in all")
	sources := flag.Int("sources", 16, "guessing addresses, 127.0.1.1 and up")
	visitorRate := flag.Int("visitor-rate", 50, "the visitor's requests a second")
	phase := flag.Duration("phase", 10*time.Second, "length of the quiet and of the guessing phase")
	flag.Parse()

	quiet := visit(*edge, *otherHost, *visitorRate, *phase)
	var stop atomic.Bool
	counts := make(map[int]*atomic.Int64)
	for _, s := range []int{0, 200, 401, 429, 503} {
		counts[s] = new(atomic.Int64)
	}
	var wg sync.WaitGroup
	for i := range *sources {
		wg.Add(1)
		go func() {
			defer wg.Done()
			guess(*edge, *authHost, fmt.Sprintf("127.0.1.%d", i+1), *rate / *sources, &stop, counts)
		}()
	}
	during := visit(*edge, *otherHost, *visitorRate, *phase)
	stop.Store(true)
	wg.Wait()
	fmt.Printf("visitor of %s, %d/s: before p50 %v p99 %v max %v; during %d wrong attempts/s from %d addresses: p50 %v p99 %v max %v\n",
		*otherHost, *visitorRate, quiet.q(0.5), quiet.q(0.99), quiet.q(1), *rate, *sources, during.q(0.5), during.q(0.99), during.q(1))
	fmt.Printf("guesser's answers: 401 %d, 429 %d, 503 %d, 200 %d, failed %d\n",
		counts[401].Load(), counts[429].Load(), counts[503].Load(), counts[200].Load(), counts[0].Load())
	if quiet.errors+during.errors > 0 {
		fmt.Printf("visitor errors: %d\n", quiet.errors+during.errors)
		os.Exit(1)
	}
}

type latencies struct {
	d      []time.Duration
	errors int
}

func (l latencies) q(q float64) time.Duration {
	if len(l.d) == 0 {
		return 0
	}
	return l.d[min(len(l.d)-1, int(q*float64(len(l.d))))].Round(100 * time.Microsecond)
}

// visit asks host at rate for d from 127.0.0.2, on a kept-alive connection.
func visit(edge, host string, rate int, d time.Duration) latencies {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: dialFrom("127.0.0.2")}}
	var l latencies
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		<-tick.C
		req, _ := http.NewRequest("GET", "http://"+edge+"/", nil)
		req.Host = host
		start := time.Now()
		resp, err := c.Do(req)
		if err != nil || resp.StatusCode != 200 {
			l.errors++
			if err == nil {
				resp.Body.Close()
			}
			continue
		}
		resp.Body.Close()
		l.d = append(l.d, time.Since(start))
	}
	slices.Sort(l.d)
	return l
}

// guess sends wrong credentials from src at rate until stop.
func guess(edge, host, src string, rate int, stop *atomic.Bool, counts map[int]*atomic.Int64) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: dialFrom(src), MaxConnsPerHost: 64}}
	tick := time.NewTicker(time.Second / time.Duration(max(rate, 1)))
	defer tick.Stop()
	var n int
	var inflight sync.WaitGroup
	for !stop.Load() {
		<-tick.C
		n++
		inflight.Add(1)
		go func(n int) {
			defer inflight.Done()
			req, _ := http.NewRequest("GET", "http://"+edge+"/", nil)
			req.Host = host
			req.SetBasicAuth("admin", fmt.Sprintf("guess-%d", n))
			resp, err := c.Do(req)
			if err != nil {
				counts[0].Add(1)
				return
			}
			resp.Body.Close()
			if ct, ok := counts[resp.StatusCode]; ok {
				ct.Add(1)
			}
		}(n)
	}
	inflight.Wait()
}

// dialFrom dials from the loopback address src, so that the edge sees
// each guesser, and the visitor, as an address of its own.
func dialFrom(src string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	return d.DialContext
}
