package admission

import (
	"net"
	"syscall"
	"testing"
)

// rcvLowat reads the SO_RCVLOWAT of the socket under conn, an accepted
// connection's edge side.
func rcvLowat(t *testing.T, conn net.Conn) int {
	t.Helper()
	rc, err := conn.(interface{ NetConn() net.Conn }).NetConn().(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var v int
	var gerr error
	if err := rc.Control(func(fd uintptr) {
		v, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT)
	}); err != nil || gerr != nil {
		t.Fatalf("SO_RCVLOWAT: %v, %v", err, gerr)
	}
	return v
}
