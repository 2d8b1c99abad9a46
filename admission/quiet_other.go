//go:build !linux

package admission

import "syscall"

// setRcvLowat does nothing here: the edge ships on Linux, and is measured
// there only.
func setRcvLowat(rc syscall.RawConn, bytes int) {}

// peerGone reports false: a paced read hears its peer go when it reads.
func peerGone(rc syscall.RawConn) bool { return false }
