//go:build !linux

package admission

import "syscall"

// setRcvLowat does nothing here: the edge ships on Linux, and other
// kernels' SO_RCVLOWAT does not keep a poller from waking.
func setRcvLowat(rc syscall.RawConn, bytes int) {}

// peerGone reports false: a paced read hears its peer go when it reads.
func peerGone(rc syscall.RawConn) bool { return false }
