package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// listen serves h on a loopback port for the test's life.
func listen(t *testing.T, h http.Handler) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// runConns runs one load process in-process: it waits for "ready", calls
// atReady, sends "release", and returns the ready and result lines.
func runConns(t *testing.T, args []string, atReady func(ConnsReport)) (ready, result ConnsReport) {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		err := connsCmd(args, inR, outW)
		outW.Close()
		errc <- err
	}()
	sc := bufio.NewScanner(outR)
	for sc.Scan() {
		var rep ConnsReport
		if err := json.Unmarshal(sc.Bytes(), &rep); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		switch rep.Event {
		case "ready":
			ready = rep
			if atReady != nil {
				atReady(rep)
			}
			io.WriteString(inW, "release\n")
			inW.Close()
		case "result":
			result = rep
		}
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return ready, result
}

// The held application holds until released, then answers 200 with
// Connection: close; the load process counts each request's end.
func TestHeldRequestsReleased(t *testing.T) {
	a := &apps{released: make(chan struct{}), maxHold: time.Minute}
	slow := listen(t, http.HandlerFunc(a.serveSlow))
	control := listen(t, a.control())
	ready, res := runConns(t, []string{"-mode", "held", "-target", slow, "-n", "20", "-timeout", "20s"},
		func(ConnsReport) {
			// Every request reaches the application and is held there.
			deadline := time.Now().Add(5 * time.Second)
			for a.held.Load() < 20 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			s, err := appStats([]string{control})
			if err != nil || s.Held != 20 {
				t.Errorf("held at the app before the release: %+v, %v", s, err)
			}
			if err := appRelease([]string{control}); err != nil {
				t.Error(err)
			}
		})
	if ready.Attempted != 20 {
		t.Errorf("ready: %+v", ready)
	}
	if res.Outcomes["200"] != 20 || res.Outcomes.Total() != 20 {
		t.Errorf("outcomes: %v", res.Outcomes)
	}
	s, _ := appStats([]string{control})
	if s.Answered != 20 || s.PeakHeld != 20 {
		t.Errorf("app stats after: %+v", s)
	}
	// After the release the slow application answers at once.
	resp, err := http.Get("http://" + slow + "/again")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !resp.Close {
		t.Errorf("after the release: %d, close %v", resp.StatusCode, resp.Close)
	}
}

// Idle connections: one answer each, then open and silent until the
// release; a connection the server drops before it counts as closed early.
func TestIdleConnections(t *testing.T) {
	a := &apps{released: make(chan struct{}), maxHold: time.Minute}
	fast := listen(t, http.HandlerFunc(a.serveFast))
	ready, res := runConns(t, []string{"-mode", "idle", "-target", fast, "-host", "fast.test", "-path", "/", "-n", "10", "-timeout", "20s"}, nil)
	if ready.Attempted != 10 || ready.Open != 10 {
		t.Errorf("ready: %+v", ready)
	}
	if res.Outcomes["200"] != 10 || res.OpenAtRelease != 10 || res.ClosedEarly != 0 {
		t.Errorf("result: %+v", res)
	}
}

// Browsers behind a NAT: every connection asks every -interval until the
// release, and one the server closes after each answer is opened again;
// every request is counted, none failed.
func TestNATConnections(t *testing.T) {
	a := &apps{released: make(chan struct{}), maxHold: time.Minute}
	keep := listen(t, http.HandlerFunc(a.serveFast))
	closing := listen(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		a.serveFast(w, r)
	}))
	for _, target := range []string{keep, closing} {
		_, res := runConns(t, []string{"-mode", "nat", "-target", target, "-host", "fast.test", "-path", "/",
			"-n", "5", "-interval", "50ms", "-timeout", "20s"}, func(ConnsReport) { time.Sleep(300 * time.Millisecond) })
		if res.Outcomes["200"] < 10 || res.Outcomes.Total() != res.Outcomes["200"] {
			t.Errorf("%s: outcomes %v, want only 200s, at least two a connection", target, res.Outcomes)
		}
		// Timed: every request but each browser's first comes on a
		// reopened connection when the server closes them, none when it
		// keeps them.
		reopened := 0
		if target == closing {
			reopened = res.Outcomes.Total() - 5
		}
		if n := res.NAT; n.SlowestMs <= 0 || n.Reopened != reopened || (reopened > 0) != (n.ReopenMaxMs > 0) {
			t.Errorf("%s: times %+v, want %d reopened", target, n, reopened)
		}
	}
}

// Slow headers: a server's header timeout ends each connection, counted
// as it ended, and the load opens another until the release.
func TestSlowHeaders(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.NotFoundHandler(), ReadHeaderTimeout: 100 * time.Millisecond}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	ready, res := runConns(t, []string{"-mode", "slow", "-target", ln.Addr().String(), "-host", "fast.test",
		"-n", "3", "-interval", "20ms", "-timeout", "20s"}, func(ConnsReport) { time.Sleep(time.Second) })
	if ready.Attempted != 3 {
		t.Errorf("ready: %+v", ready)
	}
	if ended := res.Outcomes.Total() - res.Outcomes[OutOpen]; ended < 6 {
		t.Errorf("outcomes %v: want every connection ended by the header timeout and reopened, at least twice each", res.Outcomes)
	}
}

// A port nobody listens on: every connection refused, and said so.
func TestRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, res := runConns(t, []string{"-mode", "held", "-target", addr, "-n", "5", "-timeout", "5s"}, nil)
	if res.Outcomes[OutRefused] != 5 || res.Early[OutRefused] != 5 {
		t.Errorf("result: %+v", res)
	}
}

func TestConnsRefusesNonLoopback(t *testing.T) {
	for _, args := range [][]string{
		{"-target", "192.0.2.1:80", "-n", "1"},
		{"-target", "127.0.0.1:80", "-n", "1", "-src", "10.0.0.1"},
	} {
		if err := connsCmd(args, strings.NewReader(""), io.Discard); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}

func TestReportMarkdown(t *testing.T) {
	rows := []Row{
		{Proxy: "scafo-edge", Row: "held:12500", Kind: "held", N: 12500, FDPeak: 20000,
			RSSPeakKiB: 306 * 1024, RSSAfterKiB: 412 * 1024, FastFailed: 4, FastFailures: Counts{OutTimeout: 4},
			BaseP99Ms: 2.34, FastAttackServed: 150000, FastAttackFailed: 4, FastAttackP99Ms: 11.7, NewTotal: 20, AdminTotal: 4, Outcomes: Counts{"200": 11594, "502": 906},
			Early: Counts{"502": 906}, AppHeld: 9992, RecoverySeconds: 1.5,
			GoroutinesBase: 11, GoroutinesPeak: 19981, GoroutinesAfter: 11},
		{Proxy: "nginx", Row: "idle:19000", Kind: "idle", N: 19000, FDPeak: 8200, FastServed: 40000,
			FastP50Ms: 0.3, FastP99Ms: 3.1, FastMaxMs: 120, NewOK: 0, NewTotal: 20,
			Outcomes: Counts{"200": 8000, OutConnTimeout: 11000}, OpenAtRelease: 8000, RecoverySeconds: -1,
			Notes: []string{"the ramp ended"}},
		{Proxy: "traefik", Row: "idle:50000@8", Status: "skipped", Note: "did not build"},
		{Proxy: "scafo-edge", Row: "natheld:30000@8", Kind: "natheld", N: 30000, Addrs: 8, AppHeld: 7125,
			Outcomes: Counts{"200": 7125, "503": 22875}, Early: Counts{"503": 22875}, RecoverySeconds: 1,
			NATOutcomes: Counts{"200": 39000, OutReset: 900, "429": 100},
			NAT:         &NATTimes{SlowestMs: 1200, Slow: 3, Reopened: 1000, ReopenMaxMs: 1200, ReopenSlow: 3}},
		{Proxy: "scafo-edge", Row: "nat:4000", Kind: "nat", N: 4000, Outcomes: Counts{"200": 36000},
			NAT: &NATTimes{SlowestMs: 25.5}, RecoverySeconds: 0},
	}
	var buf bytes.Buffer
	for _, r := range rows {
		b, _ := json.Marshal(r)
		buf.Write(append(b, '\n'))
	}
	got, err := ReadRows(&buf)
	if err != nil || len(got) != len(rows) {
		t.Fatalf("ReadRows: %d rows, %v", len(got), err)
	}
	md := Markdown(Report{Versions: map[string]string{"nginx": "1.22.1"}, Settings: map[string]string{"window": "8s"}, Rows: got})
	for _, want := range []string{
		"Versions: nginx 1.22.1.",
		"Settings: window 8s.",
		"| scafo-edge | held:12500 | 20,000 | 306 → 412 | 0 / 4 (timeout ×4) | 0.00 / 0.00 / 0.00 | 2.34 | 11.7 (5.0×); 4 of 150,004 failed | 0/20 | 0/4 | 200 ×11,594 · 502 ×906 (906 before the release) | 9,992 | 1.5 (goroutines 11 → 19,981 → 11) |",
		"| nginx | idle:19000 (1) | 8,200 | 0 → 0 | 40,000 / 0 | 0.30 / 3.10 / 120 | 0.00 | — | 0/20 | — | 200 ×8,000 · conn-timeout ×11,000; open at release 8,000 | — | no (fds 0 → 0) |",
		"| traefik | idle:50000@8 | skipped (2) |",
		"1. nginx, idle:19000: the ramp ended",
		"2. traefik, idle:50000@8: did not build",
		"| 200 ×7,125 · 503 ×22,875 (22,875 before the release); NAT 127.0.2.1: 1,000 failed of 40,000: 200 ×39,000 · 429 ×100 · reset ×900; slowest 1200 ms, 3 over 1 s; reconnected 1,000, connect to answer max 1200 ms, 3 over 1 s | 7,125 | 1.0 |",
		"| 0 failed of 36,000: 200 ×36,000; slowest 25.5 ms; none reconnected | — | 0.0 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("table lacks %q:\n%s", want, md)
		}
	}
}
