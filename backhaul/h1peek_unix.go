//go:build linux || darwin || freebsd || netbsd || openbsd

package backhaul

import (
	"errors"
	"net"
	"syscall"
)

// connAlive reports whether an idle connection is still usable: the
// upstream has neither closed it nor sent anything unasked. It peeks
// without blocking, one system call, and consumes nothing.
func connAlive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	err = rc.Read(func(fd uintptr) bool {
		var b [1]byte
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		// Nothing to read is the one healthy answer; end of stream, an
		// error or stray bytes (a 408 sent before closing) all end it.
		alive = errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK)
		return true
	})
	return err == nil && alive
}
