package testsupport

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// ClosedAddr returns a loopback TCP address that refuses connections for
// the whole test: an upstream that is down. A socket is bound to it and
// never listens, so that no listener (another test's, another package's
// running beside it) takes the port meanwhile: a port that was only free
// for a moment was taken at times by a server that then never answered,
// and a request meant to be refused at once hung for the client's timeout.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatalf("socket: %v", err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatalf("bind a loopback port: %v", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatalf("getsockname: %v", err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
}

// FreeAddr returns a loopback TCP address nothing listens on right now, to
// hand a process that must know it before it starts. Another process may
// take the port later; a test that needs it kept should hold a listener.
// The port is below the kernel's ephemeral range (freePorts): bind(0) and
// every outgoing connection take theirs from that range, and a port found
// there was at times taken, between the probe and the server's bind, by
// another test's socket (a client bound to 127.0.0.2, say, when the server
// was to bind 127.0.0.2 too). No port is returned twice while the test
// that asked for it runs: a process given one port for two of its
// listeners fails to start.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return freeAddr(t, "find a free loopback port", func(addr string) bool {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return false
		}
		l.Close()
		return true
	})
}

// freeAddr returns a loopback address on a port of freePorts that free
// reports free and no test running holds.
func freeAddr(t testing.TB, what string, free func(addr string) bool) string {
	t.Helper()
	lo, hi := freePorts()
	for range 1000 {
		port := lo + rand.IntN(hi-lo)
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		if free(addr) && freeGiven.claim(t, port) {
			return addr
		}
	}
	t.Fatalf("%s: none in 1000 tries between %d and %d", what, lo, hi)
	return ""
}

// freePorts is where FreeAddr looks: the 12,000 ports below the kernel's
// ephemeral range (32768 unless /proc says otherwise), none under 1024.
func freePorts() (lo, hi int) {
	hi = 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 2048 {
				hi = n
			}
		}
	}
	return max(1024, hi-12000), hi
}

// freeGiven holds the ports FreeAddr has returned.
var freeGiven = portSet{ports: make(map[int]bool)}

type portSet struct {
	mu    sync.Mutex
	ports map[int]bool
}

// claim records port until t ends, and reports whether it was not
// recorded already. Given back when t ends: the ports bind(0) hands out
// are a few thousand, and a long test binary would run out.
func (s *portSet) claim(t testing.TB, port int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ports[port] {
		return false
	}
	s.ports[port] = true
	t.Cleanup(func() {
		s.mu.Lock()
		delete(s.ports, port)
		s.mu.Unlock()
	})
	return true
}

// FreeUDPAndTCPAddr is FreeAddr for a server that binds one port for
// both, as a DNS server does.
func FreeUDPAndTCPAddr(t testing.TB) string {
	t.Helper()
	return freeAddr(t, "find a loopback port free for both UDP and TCP", func(addr string) bool {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return false
		}
		defer pc.Close()
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return false
		}
		ln.Close()
		return true
	})
}

// FreePort is FreeAddr's port, for a configuration that takes a port
// number rather than an address.
func FreePort(t testing.TB) int {
	t.Helper()
	addr, err := net.ResolveTCPAddr("tcp", FreeAddr(t))
	if err != nil {
		t.Fatalf("parse loopback address: %v", err)
	}
	return addr.Port
}
