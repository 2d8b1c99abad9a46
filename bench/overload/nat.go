package main

import (
	"bufio"
	"context"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"time"
)

// natConn is one browser behind a NAT (mode nat): a keep-alive connection
// that asks for the page once a second until the release, every request
// counted, and timed (NATTimes). A connection the proxy closes or resets
// is opened again for the next request, as a browser would; the request
// that found it closed is counted as what it got.
func (p *loadProc) natConn(ctx context.Context, i int, sem chan struct{}, attempted func()) {
	cfg := p.cfg
	// Spread over the first second, so that the requests are too.
	first := time.Duration(rand.Int64N(int64(cfg.Interval)))
	var c net.Conn
	var br *bufio.Reader
	defer func() {
		if c != nil {
			c.Close()
		}
	}()
	ready, dials := false, 0
	tick := time.NewTimer(first)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			if !ready {
				attempted()
			}
			return
		case <-p.releaseCh:
			if !ready {
				attempted()
			}
			return
		case <-tick.C:
		}
		tick.Reset(cfg.Interval)
		// A request on a new connection waits from its connect: what a
		// browser whose connection the proxy closed waits for its page.
		t0, reopened := time.Now(), false
		if c == nil {
			reopened, dials = dials > 0, dials+1
			if c, t0 = p.dialNAT(ctx, i, sem); c == nil {
				p.timed(time.Since(t0), false, reopened)
				if !ready {
					ready = true
					attempted()
				}
				continue
			}
			br = bufio.NewReaderSize(c, 1024)
		}
		outcome, keep := p.natRequest(c, br)
		p.record(outcome)
		p.timed(time.Since(t0), isStatus(outcome), reopened)
		if !keep {
			c.Close()
			c = nil
		}
		if !ready {
			ready = true
			attempted()
		}
	}
}

// timed counts how long one of natConn's requests took.
func (p *loadProc) timed(took time.Duration, answered, reopened bool) {
	p.mu.Lock()
	p.natTimes.Add(took, answered, reopened)
	p.mu.Unlock()
}

// dialNAT opens a connection for natConn, counting a failed connect as
// its request's outcome, and returns when the connect began: after the
// tool's own wait for a turn to connect, which is not the proxy's.
func (p *loadProc) dialNAT(ctx context.Context, i int, sem chan struct{}) (net.Conn, time.Time) {
	sem <- struct{}{}
	defer func() { <-sem }()
	began := time.Now()
	c, err := p.cfg.dialer(i).DialContext(ctx, "tcp", p.cfg.Target)
	if err != nil {
		p.record(ClassifyDial(err))
		return nil, began
	}
	return c, began
}

// natRequest sends one request on c and reads its answer: what it got, and
// whether the connection may carry the next one.
func (p *loadProc) natRequest(c net.Conn, br *bufio.Reader) (string, bool) {
	c.SetDeadline(time.Now().Add(p.cfg.DialTimeout))
	if _, err := c.Write(p.cfg.request()); err != nil {
		return Classify(err), false
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return Classify(err), false
	}
	_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if err != nil {
		return Classify(err), false
	}
	return strconv.Itoa(resp.StatusCode), !resp.Close
}
