package main

import (
	"bytes"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// slowStart is what mode slow sends at once for -host fast.test.
const slowStart = "GET / HTTP/1.1\r\nHost: fast.test\r\nUser-Agent: bench-overload\r\nX-Slow: "

// rawServer accepts on a loopback port, counting connections, and runs
// serve on each; everything it opened is closed when the test ends.
func rawServer(t *testing.T, serve func(net.Conn)) (addr string, accepted *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = new(atomic.Int64)
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				serve(c)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String(), accepted
}

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("10 s without %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Each connection gets the request line and headers, then one byte of a
// header every -interval (never faster) and never the blank line, from its
// source address in turn; at the release each is closed and counted open.
func TestSlowTrickles(t *testing.T) {
	type seen struct {
		remote string
		got    []byte
		closed bool
	}
	var mu sync.Mutex
	var conns []*seen
	addr, _ := rawServer(t, func(c net.Conn) {
		s := &seen{remote: c.RemoteAddr().(*net.TCPAddr).IP.String()}
		mu.Lock()
		conns = append(conns, s)
		mu.Unlock()
		buf := make([]byte, 256)
		for {
			n, err := c.Read(buf)
			mu.Lock()
			s.got = append(s.got, buf[:n]...)
			if err != nil {
				s.closed = true
			}
			mu.Unlock()
			if err != nil {
				return
			}
		}
	})
	const n, interval = 4, 20 * time.Millisecond
	began := time.Now()
	_, res := runConns(t, []string{"-mode", "slow", "-target", addr, "-host", "fast.test", "-n", "4",
		"-interval", interval.String(), "-timeout", "20s", "-src", "127.0.0.2,127.0.0.3"},
		func(ConnsReport) {
			waitFor(t, "five header bytes on every connection", func() bool {
				mu.Lock()
				defer mu.Unlock()
				if len(conns) < n {
					return false
				}
				for _, s := range conns {
					if len(s.got) < len(slowStart)+5 {
						return false
					}
				}
				return true
			})
			elapsed := time.Since(began)
			mu.Lock()
			defer mu.Unlock()
			for _, s := range conns {
				rest, ok := bytes.CutPrefix(s.got, []byte(slowStart))
				if !ok || strings.Trim(string(rest), "a") != "" {
					t.Errorf("from %s: %q, want the headers' start and then only a's", s.remote, s.got)
				}
				// One byte an interval at most, and one more for the turn
				// the connection joined at.
				if most := int(elapsed/interval) + 2; len(rest) > most {
					t.Errorf("from %s: %d bytes after %s, more than one every %s", s.remote, len(rest), elapsed, interval)
				}
			}
		})
	if res.Outcomes[OutOpen] != n || res.Outcomes.Total() != n {
		t.Errorf("outcomes %v: want every connection open at the release, none ended", res.Outcomes)
	}
	waitFor(t, "every connection closed after the release", func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, s := range conns {
			if !s.closed {
				return false
			}
		}
		return true
	})
	mu.Lock()
	defer mu.Unlock()
	from := map[string]int{}
	for _, s := range conns {
		from[s.remote]++
	}
	if len(conns) != n || from["127.0.0.2"] != n/2 || from["127.0.0.3"] != n/2 {
		t.Errorf("connections by source: %v, want %d from each of 127.0.0.2 and 127.0.0.3", from, n/2)
	}
}

// A connection the proxy ends, however it ends it, is counted as what
// ended it and opened again at once: with an hour between header bytes,
// only the end itself can make the load reconnect.
func TestSlowReconnectsAtOnce(t *testing.T) {
	readStart := func(c net.Conn) bool {
		buf := make([]byte, len(slowStart))
		_, err := io.ReadFull(c, buf)
		return err == nil
	}
	for _, tc := range []struct {
		name  string
		serve func(net.Conn)
		want  string
	}{
		{"an answer", func(c net.Conn) {
			if readStart(c) {
				io.WriteString(c, "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
			}
			c.Close()
		}, "408"},
		{"a close", func(c net.Conn) {
			readStart(c)
			c.Close()
		}, OutClosed},
		{"a reset", func(c net.Conn) {
			readStart(c)
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
		}, OutReset},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, accepted := rawServer(t, tc.serve)
			const n = 3
			_, res := runConns(t, []string{"-mode", "slow", "-target", addr, "-host", "fast.test", "-n", "3",
				"-interval", "1h", "-timeout", "20s"}, func(ConnsReport) {
				waitFor(t, "each connection opened four times", func() bool { return accepted.Load() >= 4*n })
			})
			if res.Outcomes[tc.want] < 3*n || res.Outcomes[tc.want]+res.Outcomes[OutOpen] != res.Outcomes.Total() {
				t.Errorf("outcomes %v: want at least %d %q and nothing else but open", res.Outcomes, 3*n, tc.want)
			}
		})
	}
}

// A connection that lives -timeout is ended as timed out and opened again.
func TestSlowConnectionLife(t *testing.T) {
	addr, accepted := rawServer(t, func(c net.Conn) { io.Copy(io.Discard, c) })
	const n = 2
	_, res := runConns(t, []string{"-mode", "slow", "-target", addr, "-host", "fast.test", "-n", "2",
		"-interval", "20ms", "-timeout", "200ms", "-dial-timeout", "5s"}, func(ConnsReport) {
		waitFor(t, "each connection opened twice", func() bool { return accepted.Load() >= 2*n })
	})
	if res.Outcomes[OutTimeout] < n || res.Outcomes[OutTimeout]+res.Outcomes[OutOpen] != res.Outcomes.Total() {
		t.Errorf("outcomes %v: want at least %d timed out and nothing else but open", res.Outcomes, n)
	}
}
