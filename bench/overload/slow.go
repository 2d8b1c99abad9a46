package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"
)

// slowConn trickles a request's headers (mode slow), as slowloris does:
// the request line and Host at once, then one byte of a header every
// -interval, never the blank line that ends them. When the proxy ends the
// connection (an answer such as 408, a close, a reset) that is counted and
// another is opened, until the release; those still open at the release
// are counted "open".
func (p *loadProc) slowConn(ctx context.Context, i int, sem chan struct{}, attempted func()) {
	cfg := p.cfg
	ready := false
	markReady := func() {
		if !ready {
			ready = true
			attempted()
		}
	}
	defer markReady()
	for ctx.Err() == nil && !p.released.Load() {
		c := p.dial(ctx, i, sem, func() {})
		if c == nil {
			markReady()
			select { // a connect that failed: not again at once
			case <-time.After(cfg.Interval):
			case <-p.releaseCh:
			case <-ctx.Done():
			}
			continue
		}
		<-sem
		outcome := p.trickle(ctx, c, markReady)
		c.Close()
		p.record(outcome)
	}
}

// trickle writes the headers a byte at a time until the proxy ends the
// connection or the release comes; it returns what ended it.
func (p *loadProc) trickle(ctx context.Context, c net.Conn, wrote func()) string {
	cfg := p.cfg
	ended := make(chan string, 1)
	go func() {
		// What the proxy does: an answer, or the end of the connection.
		c.SetReadDeadline(time.Now().Add(cfg.Timeout))
		resp, err := http.ReadResponse(bufio.NewReaderSize(c, 1024), nil)
		if err != nil {
			ended <- Classify(err)
			return
		}
		resp.Body.Close()
		ended <- strconv.Itoa(resp.StatusCode)
	}()
	start := fmt.Sprintf("GET / HTTP/1.1\r\nHost: %s\r\nUser-Agent: bench-overload\r\nX-Slow: ", cfg.Host)
	if _, err := c.Write([]byte(start)); err != nil {
		return Classify(err)
	}
	p.open.Add(1)
	defer p.open.Add(-1)
	wrote()
	tick := time.NewTicker(cfg.Interval)
	defer tick.Stop()
	for {
		select {
		case o := <-ended:
			return o
		case <-p.releaseCh:
			return OutOpen
		case <-ctx.Done():
			return OutOpen
		case <-tick.C:
			c.SetWriteDeadline(time.Now().Add(cfg.Interval))
			if _, err := c.Write([]byte("a")); err != nil {
				select {
				case o := <-ended:
					return o
				case <-time.After(time.Second):
					return Classify(err)
				}
			}
		}
	}
}
