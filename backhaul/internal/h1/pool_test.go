package h1

import (
	"context"
	"net"
	"testing"
	"time"
)

func TestPoolReusesAConnectionIdlePastItsReadDeadline(t *testing.T) {
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
	p := NewPool(time.Second, time.Minute, 0, 4, nil)
	defer p.CloseIdle()
	ctx, addr := context.Background(), ln.Addr().String()
	pc, reused, err := p.Get(ctx, addr, time.Now())
	if err != nil || reused {
		t.Fatalf("first Get = reused %v, %v, want a new connection", reused, err)
	}
	select {
	case srv := <-accepted:
		defer srv.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream never accepted the connection")
	}
	// Age the idle connection instead of waiting for it to age: a passed
	// deadline must not fail the peek before reuse.
	long := time.Now().Add(-time.Minute)
	pc.rd.arm(long)
	p.Put(pc, long)
	got, reused, err := p.Get(ctx, addr, time.Now())
	if err != nil || !reused || got != pc {
		t.Fatalf("Get after the deadline passed = reused %v, same %v, %v; want the idle connection", reused, got == pc, err)
	}
	got.NC.Close()
}
