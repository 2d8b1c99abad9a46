package h1

import (
	"context"
	"io"
	"net"
	"testing"
	"time"
)

// TestAnExchangeHoldsAReadBufferOnlyWhileTheUpstreamAnswers: a request
// waiting for a slow upstream, or a connection idle in the pool, holds no
// read buffer; bytes left unread at the end still keep the connection out
// of the pool.
func TestAnExchangeHoldsAReadBufferOnlyWhileTheUpstreamAnswers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	nc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	pc := NewConn(nc, ln.Addr().String(), 0)
	defer pc.NC.Close()
	var srv net.Conn
	select {
	case srv = <-accepted:
		defer srv.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream never accepted the connection")
	}
	ctx := context.Background()

	// Nothing arrives before the response-header deadline.
	now := time.Now()
	pc.Begin(ctx, now, now.Add(20*time.Millisecond))
	anyRead, err := pc.ReadHead(false)
	if err == nil || anyRead || !IsTimeout(err) {
		t.Fatalf("ReadHead with a silent upstream = %v, %v; want a timeout, nothing read", anyRead, err)
	}
	if pc.br != nil {
		t.Fatal("the wait for a silent upstream took a read buffer")
	}
	pc.End()

	// A whole response, then one with stray bytes after it.
	for _, tc := range []struct {
		raw      string
		reusable bool
	}{
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true},
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n", false},
	} {
		if _, err := io.WriteString(srv, tc.raw); err != nil {
			t.Fatal(err)
		}
		pc.Begin(ctx, time.Now(), time.Now().Add(5*time.Second))
		if _, err := pc.ReadHead(false); err != nil {
			t.Fatalf("ReadHead(%q): %v", tc.raw, err)
		}
		if pc.br == nil {
			t.Fatal("a response was read without a buffer")
		}
		body, err := io.ReadAll(pc.BodyReader())
		if err != nil || string(body) != "ok" {
			t.Fatalf("body = %q, %v; want ok", body, err)
		}
		pc.End()
		if pc.br != nil {
			t.Fatal("the exchange ended still holding its read buffer")
		}
		if got := pc.Reusable(); got != tc.reusable {
			t.Fatalf("Reusable after %q = %v, want %v", tc.raw, got, tc.reusable)
		}
	}
}
