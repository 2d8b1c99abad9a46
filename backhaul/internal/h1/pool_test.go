package h1

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/scafo/scafo-edge/internal/testsupport"
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
	defer p.CloseIdle(0)
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

func TestPoolClosesIdleConnectionsBeyondTheSixteenNewestAfterTheSurplusTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	const surplus = 4
	const n = warmIdle + surplus
	accepted := make(chan net.Conn, n)
	go func() {
		for range n {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	// The idle timeout is a minute: only the surplus rule closes anything
	// within this test.
	p := NewPool(time.Second, time.Minute, 0, 100, nil)
	defer p.CloseIdle(0)
	ctx, addr := context.Background(), ln.Addr().String()
	var conns []*Conn
	upstream := map[string]net.Conn{} // the upstream's side, by the pool's local address
	for range n {
		pc, err := p.Dial(ctx, addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, pc)
		select {
		case srv := <-accepted:
			defer srv.Close()
			upstream[srv.RemoteAddr().String()] = srv
		case <-time.After(5 * time.Second):
			t.Fatal("the upstream never accepted a connection")
		}
	}
	idleFrom := time.Now()
	for _, pc := range conns {
		p.Put(pc, time.Now())
	}
	testsupport.WaitFor(t, 10*time.Second, "the connections beyond the 16 newest to be closed", func() bool {
		return p.IdleCount(addr) <= warmIdle
	})
	if waited := time.Since(idleFrom); waited < surplusIdleTimeout {
		t.Errorf("surplus connections closed %v after they went idle, before surplusIdleTimeout %v", waited, surplusIdleTimeout)
	}
	if got := p.IdleCount(addr); got != warmIdle {
		t.Fatalf("IdleCount = %d, want the %d newest kept", got, warmIdle)
	}
	for i, pc := range conns[:surplus] {
		srv := upstream[pc.NC.LocalAddr().String()]
		srv.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := srv.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Errorf("surplus connection %d (of the oldest): the upstream read %v, want the pool's close", i+1, err)
		}
	}
	// The 16 newest are still there, most recently used first.
	for i := range warmIdle {
		want := conns[n-1-i]
		got, reused, err := p.Get(ctx, addr, time.Now())
		if err != nil || !reused || got != want {
			t.Fatalf("Get %d = reused %v, the %d-th newest %v, %v; want the idle connections newest first", i+1, reused, i+1, got == want, err)
		}
		got.NC.Close()
	}
}

// Under pressure the edge gives back the descriptors of connections idle for
// a while, not those its traffic reuses at once (closing them would have
// every request dial again and free nothing).
func TestPoolCloseIdleClosesOnlyThoseIdleLongEnough(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	p := NewPool(time.Second, time.Minute, 0, 100, nil)
	defer p.CloseIdle(0)
	ctx, addr := context.Background(), ln.Addr().String()
	now := time.Now()
	var conns []*Conn
	for i, idleAt := range []time.Time{now.Add(-3 * time.Second), now.Add(-2 * time.Second), now} {
		pc, err := p.Dial(ctx, addr)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns = append(conns, pc)
		p.Put(pc, idleAt)
	}
	p.CloseIdle(time.Second)
	if got := p.IdleCount(addr); got != 1 {
		t.Fatalf("IdleCount after CloseIdle(1s) = %d, want 1 (the one idle since now)", got)
	}
	for i, pc := range conns[:2] {
		if _, err := pc.NC.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
			t.Errorf("connection %d, idle past 1s: write = %v, want it closed", i, err)
		}
	}
	if got, reused, err := p.Get(ctx, addr, time.Now()); err != nil || !reused || got != conns[2] {
		t.Fatalf("Get after CloseIdle(1s) = reused %v, same %v, %v; want the recent one", reused, got == conns[2], err)
	}
	p.Put(conns[2], time.Now())
	p.CloseIdle(0)
	if got := p.IdleCount(addr); got != 0 {
		t.Errorf("IdleCount after CloseIdle(0) = %d, want 0", got)
	}
}
