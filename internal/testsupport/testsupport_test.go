package testsupport

import (
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestPoll(t *testing.T) {
	var n atomic.Int32
	if !Poll(5*time.Second, func() bool { return n.Add(1) >= 3 }) {
		t.Fatal("Poll gave up on a condition that held on its third check")
	}
	if Poll(20*time.Millisecond, func() bool { return false }) {
		t.Fatal("Poll reported a condition that never held")
	}
}

func TestWaitForNilReportsLastError(t *testing.T) {
	err := pollErr(20*time.Millisecond, func() error { return errors.New("still 503") })
	if err == nil || err.Error() != "still 503" {
		t.Fatalf("pollErr = %v, want the condition's last error", err)
	}
}

func TestLogEntries(t *testing.T) {
	var b SyncBuffer
	b.Write([]byte(`{"level":"info","message":"poll failed: node down"}` + "\n"))
	b.Write([]byte("panic: not json\n"))
	b.Write([]byte(`{"level":"info","message":"poll recovered"}` + "\n"))
	if got := len(b.LogEntries("poll")); got != 2 {
		t.Errorf("LogEntries(poll) = %d entries, want 2", got)
	}
	if got := b.LogEntries("recovered"); len(got) != 1 || got[0]["level"] != "info" {
		t.Errorf("LogEntries(recovered) = %v", got)
	}
	b.Reset()
	if b.String() != "" {
		t.Errorf("after Reset: %q", b.String())
	}
}

func TestMetricValueAndScrapeValue(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_total", Help: "x"}, []string{"node", "result"})
	reg.MustRegister(c)
	c.WithLabelValues("a", "ok").Add(3)
	c.WithLabelValues("b", "ok").Add(5)

	if v, ok := MetricValue(t, reg, "x_total", Labels{"node": "b"}); !ok || v != 5 {
		t.Errorf("MetricValue(node=b) = %v, %v; want 5, true", v, ok)
	}
	if _, ok := MetricValue(t, reg, "x_total", Labels{"node": "c"}); ok {
		t.Error("MetricValue found a series that does not exist")
	}
	text := "# TYPE x_total counter\nx_total{node=\"a\",result=\"ok\"} 3\nx_total{node=\"b\",result=\"ok\"} 5\n"
	if v, ok := ScrapeValue(t, text, "x_total", Labels{"node": "a", "result": "ok"}); !ok || v != 3 {
		t.Errorf("ScrapeValue(node=a) = %v, %v; want 3, true", v, ok)
	}
	if _, err := ParseScrape("x_total{node=\"a\" 3\n"); err == nil {
		t.Error("ParseScrape accepted a malformed line")
	}
}

func TestClosedAddrRefusesConnections(t *testing.T) {
	addr := ClosedAddr(t)
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatalf("dial %s succeeded, want refused", addr)
	}
	if p := FreePort(t); p <= 0 || p > 65535 {
		t.Fatalf("FreePort() = %d, want a port number", p)
	}
}

func TestMust(t *testing.T) {
	if got := Must(3, nil); got != 3 {
		t.Errorf("Must(3, nil) = %d", got)
	}
	defer func() {
		if recover() == nil {
			t.Error("Must with an error did not panic")
		}
	}()
	Must(0, errors.New("boom"))
}

// A process handed two ports for two listeners must get two: the kernel
// may give one free port to two binds in a row. (A few dozen, as a test
// asks for: bind(0) hands out a few thousand ports in all.)
func TestFreeAddrNeverReturnsAPortTwice(t *testing.T) {
	seen := make(map[string]bool)
	for range 25 {
		for _, addr := range []string{FreeAddr(t), FreeUDPAndTCPAddr(t)} {
			if seen[addr] {
				t.Fatalf("%s returned twice", addr)
			}
			seen[addr] = true
		}
	}
}

// The ports FreeAddr returns are below the kernel's ephemeral range, where
// no bind(0) or outgoing connection of another test takes them.
func TestFreeAddrIsBelowTheEphemeralPorts(t *testing.T) {
	lo, hi := freePorts()
	for range 25 {
		for _, addr := range []string{FreeAddr(t), FreeUDPAndTCPAddr(t)} {
			_, p, _ := net.SplitHostPort(addr)
			port, err := strconv.Atoi(p)
			if err != nil || port < lo || port >= hi {
				t.Fatalf("%s: port not in [%d, %d)", addr, lo, hi)
			}
		}
	}
	// An outgoing connection's port is never one of them.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if port := l.Addr().(*net.TCPAddr).Port; port >= lo && port < hi {
		t.Errorf("bind(0) gave %d, inside FreeAddr's ports [%d, %d)", port, lo, hi)
	}
}
