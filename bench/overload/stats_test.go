package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseSpec(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Spec
	}{
		{"held:9900", Spec{"held", 9900, 1, 0}},
		{"held:30000@8", Spec{"held", 30000, 8, 0}},
		{"idle:50k@8", Spec{"idle", 50000, 8, 0}},
		{"h2:12500", Spec{"h2", 12500, 1, 0}},
		{"h3:30000", Spec{"h3", 30000, 1, 0}},
		{"nat:4000", Spec{"nat", 4000, 1, 0}},
		{"slow:19000@16", Spec{"slow", 19000, 16, 0}},
		{"slow:19000@16/100ms", Spec{"slow", 19000, 16, 100 * time.Millisecond}},
		{"nat:4000/2s", Spec{"nat", 4000, 1, 2 * time.Second}},
		{"natheld:30000@8", Spec{"natheld", 30000, 8, 0}},
		{"natheld:30k@8/2s", Spec{"natheld", 30000, 8, 2 * time.Second}},
	} {
		got, err := ParseSpec(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseSpec(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for spec, want := range map[Spec]string{
		{"idle", 50000, 8, 0}:                       "idle:50000@8",
		{"slow", 19000, 16, 100 * time.Millisecond}: "slow:19000@16/100ms",
		{"nat", 4000, 1, time.Second}:               "nat:4000/1s",
		{"natheld", 30000, 8, 0}:                    "natheld:30000@8",
	} {
		if s := spec.String(); s != want {
			t.Errorf("String = %q, want %q", s, want)
		}
	}
	for _, bad := range []string{"", "held", "held:", "held:-3", "held:0", "fast:10", "held:10@0", "held:10@x", "held:10@300",
		"held:10/1s", "slow:10/", "slow:10/0s", "slow:10/-1s", "slow:10@2/x",
		"natheld", "natheld:0@8", "natheld:10@x", "natheld:10@8/0s", "nat+held:10", "heldnat:10"} {
		if _, err := ParseSpec(bad); err == nil {
			t.Errorf("ParseSpec(%q): no error", bad)
		}
	}
}

func TestSpecKinds(t *testing.T) {
	for kind, want := range map[string][2]bool{ // holds, paced
		"held": {true, false}, "h2": {true, false}, "h3": {true, false}, "idle": {false, false},
		"nat": {false, true}, "slow": {false, true}, "natheld": {true, true},
	} {
		s := Spec{Kind: kind}
		if s.Holds() != want[0] || s.Paced() != want[1] {
			t.Errorf("%s: Holds %v, Paced %v; want %v", kind, s.Holds(), s.Paced(), want)
		}
	}
}

// A natheld row's two loads: the held requests as held:N@A's, and a NAT
// from an address no other client of the row uses.
func TestNATHeldLoads(t *testing.T) {
	spec, err := ParseSpec("natheld:30000@8/2s")
	if err != nil {
		t.Fatal(err)
	}
	held, _ := ParseSpec("held:30000@8")
	c := rowConfig{spec: spec, loadAddr: "127.0.0.1:1", fastHost: "fast.test", slowHost: "slow.test",
		fastSrc: "127.0.0.200", perProc: 4000}
	want := rowConfig{spec: held, loadAddr: c.loadAddr, fastHost: c.fastHost, slowHost: c.slowHost, perProc: 4000}.load()
	if got := c.load(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("held load %+v, want held:30000@8's %+v", got, want)
	}
	nat := c.natLoad()
	if nat.mode != "nat" || nat.host != "fast.test" || nat.path != "/" || nat.n != NATConns ||
		nat.every != 2*time.Second || fmt.Sprint(nat.srcs) != "["+NATAddr+"]" || nat.target != c.loadAddr {
		t.Errorf("NAT load %+v", nat)
	}
	// Not the held load's, the keep-alive clients' or a new visitor's
	// (127.0.1.x), nor 127.0.0.1, the held load's with one address.
	for _, a := range append(c.load().srcs, c.fastSrc, "127.0.0.1") {
		if a == NATAddr {
			t.Errorf("the NAT shares %s", a)
		}
	}
	if strings.HasPrefix(NATAddr, "127.0.1.") || Split(NATConns, c.perProc)[0] != NATConns {
		t.Errorf("the NAT: %s, %v processes", NATAddr, Split(NATConns, c.perProc))
	}
	// The other kinds' loads are as they were.
	for spec, want := range map[string]string{
		"nat:4000":  "{nat 127.0.0.1:1 fast.test / 4000 4000 [] 0}",
		"held:9900": "{held 127.0.0.1:1 slow.test /hold 9900 4000 [] 0}",
		"h2:2000":   "{h2 127.0.0.1:2 slow.test /hold 2000 0 [] 0}",
	} {
		c.spec, _ = ParseSpec(spec)
		c.tlsAddr = "127.0.0.1:2"
		if got := fmt.Sprint(c.load()); got != want {
			t.Errorf("%s: load %s, want %s", spec, got, want)
		}
	}
}

func TestNATTimes(t *testing.T) {
	var a, b NATTimes
	a.Add(20*time.Millisecond, true, false)
	a.Add(1500*time.Millisecond, true, true) // a reconnect answered late
	a.Add(3*time.Millisecond, false, true)   // a reconnect refused at once
	b.Add(2*time.Second, false, false)       // a timeout: slow, no answer
	b.Add(40*time.Millisecond, true, true)
	a.Merge(b)
	want := NATTimes{SlowestMs: 1500, Slow: 2, Reopened: 3, ReopenMaxMs: 1500, ReopenSlow: 1}
	if a != want {
		t.Errorf("NATTimes = %+v, want %+v", a, want)
	}
}

func TestSourceAddrs(t *testing.T) {
	if a := (Spec{"held", 1, 1, 0}).SourceAddrs(); a != nil {
		t.Errorf("one address: %v, want none (the kernel's 127.0.0.1)", a)
	}
	a := (Spec{"held", 1, 8, 0}).SourceAddrs()
	if len(a) != 8 || a[0] != "127.0.0.2" || a[7] != "127.0.0.9" {
		t.Errorf("eight addresses: %v", a)
	}
}

func TestSplit(t *testing.T) {
	for _, tc := range []struct{ n, per, procs int }{
		{2000, 4000, 1}, {9900, 4000, 3}, {30000, 4000, 8}, {50000, 4000, 13}, {7, 0, 1}, {0, 4000, 0},
	} {
		parts := Split(tc.n, tc.per)
		if len(parts) != tc.procs {
			t.Errorf("Split(%d, %d) = %d processes, want %d", tc.n, tc.per, len(parts), tc.procs)
		}
		sum := 0
		for _, p := range parts {
			sum += p
			if tc.per > 0 && p > tc.per {
				t.Errorf("Split(%d, %d): a process with %d", tc.n, tc.per, p)
			}
		}
		if sum != tc.n {
			t.Errorf("Split(%d, %d) sums to %d", tc.n, tc.per, sum)
		}
	}
}

func TestPercentiles(t *testing.T) {
	var ms []float64
	for i := 100; i >= 1; i-- {
		ms = append(ms, float64(i))
	}
	l := Summarise(ms)
	if l.P50 != 50 || l.P99 != 99 || l.Max != 100 {
		t.Errorf("Summarise(1..100) = %+v", l)
	}
	if ms[0] != 100 {
		t.Error("Summarise sorted its argument in place")
	}
	if l := Summarise(nil); l != (Latencies{}) {
		t.Errorf("Summarise(nil) = %+v", l)
	}
	if p := Percentile([]float64{7}, 99); p != 7 {
		t.Errorf("Percentile of one = %v", p)
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestClassify(t *testing.T) {
	op := func(err error) error {
		return &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", err)}
	}
	for _, tc := range []struct {
		err  error
		want string
	}{
		{op(syscall.ECONNREFUSED), OutRefused},
		{op(syscall.ECONNRESET), OutReset},
		{op(syscall.EPIPE), OutReset},
		{op(syscall.EADDRNOTAVAIL), OutNoPort},
		{op(syscall.EMFILE), OutClientFDs},
		{io.EOF, OutClosed},
		{fmt.Errorf("malformed HTTP response: %w", io.ErrUnexpectedEOF), OutClosed},
		{&net.OpError{Op: "read", Err: timeoutErr{}}, OutTimeout},
		{os.ErrDeadlineExceeded, OutTimeout},
		{fmt.Errorf("Get: %w", context.DeadlineExceeded), OutTimeout},
		{errors.New("http2: server sent GOAWAY and closed the connection"), OutClosed},
		{errors.New("stream error: stream ID 3; REFUSED_STREAM"), OutReset},
		{errors.New("something else"), OutError},
	} {
		if got := Classify(tc.err); got != tc.want {
			t.Errorf("Classify(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
	if got := ClassifyDial(&net.OpError{Op: "dial", Err: timeoutErr{}}); got != OutConnTimeout {
		t.Errorf("ClassifyDial(timeout) = %q", got)
	}
	if got := Classify(nil); got != "" {
		t.Errorf("Classify(nil) = %q", got)
	}
}

func TestCountsString(t *testing.T) {
	c := Counts{"503": 10, "200": 1990, OutReset: 5, "429": 3, "zz": 1, OutTimeout: 0}
	want := "200 ×1,990 · 429 ×3 · 503 ×10 · reset ×5 · zz ×1"
	if got := c.String(); got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
	if got := (Counts{}).String(); got != "none" {
		t.Errorf("empty String = %q", got)
	}
	if c.Total() != 2009 {
		t.Errorf("Total = %d", c.Total())
	}
}

func TestThousands(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 12500: "12,500", 1234567: "1,234,567", -2000: "-2,000"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestParseMetrics(t *testing.T) {
	text := `# HELP go_goroutines Number of goroutines that currently exist.
# TYPE go_goroutines gauge
go_goroutines 19981
go_gc_duration_seconds{quantile="0"} 1.2e-05
# HELP process_open_fds Number of open file descriptors.
process_open_fds 20000
process_max_fds 20000
`
	m, err := ParseMetrics(strings.NewReader(text), "go_goroutines", "process_open_fds")
	if err != nil {
		t.Fatal(err)
	}
	if m["go_goroutines"] != 19981 || m["process_open_fds"] != 20000 || len(m) != 2 {
		t.Errorf("ParseMetrics = %v", m)
	}
	if _, err := ParseMetrics(strings.NewReader("go_goroutines many\n"), "go_goroutines"); err == nil {
		t.Error("a bad value: no error")
	}
}

func TestSettled(t *testing.T) {
	// 20,000 at peak from 15: back within 16 + 2% of the excess (399).
	if !Settled(15, 15, 20000, 16) || !Settled(430, 15, 20000, 16) {
		t.Error("near the baseline: not settled")
	}
	if Settled(431, 15, 20000, 16) {
		t.Error("431 of a 20,000 peak: settled")
	}
	// No peak above the baseline: the slack alone.
	if !Settled(20, 11, 11, 32) || Settled(44, 11, 5, 32) {
		t.Error("no excess: wrong slack")
	}
}

func TestMergeReports(t *testing.T) {
	var sum ConnsReport
	sum.Merge(ConnsReport{Attempted: 4000, Outcomes: Counts{"200": 3990, OutReset: 10}, Early: Counts{OutReset: 10}})
	sum.Merge(ConnsReport{Attempted: 1000, Open: 2, Outcomes: Counts{"200": 1000}, OpenAtRelease: 998, ClosedEarly: 2,
		NAT: NATTimes{SlowestMs: 7, Reopened: 3}})
	if sum.Attempted != 5000 || sum.Outcomes["200"] != 4990 || sum.Early.Total() != 10 ||
		sum.OpenAtRelease != 998 || sum.ClosedEarly != 2 || sum.Open != 2 ||
		sum.NAT != (NATTimes{SlowestMs: 7, Reopened: 3}) {
		t.Errorf("Merge = %+v", sum)
	}
}

func TestProcFS(t *testing.T) {
	dir := t.TempDir()
	write := func(rel, s string) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// nginx: a master (100) and two workers; an unrelated process; a name
	// with spaces and parentheses.
	write("100/stat", "100 (nginx) S 1 100 100 0")
	write("101/stat", "101 (nginx: worker (x) 1) S 100 100 100 0")
	write("102/stat", "102 (nginx) S 100 100 100 0")
	write("200/stat", "200 (other) S 1 200 200 0")
	write("100/status", "Name:\tnginx\nState:\tS (sleeping)\nVmRSS:\t    1000 kB\n")
	write("101/status", "Name:\tnginx\nState:\tS (sleeping)\nVmRSS:\t    2000 kB\n")
	write("102/status", "Name:\tnginx\nState:\tZ (zombie)\n")
	for pid, n := range map[int]int{100: 3, 101: 5, 102: 0, 200: 7} {
		if err := os.MkdirAll(filepath.Join(dir, fmt.Sprint(pid), "fd"), 0o755); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			write(filepath.Join(fmt.Sprint(pid), "fd", fmt.Sprint(i)), "")
		}
	}
	p := procFS{Dir: dir}
	tree, err := p.Tree(100)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(tree) != "[100 101 102]" {
		t.Errorf("Tree = %v", tree)
	}
	if n := p.FDs(tree); n != 8 {
		t.Errorf("FDs = %d, want 8", n)
	}
	if k := p.RSSKiB(tree); k != 3000 {
		t.Errorf("RSSKiB = %d, want 3000", k)
	}
	if !p.Alive(100) || p.Alive(102) || p.Alive(999) {
		t.Error("Alive: wrong")
	}
}
