package testsupport

import (
	"net"
	"strconv"
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
// No port is returned twice while the test that asked for it runs: the
// kernel may hand the same free port to two binds in a row, and a process
// given one port for two of its listeners fails to start.
func FreeAddr(t testing.TB) string {
	t.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("find a free loopback port: %v", err)
		}
		addr := l.Addr().(*net.TCPAddr)
		l.Close()
		if freeGiven.claim(t, addr.Port) {
			return addr.String()
		}
	}
	t.Fatal("find a free loopback port: every one found was given before")
	return ""
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
	for range 100 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("find a free loopback UDP port: %v", err)
		}
		addr := pc.LocalAddr().(*net.UDPAddr)
		ln, err := net.Listen("tcp", addr.String())
		pc.Close()
		if err != nil {
			continue
		}
		ln.Close()
		if freeGiven.claim(t, addr.Port) {
			return addr.String()
		}
	}
	t.Fatal("find a loopback port free for both UDP and TCP: none in 100 tries")
	return ""
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
