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
	rc      syscall.RawConn // nil: cannot peek, assume usable
	ok      bool            // the last peek's verdict
	check   func(fd uintptr) bool
	arrived func(fd uintptr) bool
}

func (pk *peeker) init(c net.Conn) {
	if sc, ok := c.(syscall.Conn); ok {
		pk.rc, _ = sc.SyscallConn()
	}
	pk.check, pk.arrived = pk.peek, pk.anyArrived
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

// await returns once the connection has something to read (bytes, its
// end, or an error), or with the error of a wait the read deadline ended,
// without reading anything.
func (pk *peeker) await() error {
	if pk.rc == nil {
		return nil
	}
	return pk.rc.Read(pk.arrived)
}

// anyArrived is await's check: false sends the poller to wait for the
// connection to become readable.
func (pk *peeker) anyArrived(fd uintptr) bool {
	var b [1]byte
	_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EWOULDBLOCK)
}
