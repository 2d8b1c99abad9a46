package main

import (
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestFastBetween(t *testing.T) {
	t0 := time.Now()
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	samples := []fastSample{
		{start: at(0), ms: 1},
		{start: at(500), fail: OutTimeout},
		{start: at(999), ms: 9000}, // started before the window, ended in it
		{start: at(1000), ms: 2},   // the window's first instant
		{start: at(1500), fail: "503"},
		{start: at(1500), fail: "503"},
		{start: at(1999), ms: 3},
		{start: at(2000), ms: 4}, // the window's end: out
	}
	win := fastBetween(samples, at(1000), at(2000))
	if win.served != 2 || win.failed != 2 || win.failures["503"] != 2 || len(win.failures) != 1 {
		t.Errorf("window: %+v", win)
	}
	if l := Summarise(win.ms); l.Max != 3 {
		t.Errorf("window latencies %v, want the max 3", win.ms)
	}
	all := fastBetween(samples, at(0), at(2000))
	if all.served != 4 || all.failed != 3 || all.failures[OutTimeout] != 1 || all.failures["503"] != 2 {
		t.Errorf("attack: %+v", all)
	}
	if l := Summarise(all.ms); l.Max != 9000 {
		t.Errorf("attack latencies %v, want the max 9000", all.ms)
	}
	if none := fastBetween(nil, at(0), at(1)); none.served+none.failed != 0 || none.failures == nil {
		t.Errorf("no samples: %+v", none)
	}
}

// At reconnect a client stuck in a request asks again at once, on a new
// connection, rather than wait for it; the stuck request is counted where
// it started, before the window, and its connection closed once it ends.
func TestFastClientsReconnect(t *testing.T) {
	const clients = 2
	var asked atomic.Int64
	stuck := make(chan struct{}, clients)
	release := make(chan struct{})
	var mu sync.Mutex
	conns := map[http.ConnState]int{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if asked.Add(1) <= clients { // each client's first
				stuck <- struct{}{}
				<-release
			}
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			mu.Lock()
			conns[s]++
			mu.Unlock()
		},
	}
	go srv.Serve(ln)
	defer srv.Close()

	f := startFast("http://"+ln.Addr().String()+"/", "fast.test", "", clients, 5*time.Second)
	for range clients {
		select {
		case <-stuck:
		case <-time.After(5 * time.Second):
			f.stopAt(time.Now())
			t.Fatal("the clients' first requests did not arrive")
		}
	}
	f.reconnect()
	windowStart := time.Now()
	windowEnd := windowStart.Add(300 * time.Millisecond)
	f.stopAt(windowEnd)
	time.Sleep(150 * time.Millisecond)
	releasedAt := time.Now()
	close(release)
	samples := f.wait()

	before := fastBetween(samples, time.Time{}, windowStart)
	if before.served != clients || before.failed != 0 {
		t.Errorf("before the window: %+v, want the %d stuck requests served", before, clients)
	}
	for _, v := range before.ms {
		if v < 150 {
			t.Errorf("a stuck request took %.1f ms, less than it was held", v)
		}
	}
	win := fastBetween(samples, windowStart, windowEnd)
	if win.failed != 0 {
		t.Errorf("window: %d failed (%v)", win.failed, win.failures)
	}
	servedEarly := 0
	for _, s := range samples {
		if !s.start.Before(windowStart) && s.start.Before(releasedAt) {
			servedEarly++
		}
	}
	if servedEarly < clients {
		t.Errorf("%d requests started in the window before the stuck ones ended, want at least %d", servedEarly, clients)
	}
	if n := len(samples) - before.served - win.served; n != 0 {
		t.Errorf("%d requests outside both spans", n)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		mu.Lock()
		opened, closed := conns[http.StateNew], conns[http.StateClosed]
		mu.Unlock()
		if opened == 2*clients && closed == opened {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("connections opened %d, closed %d; want %d both", opened, closed, 2*clients)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
