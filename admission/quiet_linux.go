package admission

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// setRcvLowat sets how many bytes must wait in a socket's receive queue
// before the kernel tells the edge's poller it is readable (SO_RCVLOWAT,
// Linux 4.18 or later for TCP's wake-ups): the connection's end, and a
// receive window filling up, wake it whatever this says, and a read takes
// what is there however little. An error only leaves the poller woken as
// before.
func setRcvLowat(rc syscall.RawConn, bytes int) {
	rc.Control(func(fd uintptr) {
		syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, bytes)
	})
}

// peerGone reports whether the peer of a TCP socket has closed its side
// (a FIN) or reset the connection: a read would return what came before,
// then the end.
func peerGone(rc syscall.RawConn) bool {
	var state uint8
	rc.Control(func(fd uintptr) {
		if info, err := unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO); err == nil {
			state = info.State
		}
	})
	return state == tcpCloseWait || state == tcpClose
}

// TCP states, from the kernel's include/net/tcp_states.h.
const (
	tcpClose     = 7 // reset (or never connected)
	tcpCloseWait = 8 // the peer sent its FIN
)
