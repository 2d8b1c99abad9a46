package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ---------------------------------------------------------------- rows

// Spec is one row of the table: what load is put on slow.test (held
// requests, each on its own HTTP/1.1 connection, or HTTP/2 or HTTP/3
// streams, 100 to a connection) or on fast.test (idle keep-alive
// connections, browsers behind a NAT asking once a second, connections
// trickling their headers), from how many client addresses. A natheld row
// is both at once: the held requests of held:N@A and, beside them, the
// browsers of nat:NATConns from NATAddr.
type Spec struct {
	Kind  string // "held", "idle", "h2", "h3", "nat", "natheld" or "slow"
	N     int    // held requests, idle, NAT or slow connections, h2 or h3 streams
	Addrs int    // client source addresses: 1 is 127.0.0.1, 8 is 127.0.0.2..9
	// Every is, for nat, natheld (its NAT) and slow, the time between a
	// connection's requests or header bytes; 0: the load's default, a
	// second.
	Every time.Duration
}

// The NAT of a natheld row: as many browsers as the nat:4000 row, behind
// one address of their own, which no held load (127.0.0.1 .. 127.0.0.251),
// keep-alive client of fast.test (127.0.0.200) or new visitor (127.0.1.x)
// uses, so that a limit per client address sees the NAT apart from the
// attack.
const (
	NATConns = 4000
	NATAddr  = "127.0.2.1"
)

// String is the spec as written on the command line: held:9900,
// idle:50000@8, slow:19000@16/100ms.
func (s Spec) String() string {
	out := fmt.Sprintf("%s:%d", s.Kind, s.N)
	if s.Addrs > 1 {
		out += fmt.Sprintf("@%d", s.Addrs)
	}
	if s.Every > 0 {
		out += "/" + s.Every.String()
	}
	return out
}

// Holds reports whether the spec's load is requests held by slow.test
// (rather than connections to fast.test).
func (s Spec) Holds() bool {
	return s.Kind == "held" || s.Kind == "h2" || s.Kind == "h3" || s.Kind == "natheld"
}

// Paced reports whether the spec's kind takes an interval (/EVERY): the
// browsers of nat and natheld, the trickle of slow.
func (s Spec) Paced() bool { return s.Kind == "nat" || s.Kind == "natheld" || s.Kind == "slow" }

// ParseSpec reads KIND:N[@ADDRS][/EVERY]; N may be written 30000 or 30k,
// and EVERY (nat, natheld and slow only) is a duration:
// slow:19000@16/100ms. In natheld:N@A, N and A are the held load's: the
// NAT beside it is always NATConns browsers from NATAddr.
func ParseSpec(s string) (Spec, error) {
	s, everyText, hasEvery := strings.Cut(s, "/")
	var every time.Duration
	if hasEvery {
		var err error
		if every, err = time.ParseDuration(everyText); err != nil || every <= 0 {
			return Spec{}, fmt.Errorf("row %q: interval %q is not a positive duration", s, everyText)
		}
	}
	kind, rest, ok := strings.Cut(s, ":")
	if !ok {
		return Spec{}, fmt.Errorf("row %q: want KIND:N[@ADDRS] (held:9900, idle:50000@8, h2:12500)", s)
	}
	switch kind {
	case "held", "idle", "h2", "h3", "nat", "natheld", "slow":
	default:
		return Spec{}, fmt.Errorf("row %q: kind %q is not held, idle, h2, h3, nat, natheld or slow", s, kind)
	}
	num, addrs, hasAddrs := strings.Cut(rest, "@")
	n, err := parseCount(num)
	if err != nil || n <= 0 {
		return Spec{}, fmt.Errorf("row %q: count %q is not a positive number", s, num)
	}
	a := 1
	if hasAddrs {
		a, err = strconv.Atoi(addrs)
		// 127.0.0.2 .. 127.0.0.(1+a), all on loopback.
		if err != nil || a < 1 || a > 250 {
			return Spec{}, fmt.Errorf("row %q: addresses %q is not 1..250", s, addrs)
		}
	}
	spec := Spec{Kind: kind, N: n, Addrs: a, Every: every}
	if hasEvery && !spec.Paced() {
		return Spec{}, fmt.Errorf("row %q: only nat, natheld and slow rows take an interval", s)
	}
	return spec, nil
}

func parseCount(s string) (int, error) {
	mult := 1
	if strings.HasSuffix(s, "k") {
		mult, s = 1000, strings.TrimSuffix(s, "k")
	}
	n, err := strconv.Atoi(s)
	return n * mult, err
}

// SourceAddrs are the client addresses of a spec: none (the kernel picks
// 127.0.0.1) for one, else 127.0.0.2 onwards.
func (s Spec) SourceAddrs() []string {
	if s.Addrs <= 1 {
		return nil
	}
	out := make([]string, s.Addrs)
	for i := range out {
		out[i] = fmt.Sprintf("127.0.0.%d", i+2)
	}
	return out
}

// Split spreads n over the fewest processes that each hold at most per:
// every load process stays well below the descriptor limit.
func Split(n, per int) []int {
	if n <= 0 {
		return nil
	}
	if per <= 0 {
		per = n
	}
	k := (n + per - 1) / per
	out := make([]int, k)
	for i := range out {
		out[i] = n / k
		if i < n%k {
			out[i]++
		}
	}
	return out
}

// ------------------------------------------------------------ latencies

// Percentile is the p-th percentile (0..100) of sorted values, nearest
// rank; 0 for none.
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	r := int(math.Ceil(p / 100 * float64(len(sorted))))
	r = min(max(r, 1), len(sorted))
	return sorted[r-1]
}

// Latencies summarises a set of request durations in milliseconds.
type Latencies struct {
	P50, P99, Max float64
}

func Summarise(ms []float64) Latencies {
	s := slices.Clone(ms)
	slices.Sort(s)
	var l Latencies
	if len(s) > 0 {
		l = Latencies{P50: Percentile(s, 50), P99: Percentile(s, 99), Max: s[len(s)-1]}
	}
	return l
}

// ------------------------------------------------------------- outcomes

// Outcome names, as counted and printed. A status code is its number.
const (
	OutRefused     = "refused"      // connect: ECONNREFUSED
	OutConnTimeout = "conn-timeout" // connect did not finish in time (SYN dropped: accept queue full)
	OutReset       = "reset"        // ECONNRESET / EPIPE after connecting
	OutClosed      = "closed"       // EOF before a complete response
	OutTimeout     = "timeout"      // no response within the request's time
	OutNoPort      = "no-port"      // EADDRNOTAVAIL: the client ran out of local ports (not the proxy's doing)
	OutClientFDs   = "client-fds"   // EMFILE in the load process (a bench fault)
	OutError       = "error"        // anything else (see the log)
	OutNotH2       = "not-h2"       // an h2 row's connection did not negotiate h2
	OutOpen        = "open"         // slow: still open when the load was released
)

// isStatus reports whether an outcome is an answer's status code (rather
// than a failure below HTTP).
func isStatus(outcome string) bool {
	_, err := strconv.Atoi(outcome)
	return err == nil
}

// Classify names what a failed connection attempt or read saw.
func Classify(err error) string {
	if err == nil {
		return ""
	}
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return OutRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.ECONNABORTED):
		return OutReset
	case errors.Is(err, syscall.EADDRNOTAVAIL), errors.Is(err, syscall.EADDRINUSE):
		return OutNoPort
	case errors.Is(err, syscall.EMFILE), errors.Is(err, syscall.ENFILE):
		return OutClientFDs
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed):
		return OutClosed
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return OutTimeout
	}
	// HTTP/2 clients report a peer's RST_STREAM or GOAWAY as text.
	msg := err.Error()
	switch {
	case strings.Contains(msg, "stream error"), strings.Contains(msg, "RST_STREAM"),
		strings.Contains(msg, "connection reset"):
		return OutReset
	case strings.Contains(msg, "GOAWAY"), strings.Contains(msg, "server closed"),
		strings.Contains(msg, "EOF"):
		return OutClosed
	case strings.Contains(msg, "timeout"), strings.Contains(msg, "deadline exceeded"):
		return OutTimeout
	}
	return OutError
}

// ClassifyDial is Classify for a connect: a timeout there means the
// connection was never accepted, which differs from a request left
// unanswered.
func ClassifyDial(err error) string {
	c := Classify(err)
	if c == OutTimeout {
		return OutConnTimeout
	}
	return c
}

// Counts is how many of something ended each way.
type Counts map[string]int

func (c Counts) Add(o Counts) {
	for k, v := range o {
		c[k] += v
	}
}

func (c Counts) Total() int {
	n := 0
	for _, v := range c {
		n += v
	}
	return n
}

// outcomeOrder: statuses first (200, then the rest by number), then the
// failures below HTTP in a fixed order.
var outcomeOrder = []string{OutRefused, OutConnTimeout, OutReset, OutClosed, OutTimeout, OutNotH2, OutOpen, OutNoPort, OutClientFDs, OutError}

// String renders non-zero counts: "200 ×1,990 · 503 ×10 · reset ×5".
func (c Counts) String() string {
	var status []string
	for k, v := range c {
		if v == 0 {
			continue
		}
		if isStatus(k) {
			status = append(status, k)
		}
	}
	slices.SortFunc(status, func(a, b string) int {
		if a == "200" {
			return -1
		}
		if b == "200" {
			return 1
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, k := range status {
		parts = append(parts, k+" ×"+thousands(c[k]))
	}
	for _, k := range outcomeOrder {
		if c[k] > 0 {
			parts = append(parts, k+" ×"+thousands(c[k]))
		}
	}
	// Anything else, so nothing counted is hidden.
	var other []string
	for k, v := range c {
		if v == 0 || slices.Contains(status, k) || slices.Contains(outcomeOrder, k) {
			continue
		}
		other = append(other, k)
	}
	slices.Sort(other)
	for _, k := range other {
		parts = append(parts, k+" ×"+thousands(c[k]))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, " · ")
}

// thousands writes n with commas: 12,500.
func thousands(n int) string {
	s := strconv.Itoa(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, r := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(r)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// ------------------------------------------------------------- metrics

// ParseMetrics reads the named unlabelled gauges from Prometheus text
// exposition (scafo-edge's admin /metrics): go_goroutines,
// process_open_fds. Names absent from the text are absent from the map.
func ParseMetrics(r io.Reader, names ...string) (map[string]float64, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 || !want[f[0]] {
			continue
		}
		v, err := strconv.ParseFloat(f[1], 64)
		if err != nil {
			return out, fmt.Errorf("metric %s: value %q: %w", f[0], f[1], err)
		}
		out[f[0]] = v
	}
	return out, sc.Err()
}

// ------------------------------------------------------------ recovery

// Settled reports whether value is back to its baseline after a peak:
// within 16 (descriptors) or 32 (goroutines, slack) of base plus 2% of the
// peak's excess over it. A proxy that keeps a few pooled connections, or
// whose collector has not yet run, still counts as back; one that keeps a
// share of what the load made it open does not.
func Settled(value, base, peak, slack int) bool {
	excess := max(peak-base, 0)
	return value <= base+slack+excess/50
}

// Elapsed formats a duration in seconds with one decimal, "—" when negative
// (not measured).
func Elapsed(d time.Duration) string {
	if d < 0 {
		return "—"
	}
	return strconv.FormatFloat(d.Seconds(), 'f', 1, 64)
}
