//go:build linux || darwin || freebsd || netbsd || openbsd

package h1

import (
	"errors"
	"net"
	"syscall"
)

// peeker tells whether an idle connection is still usable: the upstream
// has neither closed it nor sent anything unasked. It peeks without
// blocking, one system call, and consumes nothing. Its raw connection and
// callback are made once per connection, so a peek allocates nothing.
type peeker struct {
	rc    syscall.RawConn // nil: cannot peek, assume usable
	ok    bool            // the last peek's verdict
	check func(fd uintptr) bool
}

func (pk *peeker) init(c net.Conn) {
	if sc, ok := c.(syscall.Conn); ok {
		pk.rc, _ = sc.SyscallConn()
	}
	pk.check = pk.peek
}

func (pk *peeker) peek(fd uintptr) bool {
	var b [1]byte
	_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	// Nothing to read is the one healthy answer; end of stream, an error
	// or stray bytes (a 408 sent before closing, a body after a HEAD
	// response) all end the connection.
	pk.ok = errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK)
	return true
}

// alive reports whether the connection may carry another request.
func (pk *peeker) alive() bool {
	if pk.rc == nil {
		return true
	}
	pk.ok = false
	return pk.rc.Read(pk.check) == nil && pk.ok
}
