package admission

import (
	"net"
	"syscall"
)

// newPacedSocket returns conn's socket, or nil if it has none (a test's
// pipe).
func newPacedSocket(conn net.Conn) *pacedSocket {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	s := &pacedSocket{rc: rc}
	s.setLowatFunc, s.peekFunc = s.setLowat, s.peek
	return s
}

// setRcvLowat sets how many bytes must wait in the socket's receive queue
// before the kernel tells the edge's poller it is readable (SO_RCVLOWAT,
// Linux 4.18 or later for TCP's wake-ups): the connection's end, and a
// receive window or memory running short, wake it whatever this says, and
// a read takes what is there however little. An error only leaves the
// poller woken as before.
func (s *pacedSocket) setRcvLowat(bytes int) {
	s.lowat = bytes
	s.rc.Control(s.setLowatFunc)
}

func (s *pacedSocket) setLowat(fd uintptr) {
	syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, s.lowat)
}

// peerGone reports whether the peer has closed its side (a FIN) or reset
// the connection, as far as a peek without waiting tells: called after a
// read that took all there was, so that bytes waiting mean it is still
// there. It consumes nothing but a pending reset, after which a read
// returns the end.
func (s *pacedSocket) peerGone() bool {
	s.gone = false
	s.rc.Control(s.peekFunc)
	return s.gone
}

func (s *pacedSocket) peek(fd uintptr) {
	n, _, err := syscall.Recvfrom(int(fd), s.peekBuf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	// Nothing waiting, or bytes waiting, is a client still there
	// (MSG_DONTWAIT never sleeps, so no EINTR).
	s.gone = (err == nil && n == 0) || (err != nil && err != syscall.EAGAIN)
}
