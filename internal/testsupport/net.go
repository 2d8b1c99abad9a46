package testsupport

import (
	"net"
	"strconv"
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
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free loopback port: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
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
