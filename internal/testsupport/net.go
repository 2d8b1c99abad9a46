package testsupport

import (
	"net"
	"testing"
)

// ClosedAddr returns a loopback TCP address nothing listens on right now:
// an upstream that refuses connections, or a port to hand a process that
// must know it before it starts. Another process may take the port later;
// a test that needs it kept should hold a listener instead.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free loopback port: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}

// FreePort is ClosedAddr's port, for a configuration that takes a port
// number rather than an address.
func FreePort(t testing.TB) int {
	t.Helper()
	addr, err := net.ResolveTCPAddr("tcp", ClosedAddr(t))
	if err != nil {
		t.Fatalf("parse loopback address: %v", err)
	}
	return addr.Port
}
